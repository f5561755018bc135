/* The ASGI 3 adapter (HTTP, spec 2.4) of the native engine, beside the
 * WSGI one: a parsed request made a scope in C (asgi_scope.c), the app
 * called with the receive and send of one AsgiCall (asgi_call.c: the
 * messages checked and framed by the codec), the call's end and counts
 * (asgi_end.c), and the call run as a task of the owner loop thread's
 * asyncio loop (worker/aio.py), its errors (asgi_app.c). It sits on the HTTP/1 codec, which
 * calls it only through the struct app_ops the Server's assembly fills
 * (server.c: asgi_app_ops); it calls the codec (h1.h) and the connection
 * layer (conn.h) directly.
 *
 * A request's call outlives the codec's serve: the task runs in the
 * loop's ready pass, after the turn. Meanwhile the connection holds it
 * (c->call, conn.h): the requests behind it wait, its input is still
 * read (the body as the app receives it, the client's end), and its
 * send() writes straight into the connection's output.
 */
#ifndef SOCKHERD_ASGI_H
#define SOCKHERD_ASGI_H

#include <unistd.h>

#include "h1.h"

typedef struct AsgiCall {
	PyObject_HEAD
	Server *srv;
	struct conn *conn;                    /* NULL once detached: ended, or the client gone */
	struct h1_frame f;                 /* the codec's framing of the response */
	PyObject *scope;
	PyObject *aio;                     /* the owner loop thread's asyncio loop */
	PyObject *rx, *tx;                 /* the futures a receive / a send waits on, or NULL */
	/* started: http.response.start taken; head_sent: the head is in the
	 * output (held until the first body message: hello is one write);
	 * ended: the response is whole (or was answered for the app);
	 * gone: the connection closed first; body_done: the last
	 * http.request was received; counted: counted and logged (once);
	 * sending: a send() runs (the app's code it calls may call another) */
	unsigned started : 1, head_sent : 1, ended : 1, gone : 1, body_done : 1, counted : 1,
	         sending : 1;
	double since;
	/* the extensions (asgi_ext.c). trailers_ok: advertised (the client
	 * sent TE: trailers); trailers: the start said trailers: True;
	 * body_end: the body is whole and the trailers are awaited. A
	 * pathsend's file while it goes out: its fd (the call's, -1 none),
	 * where the rest begins, how much is left (and the chunk's size). */
	unsigned trailers_ok : 1, trailers : 1, body_end : 1;
	int file_fd;
	off_t file_off;
	unsigned long long file_left, file_span;
} AsgiCall;

extern PyTypeObject AsgiCallType, AsgiReadyType;
/* sockherd.worker._http.ClientDisconnected (an OSError): a send() once
 * the client is gone (ASGI 2.4) */
extern PyObject *ClientDisconnected;

/* ---- asgi_call.c: the call and its receive / send ---- */
AsgiCall *asgi_call_new(struct conn *c, PyObject *scope);
/* A new call's app started as a task of aio (the owner loop's) with
 * done_def bound to call as its done() (NULL: call itself is callable as
 * done(), a WebSocket call); c holds call from then on.
 * RESPOND_PARKED, or -1 (c does not hold call; nothing ran). Used by the
 * HTTP calls and the WebSocket ones (asgi_ws.c). */
int asgi_start_task(struct conn *c, PyObject *call, PyObject *scope, PyObject *aio,
                    PyMethodDef *done_def);
/* An awaitable done at once with value (a new reference). */
PyObject *asgi_ready(PyObject *value);
/* {"type": "http.disconnect"}, a new dict */
PyObject *asgi_disconnect(void);
/* The next http.request message if one can be given now (body bytes
 * here, or the body's end), NULL with no error if the app must wait,
 * NULL with an error. */
PyObject *asgi_take_body(AsgiCall *call);
/* A send()'s message checked as such (a dict with a str 'type', both
 * send()s, HTTP and WebSocket): its type (borrowed), or NULL with the
 * app's error naming the message. */
PyObject *asgi_send_type(PyObject *msg);
int asgi_make_keys(void);
int asgi_call_make(void);                       /* its keys (module init) */
/* the adapter's constants (module init) */
int asgi_make_app(void);

/* ---- asgi_end.c: a call's end ---- */
/* The response is whole (or the app's error answered): counted and
 * logged, the call detached, the codec goes on with the connection. */
void asgi_end(AsgiCall *call, int keep);
/* asgi_end's first part: the call counted, logged and detached from its
 * connection; c (a new reference; NULL if detached already), which the
 * caller goes on with (asgi_end: h1_call_done; a file's end inside the
 * codec's resume: the resume itself, asgi_file_resume). */
struct conn *asgi_detach(AsgiCall *call);
/* Counted and logged, once (the response, or what there is of it). */
void asgi_account(AsgiCall *call);
/* Sets *fut's result (or exception exc), if it is still pending; *fut
 * cleared. Never fails (an error is unraisable). */
void asgi_resolve(PyObject **fut, PyObject *value, PyObject *exc);
/* A send's future *fut, if any, fails with ClientDisconnected (the
 * connection closed under the call: HTTP's and WebSocket's). Never fails
 * (an error is unraisable, told against who). */
void asgi_resolve_gone(PyObject **fut, PyObject *who);

/* Whether the future *fut still waits for its answer; one that is done
 * already (the app stopped awaiting it: wait_for's timeout, its task
 * cancelled) is dropped, *fut cleared, so that nothing (body bytes, the
 * client's end) is taken for it and the next receive / send may wait
 * (review, finding 2). Never fails. */
int asgi_waiting(PyObject **fut);

/* ---- asgi_ext.c: the extensions (pathsend, trailers), a streamed body's timer ---- */
int asgi_ext_make(void);                        /* its constants (module init) */
/* scope["extensions"] for c's request: pathsend always, trailers when
 * the client accepts them (HTTP/1.1, TE: trailers). 0 or -1. */
int asgi_ext_scope(struct conn *c, PyObject *scope);
/* A new call: what its scope advertised. */
void asgi_ext_call(AsgiCall *call);
/* http.response.start's `trailers` (length: the app's Content-Length or
 * -1), checked before the start is taken. 0 or -1 (the app's error). */
int asgi_ext_start(AsgiCall *call, PyObject *msg, long long length);
/* The body's last message with trailers to follow: the last chunk. */
int asgi_ext_body_end(AsgiCall *call);
/* send() of http.response.pathsend / http.response.trailers: 0 done, 1
 * the send waits (its future resolved by asgi_resume / the end), -1. */
int asgi_pathsend(AsgiCall *call, PyObject *msg);
int asgi_trailers(AsgiCall *call, PyObject *msg);
/* A file's turn (the output drained): RESPOND_PARKED while the call
 * runs on, else the response ended and the call is detached: whether
 * the connection may serve on (RESPOND_KEEP, RESPOND_CLOSE). -1. */
int asgi_file_resume(AsgiCall *call);
/* The body timer fired: for a receive that waits, a 408 (or the close
 * once the response started) and the receive's http.disconnect; for one
 * the app abandoned, nothing (the app's time). */
void asgi_body_late(AsgiCall *call);
/* The client got the streamed body wrong (the parser's HP_ERROR) while
 * the call reads it: the 413 / 400 (or the close once the head went out),
 * logged as the client's; a waiting receive reads http.disconnect. */
void asgi_body_error(AsgiCall *call);

/* The call's file closed (on every path: sent, failed, the client gone,
 * the call freed): here, for asgi_end.c and the call's own dealloc. */
static inline void asgi_file_close(AsgiCall *call)
{
	if (call->file_fd >= 0) {
		close(call->file_fd);
		call->file_fd = -1;
	}
	call->file_left = 0;
	if (call->conn)
		call->conn->out_more = 0;
}

/* ---- asgi_app.c: serving ---- */
/* struct app_ops's entries (through asgi_ws.c's for a WebSocket's) */
PyObject *asgi_request(struct conn *c);
int asgi_serve(struct conn *c, PyObject *scope, int whole);
int asgi_resume(struct conn *c);
int asgi_input(struct conn *c);
void asgi_drop(struct conn *c, PyObject *call);

/* ---- asgi_scope.c ---- */
/* The scope of the head c's parser holds: a copy of the Server's base
 * (type, asgi, scheme, root_path, state) with the request's keys. */
PyObject *asgi_build_scope(struct conn *c);
/* The base as the Server keeps it for ASGI (server.c, set_interface): a
 * new dict with base's items and room for a whole scope (the copies keep
 * that size); NULL with an exception. */
PyObject *asgi_scope_base(PyObject *base);

/* asgi_forwarded.c: a trusted request's forwarding fields put where the
 * app looks (c trusted); 0 or -1 */
int fwd_scope(struct conn *c, PyObject *scope);
int asgi_fwd_make_keys(void);

/* asgi_tls.c: the "tls" extension's dict for c (a new one per call), or
 * NULL with a Python error. */
PyObject *asgi_tls_scope(struct conn *c);

#endif /* SOCKHERD_ASGI_H */
