/* The WSGI adapter (PEP 3333) of the native engine: a parsed request made
 * an environ (wsgi_environ.c), the app run and its answer turned back into
 * framed bytes (wsgi_app.c), start_response and write() (wsgi_respond.c),
 * and the body the app returned sent, from the loop past HIGH_WATER
 * (wsgi_body.c). It sits on the HTTP/1 codec, which calls it only through
 * the struct app_ops the Server's assembly fills (server.c: wsgi_app_ops);
 * it calls the codec (h1.h) and the connection layer (conn.h) directly.
 * An ASGI adapter would sit beside it, with its own struct app_ops.
 */
#ifndef SOCKHERD_WSGI_H
#define SOCKHERD_WSGI_H

#include "h1.h"

/* ---- the response (wsgi_respond.c) ---- */
struct Respond {
	PyObject_HEAD
	struct conn *conn;
	struct h1_frame f;                 /* the codec's framing of this response */
	unsigned headers_sent : 1, started : 1, finished : 1;
	PyObject *status, *first;          /* first: the held first chunk */
	PyObject *out_headers;             /* the app's headers, for the access log's {name}o atoms */
	/* A body that goes out from the loop, past HIGH_WATER (issue 21):
	 * parked: waiting for the output to drain, no app code running;
	 * all_here: `it` iterates a list the app returned (its blocks are held
	 * for one write, not flushed one by one); tail: the rest of a list of
	 * bytes, sent straight from its objects from item tail_i, offset
	 * tail_off (no copy); it: the app's iterator, resumed below LOW_WATER;
	 * env, result, since: what the end of the response needs (close(),
	 * the access log). */
	unsigned parked : 1, all_here : 1;
	PyObject *env, *result, *it, *tail;
	Py_ssize_t tail_i, items;
	size_t tail_off;
	double since;
	/* a FileWrapper's span, sent by sendfile from the loop: its fd (the
	 * app's, -1: none), where the rest begins and how much is left */
	int file_fd;
	off_t file_off;
	unsigned long long file_left;
};

extern PyTypeObject RespondType;

Respond *respond_new(struct conn *c, int http11, int keep, int head_only);
/* start_response(status, headers, exc_info=None) -> write */
PyObject *Respond_call(Respond *r, PyObject *args, PyObject *kw);
/* write(data): the app's write callable, and each chunk of its iterable;
 * `hold`: the body may be whole with this chunk (its length known at the
 * end: a Content-Length), so a first chunk waits for finish(); `now`,
 * `wait`: as h1_send_body's. */
int write_chunk(Respond *r, PyObject *data, int now, int hold, int wait);
/* The body's end: the head if still held, the codec's end of the body. */
int finish(Respond *r, int wait);

/* ---- running the app (wsgi_app.c) ---- */
/* Runs the app for env (wsgi.input already set) and frames its response:
 * 1 if the connection may serve another request (as far as the response
 * goes), 0 if it must close, -1 with a Python error that is not the app's
 * (the app's, any BaseException, are answered and logged in there).
 * can_park: the caller is the connection's loop turn, which can send the
 * rest of a large body from the loop (RESPOND_PARKED); else (the slow
 * path) a body past HIGH_WATER waits for the client here, as write() does. */
int respond(struct conn *c, PyObject *env, int can_park);
/* The parked response's turn, on the connection's loop thread, the output
 * below LOW_WATER: its tail sent, its iterator resumed. RESPOND_PARKED
 * again, or the response ended (parked cleared): RESPOND_KEEP or
 * RESPOND_CLOSE as respond() says; -1 with an error that is not the app's. */
int respond_resume(struct conn *c);
/* The connection closed under a parked response: its iterable's close(),
 * the access log, the counts (once). Takes the reference. */
void respond_abandon(Respond *r);
/* struct app_ops's request and serve (see h1.h) */
PyObject *wsgi_request(struct conn *c);
int wsgi_serve(struct conn *c, PyObject *env, int whole);
/* the adapter's method on the connection (respond) */
extern PyMethodDef wsgi_conn_methods[];

/* ---- the body the app returned (wsgi_body.c) ---- */
/* The body of the app's result: a FileWrapper's file (1 if sent), 0 if
 * not one; a list or tuple; any other iterable. 0, RESPOND_PARKED, -1. */
int body_file(Respond *r, PyObject *result, int can_park);
int body_sequence(Respond *r, PyObject *seq, int can_park);
int body_iterable(Respond *r, PyObject *result, int can_park);
/* A parked body's next part: its tail, its file span, its iterator. */
int push_tail(Respond *r);
int push_file(Respond *r);
int iterate(Respond *r, int can_park);
/* Bytes a parked response still owes (at least 1: an iterator's are unknown). */
size_t respond_owed(const Respond *r);
size_t wsgi_owed(struct conn *c);                  /* struct conn_ops's owed */

/* ---- the environ (wsgi_environ.c) ---- */
/* interned environ keys, made once (make_keys) */
extern PyObject *K_SERVER_NAME, *K_SERVER_PORT, *K_REMOTE_ADDR, *K_REMOTE_PORT, *K_WSGI_INPUT;
int make_keys(void);
/* A parsed head's environ: a copy of base with the request's keys. */
PyObject *build_environ(Parser *p, PyObject *base);
/* the adapter's method on RequestParser (next_request) */
extern PyMethodDef wsgi_parser_methods[];

/* wsgi_forwarded.c: a trusted request's forwarding fields put where the
 * app looks (c trusted); 0 or -1 */
int fwd_environ(struct conn *c, PyObject *env);
int wsgi_fwd_make_keys(void);

/* sockherd.worker._http.BadBody: the request body could not be read
 * (wsgi_app.c holds it; the module's init makes it) */
extern PyObject *BadBody;

/* wsgi_tls.c: the environ keys of c's TLS session (SSL_PROTOCOL,
 * SSL_CIPHER, SSL_CLIENT_*: nginx's and Apache's names), a dict built once
 * per connection (c->tls_env); borrowed, NULL with a Python error. */
PyObject *wsgi_tls_environ(struct conn *c);

#endif /* SOCKHERD_WSGI_H */
