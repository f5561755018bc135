/* The HTTP/1 codec of the native engine: requests parsed (httpparse.c:
 * llhttp in strict mode plus our checks; its Python face RequestParser,
 * h1_parser.c), response heads checked (h1_head.c: WSGI's shapes;
 * h1_head_asgi.c: ASGI's, and trailers), responses framed
 * (h1_response.c: the head, Content-Length or chunked, HEAD/204/304
 * bodies dropped, keep-alive), and the request
 * loop of one connection (h1_conn.c: pipelining, a body read before the
 * app runs, 100 Continue, refusals, the header and keep-alive timers).
 *
 * It sits on the connection layer (conn.h), which calls it through the
 * struct conn_ops the Server's assembly fills with the h1_* entries below;
 * it calls the app adapter above it only through struct app_ops (the
 * adapter's request object, serving it, a parked response's turn and
 * end). A WebSocket codec would sit beside it, with its own conn_ops.
 */
#ifndef SOCKHERD_H1_H
#define SOCKHERD_H1_H

#include <string.h>

#include "engine.h"
#include "httpparse.h"

/* ---- the parser (h1_parser.c) ---- */
struct Parser {
	PyObject_HEAD
	/* the request parser's state, its own allocation: an upgraded
	 * connection (a WebSocket) parses no HTTP again and lets it go
	 * (parser_release), keeping only the input buffer below */
	struct hp_parser *hp;
	/* bytes received and not parsed yet: pending[start .. len) */
	char *pending;
	size_t start, len, cap;
	/* body bytes parsed and not read by the app yet: body[bstart .. blen) */
	char *body;
	size_t bstart, blen, bcap;
	PyObject *script_name;       /* str, "" or a prefix like "/app" */
	int expect_continue;
	/* the body an adapter's call streams (h1_body_wait): its deadline
	 * (0: no wait yet; body_timeout from the first, pushed back by what
	 * arrives at min_body_rate), whether the call waits for it now, and
	 * whether the deadline passed while it did (the adapter answers).
	 * The flags beside expect_continue: no padding (a WebSocket keeps its
	 * parser: 8 bytes less each, issue 23) */
	unsigned body_wait : 1, body_late : 1;
	double body_due;
};

extern PyTypeObject ParserType;
/* RequestParser's own methods: the adapter's (next_request) follow them
 * in the type (httpmodule.c) */
extern PyMethodDef parser_methods[];

/* A new parser with these limits (what RequestParser(...) makes). */
Parser *parser_new(const struct hp_limits *lim, PyObject *script_name);
/* Parses buffered bytes up to the next head: 1 a head is parsed (its
 * fields in p->hp, for the adapter's request object), 0 more bytes are
 * needed, -1 with HttpError set (a request to refuse) or another error. */
int parser_head(Parser *p);
/* Moves buffered body bytes through the body parser. */
int parser_pump_body(Parser *p);
/* parser.finish(): 1 if another request may follow, 0 if not. */
int parser_finish(Parser *p);
int parser_head_started(const Parser *p);
/* The connection was upgraded (its head served, no request follows): the
 * HTTP parser's state is freed, p->hp points at a shared, read-only
 * state of a finished upgrade (HP_DONE) from then on: what reads it (the
 * codec's timers, unread, pump) sees no request, what would parse again
 * sees none may follow. The input buffer stays (the new protocol's). */
void parser_release(Parser *p);
/* sockherd.worker._http.HttpError(status, reason): a request to refuse
 * (h1_parser.c holds it; the module's init makes it) */
extern PyObject *HttpError;
PyObject *parser_refusal(Parser *p);         /* sets HttpError, returns NULL */

/* ---- the response (h1_head.c, h1_head_asgi.c: the head checked;
 * h1_response.c: framed) ----
 * One response's framing, the codec's, inside the adapter's response
 * object: what the request allows and what the head said. */
struct h1_frame {
	unsigned http11 : 1, keep : 1, head_only : 1, bodiless : 1, chunked : 1, app_date : 1,
	         app_server : 1;
	long long length;                  /* the announced length, -1 unknown */
	int code;                          /* the status code given, 0 before start_response */
	unsigned long long sent;           /* body bytes sent */
	PyObject *prefix;                  /* the status line and the app's fields (head_from) */
};

/* Checks and serialises start_response's status and headers (the
 * response_head() of the module): *prefix gets the status line and the
 * app's fields, *length the app's Content-Length or -1, *flags whether
 * the app asked for Connection: close and gave its own Date or Server
 * (HEAD_*), *code the status code. 0 or -1. Takes WSGI's shapes (a str
 * status, (str, str) pairs); an ASGI entry would take its bytes beside it. */
enum { HEAD_CLOSE = 1, HEAD_APP_DATE = 2, HEAD_APP_SERVER = 4 };
/* RFC 9110 5.6.2 tchar: a field name's bytes, in both shapes
 * (h1_head.c, h1_head_asgi.c) */
static inline int is_tchar(unsigned int c)
{
	static const char extra[] = "!#$%&'*+-.^_`|~";

	return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') ||
	       (c && c < 128 && strchr(extra, (int)c));
}
int head_from(PyObject *status, PyObject *headers, PyObject **prefix, long long *length,
              int *flags, int *code);
/* head_from for ASGI's shapes: an int status (200-599: a 1xx is refused,
 * never a final response) and an iterable of
 * [name, value] pairs of bytes; the same checks and results. */
int head_from_asgi(PyObject *status, PyObject *headers, PyObject **prefix, long long *length,
                   int *flags, int *code);
/* head_from, through this thread's cache of the last head (by identity). */
int head_cached(PyObject *status, PyObject *headers, PyObject **prefix, long long *length,
                int *flags, int *code);
/* "Date: <IMF-fixdate>\r\n" of now, formatted once a second per thread. */
void http_date(const char **line, size_t *len);
/* The head into c's output: f's prefix, Date, Server, and the framing we
 * choose; known is the body's length if known, else -1. */
int h1_head(struct conn *c, struct h1_frame *f, long long known);
/* Body bytes after the head, framed; `now`: try the socket at once;
 * `wait`: past HIGH_WATER, wait here for the client to read, else the
 * caller parks the body. -1 with ClientGone if c closed. */
int h1_send_body(struct conn *c, struct h1_frame *f, const char *data, size_t n, int now, int wait);
/* The body's end: the last chunk, and a short body ends keep-alive. */
int h1_end_body(struct conn *c, struct h1_frame *f);
/* A body part of n bytes the adapter sends itself after the output (a
 * file, by sendfile): how many of them may go (none for HEAD/204/304, no
 * more than an announced length leaves: fewer ends keep-alive, as
 * h1_send_body's cut), with a chunked body's chunk-size line for them in
 * the output; -1 with an error. The adapter adds what goes out to f->sent
 * and ends the span with h1_span_end ("\r\n" of a chunk). */
long long h1_span_begin(struct conn *c, struct h1_frame *f, unsigned long long n);
int h1_span_end(struct conn *c, struct h1_frame *f, unsigned long long n);
/* Trailers (RFC 9112 7.1.2): the body's end when a trailer section
 * follows, "0\r\n" of a chunked body (nothing for a body that is not
 * chunked: HEAD, 204, 304); then the fields (h1_trailer_block's), the
 * section's end with the last of them. */
int h1_end_chunks(struct conn *c, struct h1_frame *f);
int h1_trailers(struct conn *c, struct h1_frame *f, PyObject *block, int last);
/* An ASGI http.response.trailers' headers checked as a head's fields are,
 * and refused where a trailer must not carry them (framing, routing,
 * connection and content fields: RFC 9110 6.5.1): *block gets the
 * "name: value\r\n" lines. 0 or -1 with an error naming the field. */
int h1_trailer_block(PyObject *headers, PyObject **block);
/* websocket.accept's headers checked as a head's fields are, read once
 * into *block ("name: value\r\n" lines: what goes into the 101), the
 * fields named skip (lower case) left out, their values appended to
 * skipped (a list). 0 or -1 with an error naming the field. */
int h1_accept_block(PyObject *headers, const char *skip, PyObject *skipped, PyObject **block);
/* Whether s[0 .. n) holds a byte no field value may carry (a CTL but
 * HTAB, or DEL: RFC 9110 5.5), the check of every ASGI field value. */
int h1_has_ctl(const char *s, size_t n);
/* the module's functions (response_head) */
extern PyMethodDef h1_module_methods[];

/* v in decimal at w, no terminator; its length (at most 20). snprintf's
 * "%lld" cost a JSON response about 1k instructions a number (callgrind,
 * bench/http_callgrind.py --app fastapi): its format parsing and locale
 * are of no use for digits. */
static inline size_t h1_put_dec(char *w, unsigned long long v)
{
	char tmp[20];
	size_t n = 0;

	do
		tmp[n++] = (char)('0' + v % 10);
	while ((v /= 10));
	for (size_t i = 0; i < n; i++)
		w[i] = tmp[n - 1 - i];
	return n;
}

/* ---- what the codec calls above it: the app adapter (one per Server) ---- */
/* serve's results: the connection closes, serves on, or the response is
 * parked on it (c->parked): the rest of its body goes out from the loop,
 * through resume, before the next request is served. */
enum { RESPOND_CLOSE = 0, RESPOND_KEEP = 1, RESPOND_PARKED = 2 };
struct app_ops {
	/* a head was parsed (c->parser): the interface's request object
	 * (WSGI: its environ), or NULL with an error that is not the app's */
	PyObject *(*request)(struct conn *c);
	/* runs the app for req: its body is whole in the parser (whole), or
	 * still coming (the adapter streams it). RESPOND_*, -1 with an error
	 * that is not the app's */
	int (*serve)(struct conn *c, PyObject *req, int whole);
	/* the parked response's turn, output below LOW_WATER: as serve */
	int (*resume)(struct conn *c);
	/* c closed under its parked response (taken off c, the reference
	 * passed): its end. Bytes a parked response still owes (at least 1).
	 * NULL both for an adapter that never parks (ASGI: its bodies go out
	 * from send) */
	void (*abandon)(Respond *r);
	size_t (*owed)(struct conn *c);
	/* c closed under the adapter's call (taken off c, the reference
	 * passed): the app learns that its client is gone. NULL for an
	 * adapter that makes no calls (WSGI). */
	void (*drop)(struct conn *c, PyObject *call);
	/* whether the call awaits input of its own that a close must read on
	 * for (a WebSocket's close handshake). NULL: none. */
	int (*lingers)(struct conn *c);
	/* input came (bytes, or the end of input: c->peer_eof) while the
	 * adapter's call runs (c->call), or the body it waits for is late
	 * (c->parser->body_late): a receive waiting for it may be answered.
	 * NULL for an adapter without calls. 0 or -1. */
	int (*input)(struct conn *c);
	/* a call's own timer is due (TIMER_PING, TIMER_PONG: c->call_ping,
	 * an open WebSocket's). NULL for an adapter without one. 0 or -1. */
	int (*timer)(struct conn *c, int kind);
};

/* The adapter's call on c ended (its response whole, c->call taken off):
 * the request is finished (keep: it may serve another), the requests
 * that waited behind it served, what is owed sent. 0 or -1 (not the
 * app's error). The owner loop thread, outside any handler of c. */
int h1_call_done(struct conn *c, int keep);
/* The answers loop thread pos owes (queued under load by h1_call_done
 * and serve_read: h1_conn.c, owe): written, each connection's timer and
 * directions set (Server_turn, before its poll and at its end). 1 if a
 * connection closed (its last answer out, or the client gone): the turn
 * must not sleep before its owner hears it. h1_owed_free: the lists
 * dropped (Server_clear: the engine's end, its connections closed with
 * it). */
int h1_owed_run(Server *s, int pos);
void h1_owed_free(Server *s);
/* The part of h1_call_done that forgets the call (its input bound, its
 * body's deadline), for an adapter that ends a call inside a resume
 * (h1_resume goes on with the connection itself). */
void h1_call_detached(struct conn *c);
/* The adapter took input of its call: reading goes on if the bound of
 * what a call may leave buffered (CALL_INPUT_MAX) allows. */
void h1_input_room(struct conn *c);
#define CALL_INPUT_MAX (256u << 10)
/* The adapter's call waits for body bytes (waiting), or no longer: the
 * body timer runs while it does (p->body_due, the held body's rule); past
 * it, the codec sets p->body_late and calls the adapter's input. */
void h1_body_wait(struct conn *c, int waiting);
/* A streamed body came too late: counted and logged as the engine's
 * body_timeout refusal; answer: a 408 and the connection closes after it
 * (nothing of the response went out), else it closes now. */
void h1_body_late(struct conn *c, int answer);
/* A streamed body the client got wrong (the parser's HP_ERROR: its
 * framing, past limit_request_body): the parser's status and reason, as
 * h1_body_late (answer: the refusal, else counted, logged, closed now). */
void h1_body_refuse(struct conn *c, int answer);

/* ---- one connection's requests (h1_conn.c; h1_timeout, h1_rearm and the
 * refusals: h1_timers.c): struct conn_ops's entries ---- */
int h1_open(struct conn *c);
int h1_readable(struct conn *c);
int h1_read_first(struct conn *c);
int h1_serve_first(struct conn *c);
int h1_resume(struct conn *c);
int h1_timeout(struct conn *c, int kind);
void h1_rearm(struct conn *c);
int h1_unread(struct conn *c);
size_t h1_owed(struct conn *c);
void h1_closed(struct conn *c, Respond *parked, PyObject *call);
/* Answers an error (a refusal the engine counts) and closes. */
void conn_refuse(struct conn *c, int status, const char *reason);
/* the connection's methods the codec adds (refuse) */
extern PyMethodDef h1_conn_methods[];

/* ---- trusted proxy headers: what a trusted request's fields say (the
 * rules and the trust: conn/forwarded.h) ---- */
/* What a trusted request's fields say, pointers into its head. */
struct fwd_found {
	int family;                        /* the client's address: AF_INET(6), 0 none */
	unsigned char addr[16];
	int port;                          /* its port, 0 unknown */
	int https;                         /* -1 not said, 0 http, 1 https */
	const char *host;                  /* host[:port] (FWD_HOST), NULL none */
	size_t host_len;
	int server_port;                   /* X-Forwarded-Port (FWD_PORT), -1 none */
	const char *prefix;                /* X-Forwarded-Prefix (FWD_PREFIX), no trailing '/' */
	size_t prefix_len;
};

/* ---- fwd_fields.c (codec) ---- */
/* The forwarding fields of c's parsed head, c trusted: 1 if any says
 * something (f filled), 0 if none, -1 with a Python error (only the log
 * callable's). */
int fwd_read(struct conn *c, struct fwd_found *f);
/* f's client address as a str (inet_ntop's canonical form: never the
 * bytes as sent) */
PyObject *fwd_addr_str(const struct fwd_found *f);
/* d[key] = f's prefix + d[key] (missing: ""); 0 or -1 */
int fwd_prepend(PyObject *d, PyObject *key, const struct fwd_found *f);

#endif /* SOCKHERD_H1_H */
