/* What the parts of sockherd.worker._http share: the parser object
 * (httpmodule.c), the response (respond.c), the connection (hconn.c) and
 * the per-worker server that runs the loop turns (engine.c).
 *
 * Threading: every function here runs with the GIL held, and the GIL is
 * what serialises the loop threads' use of these objects (a connection is
 * only touched by its owner thread, or by a relieving sibling while the
 * owner is stuck elsewhere, both under the GIL). The GIL is released only
 * around a wait that may block: the poll of a turn (engine.c) and the poll
 * of a blocked writer or reader (hconn.c), and nothing shared is changed
 * across those.
 */
#ifndef SOCKHERD_HTTP_H
#define SOCKHERD_HTTP_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "httpparse.h"
#include "fd.h"        /* fdcore's types only: its code is reached via struct fdc_api */

extern PyObject *HttpError, *ClientGone, *BadBody;
/* interned environ keys (httpmodule.c) */
extern PyObject *K_SERVER_NAME, *K_SERVER_PORT, *K_REMOTE_ADDR, *K_REMOTE_PORT, *K_WSGI_INPUT;

/* ---- the parser (httpmodule.c) ---- */
typedef struct {
	PyObject_HEAD
	struct hp_parser hp;
	/* bytes received and not parsed yet: pending[start .. len) */
	char *pending;
	size_t start, len, cap;
	/* body bytes parsed and not read by the app yet: body[bstart .. blen) */
	char *body;
	size_t bstart, blen, bcap;
	PyObject *script_name;       /* str, "" or a prefix like "/app" */
	int expect_continue;
} Parser;

extern PyTypeObject ParserType;

int buf_reserve(char **buf, size_t *start, size_t *len, size_t *cap, size_t more);
/* A new parser with these limits (what RequestParser(...) makes). */
Parser *parser_new(const struct hp_limits *lim, PyObject *script_name);
/* Parses buffered bytes up to the next head: its environ (a copy of base),
 * NULL with *none set when more bytes are needed, NULL with HttpError set. */
PyObject *parser_next(Parser *p, PyObject *base, int *none);
/* Moves buffered body bytes through the body parser. */
int parser_pump_body(Parser *p);
/* parser.finish(): 1 if another request may follow, 0 if not. */
int parser_finish(Parser *p);
int parser_head_started(const Parser *p);
PyObject *parser_refusal(Parser *p);         /* sets HttpError, returns NULL */

/* Checks and serialises start_response's status and headers (the
 * response_head() of the module): *prefix gets the status line and the
 * app's fields, *length the app's Content-Length or -1, *flags whether
 * the app asked for Connection: close and gave its own Date or Server
 * (HEAD_*), *code the status code. 0 or -1. */
enum { HEAD_CLOSE = 1, HEAD_APP_DATE = 2, HEAD_APP_SERVER = 4 };
int head_from(PyObject *status, PyObject *headers, PyObject **prefix, long long *length,
              int *flags, int *code);
/* "Date: <IMF-fixdate>\r\n" of now, formatted once a second per thread (respond.c). */
void http_date(const char **line, size_t *len);

/* ---- fdcore, reached through function pointers ----
 * The one fdcore implementation is the cffi module's (sockherd.fdcore);
 * the table hands its functions' addresses over (Table.c_api()), so this
 * extension calls them directly, without cffi's GIL release per call. */
struct fdc_api {
	int (*poll)(struct fdc_thread *, int, struct fdc_event *, int);
	int (*enter)(struct fdc_thread *, int, uint32_t *);
	int (*leave)(struct fdc_thread *, int, uint32_t);
	int (*leave_batch)(struct fdc_thread *, const struct fdc_event *, int);
	int (*delete)(struct fdc_thread *, int);
	int (*want_recv)(struct fdc_thread *, int);
	int (*stop_recv)(struct fdc_thread *, int);
	int (*want_send)(struct fdc_thread *, int);
	int (*stop_send)(struct fdc_thread *, int);
	int (*cant_recv)(struct fdc_thread *, int);
	int (*insert)(struct fdc_table *, int, uint64_t, uint32_t, int, uint64_t, uint32_t);
	int (*accept)(struct fdc_thread *, int, int *, int);
	void (*counters)(const struct fdc_thread *, struct fdc_counters *);
	int (*insert_shared)(struct fdc_thread *, int, uint64_t, uint32_t, uint64_t);
	int (*wake)(struct fdc_table *, int);
};

typedef struct HttpConn HttpConn;
typedef struct Respond Respond;

/* header: a head must arrive whole (header_timeout); keepalive: idle
 * between requests; linger: a closed connection's last bytes (below);
 * send: output waits and the client takes none (body_timeout); body: a
 * request body read in the loop before the app runs (body_timeout, pushed
 * back by what arrives at min_body_rate) */
enum { TIMER_HEADER = 0, TIMER_KEEPALIVE = 1, TIMER_LINGER = 2, TIMER_SEND = 3, TIMER_BODY = 4,
       TIMER_KINDS = 5 };

/* How long a connection we close may still send (its unread upload, a
 * pipelined request) while we discard it: closing with unread input sends
 * a reset, and a reset can destroy the response before the client reads
 * it (nginx's lingering close; its lingering_timeout is 5 s too). */
#define LINGER_SECONDS 5.0

struct timer_list {
	HttpConn *head, *tail;
};

struct srv_thread {
	struct fdc_thread *th;
	PyObject *obj;                     /* the fdcore.Thread object */
	int tgid;
	uint64_t bit;
	uint64_t group_mask;               /* the bits of its group's loop threads */
	struct timer_list timers[TIMER_KINDS];
	struct fdc_event ev[FDC_EVBATCH];
	int first[FDC_EVBATCH], nfirst;    /* accepted, first read to serve (serve_accepted) */
	int tid;                           /* fdcore's thread id (fdc_wake) */
	int asleep;                        /* in its blocking poll (the GIL's) */
};

/* dispatch.c: the rest of a batch that ran long, for an idle sibling */
struct spilled {
	HttpConn *c;                       /* a strong reference */
	uint32_t events;
};

/* What the engine refuses a request for (its status): the labels of
 * Server.refused, in this order. */
#define REFUSAL_NAMES {"bad_request", "header_timeout", "body_too_large", "uri_too_long", \
                       "header_fields_too_large", "http_version", "server_error", "other", \
                       "body_timeout"}
/* body_timeout: a 408 too, but for a body the loop waited for, not a head */
enum { REFUSALS = 9, REFUSAL_BODY_TIMEOUT = 8 };
static inline int refusal_kind(int status)
{
	switch (status) {
	case 400: return 0;
	case 408: return 1;
	case 413: return 2;
	case 414: return 3;
	case 431: return 4;
	case 505: return 5;
	case 500: return 6;
	default: return 7;
	}
}

/* ---- the server: one per worker (engine.c) ---- */
typedef struct {
	PyObject_HEAD
	struct fdc_api api;
	struct fdc_table *table;
	int nthreads;
	struct srv_thread *thr;
	HttpConn **conns;                  /* by fd: the open connections (strong refs) */
	int maxfd;
	long count;                        /* open connections */
	uint64_t next_cookie;
	uint32_t kind_conn;
	PyObject *loop, *conns_dict, *forget, *post;
	PyObject *app, *base, *slow, *access, *report, *sendfile, *file_wrapper, *bytes_io, *no_body;
	PyObject *event_type, *busy, *enter_app;
	struct hp_limits lim;
	PyObject *script_name, *server_line;
	double header_timeout, keepalive_timeout, body_timeout;
	/* body_buffer: the most body read in the loop before the app runs
	 * (0: none, every incomplete body streams); min_body_rate: bytes/s
	 * that push the body deadline back a second (wsgi.py's MIN_BODY_RATE) */
	size_t body_buffer;
	double min_body_rate;
	int draining;
	int dispatch;                      /* connections shared by their group (dispatch.c) */
	struct spilled *runq;              /* dispatch.c: spilled reports, FIFO */
	int rq_len, rq_cap;
	unsigned long long requests;       /* answered: the app's, and our refusals */
	unsigned long long responses[6];   /* by status class: [0] other, [1] 1xx .. [5] 5xx */
	unsigned long long retire_at;      /* max_requests (with jitter); 0: never */
	PyObject *on_retire;               /* called once when requests reach retire_at */
	unsigned long long refused[REFUSALS];  /* requests the engine refused, by refusal_kind() */
	/* the refusal log: at most a line a second (log_refusals' fn) */
	PyObject *on_refusal;
	double refusal_logged;             /* mono_now() of the last line */
	unsigned long long refusal_unlogged;   /* refusals since that line */
} Server;

extern PyTypeObject ServerType;

/* The loop thread the calling OS thread is (Server.bind / turn), or -1. */
int srv_current(Server *s);
/* the responses[] index of a status code (0: other, or no response) */
static inline int status_class(int code) { return code >= 100 && code < 600 ? code / 100 : 0; }
/* One request answered (by the app, or refused by the engine): requests
 * and responses[] count the same events, so the classes add up. Caller:
 * a loop thread, GIL held. */
static inline void srv_count(Server *s, int code)
{
	s->responses[status_class(code)]++;
	s->requests++;
}
double mono_now(void);
void timer_arm(HttpConn *c, int kind);
void timer_cancel(HttpConn *c);

/* ---- one connection (hconn.c) ---- */
struct HttpConn {
	PyObject_HEAD
	Server *srv;
	int fd;
	int pos;                           /* owner loop thread */
	uint64_t cookie;
	PyObject *th;                      /* owner's fdcore.Thread */
	Parser *parser;
	char *out;                         /* output not taken by the kernel yet */
	size_t ostart, olen, ocap;
	unsigned closed : 1, closing : 1, want_send : 1, recv_on : 1, paused_out : 1,
	         serving : 1, head_clock : 1, lingering : 1, peer_eof : 1;
	double last_active;
	double due;                        /* timer: deadline, its list and links */
	int tkind, tpos;
	HttpConn *tprev, *tnext;
	PyObject *addr;                    /* (SERVER_NAME, SERVER_PORT, REMOTE_ADDR, REMOTE_PORT) */
	PyObject *peer, *local;
	PyObject *response;                /* the Respond of the request being served */
	/* dispatch.c (a connection shared by its group's threads): the loop
	 * thread handling it, -1 none; what others recorded for it meanwhile */
	int inside;
	uint32_t missed;                   /* FDC_POLL_* bits of reports it missed */
	int missed_timer;                  /* a due timer's kind, -1 none */
	int queued;                        /* on the engine's spill queue (once at most) */
	/* issue 21: a response whose body goes out from the loop (respond.c,
	 * respond_resume): held here between POLLOUT events; the next
	 * pipelined request waits for it, reading is off meanwhile */
	Respond *parked;
	unsigned long long wrote;          /* bytes the kernel took: progress, for the send timer */
	/* the environ of a request whose body the loop reads before the app
	 * runs (body_buffer): set from its head until its body is whole (or it
	 * goes to the slow path, or the connection ends); NULL otherwise */
	PyObject *held;
};

extern PyTypeObject HttpConnType;

HttpConn *hconn_new(Server *s, int pos, int fd, uint64_t cookie);
/* The handler of one poll report, under the running bit. 0 or -1 (a
 * Python error that must end the loop thread: not an app's). */
int hconn_on_events(HttpConn *c, uint32_t events);
int hconn_on_timeout(HttpConn *c, int kind);
int hconn_close_now(HttpConn *c);
/* engine.c: an error out of c's handler that is not the app's: logged,
 * c closed; the loop thread serves on. */
void contain(HttpConn *c);
/* A group-shared connection just accepted (dispatch): its first read is
 * made before any sibling's poller holds it (what is there at the
 * registration would wake every idle sibling), 1 if that read brought
 * something to serve (bytes, or the end of input), 0 nothing, -1 a Python
 * error; closed if the read failed. Then hconn_on_events(c, EV_FIRST)
 * serves what it read. */
int hconn_read_first(HttpConn *c);
int hconn_serve_first(HttpConn *c);
#define EV_FIRST 0x80000000u               /* not an fdcore bit: see above */
/* dispatch.c: one report or due timer for a group-shared connection */
int dispatch_run(HttpConn *c, int pos, uint32_t events, int kind);
/* dispatch.c: the group's queue: a batch that ran past SPILL_AFTER, or
 * any poll while the group has queued work, hands its reports to it
 * (spill), run oldest first by every thread of the group after its poll
 * (run_spilled); free_spilled at the engine's end. */
#define SPILL_AFTER 0.002
int dispatch_spill(Server *s, HttpConn *c, uint32_t events);
void dispatch_wake_idle(Server *s, int pos);
int dispatch_run_spilled(Server *s, int pos);
int dispatch_has_spilled(const Server *s, int pos);
void dispatch_free_spilled(Server *s);
/* hconn_close_now: a closing connection's entry leaves the queue */
void dispatch_unqueue(Server *s, HttpConn *c);
/* Appends to the output; flushes what the kernel takes when `now`. */
int hconn_send(HttpConn *c, const char *data, size_t n, int now);
int hconn_flush(HttpConn *c);
/* n bytes of the pending output went out (written with more, by respond.c). */
void hconn_taken(HttpConn *c, size_t n);
/* Closes at once (reset, EPIPE): the client is gone. */
void hconn_fail(HttpConn *c);
/* Sends output until at most `below` bytes wait, blocking in poll (GIL
 * released) while the client takes some at least every timeout seconds;
 * -1 with ClientGone set on failure. */
int hconn_flush_wait(HttpConn *c, double timeout, size_t below);
void hconn_refuse(HttpConn *c, int status, const char *reason);
static inline size_t hconn_pending(const HttpConn *c) { return c->olen - c->ostart; }

/* ---- the response (respond.c) ---- */
struct Respond {
	PyObject_HEAD
	HttpConn *conn;
	unsigned http11 : 1, keep : 1, head_only : 1, bodiless : 1, headers_sent : 1,
	         chunked : 1, started : 1, finished : 1, app_date : 1, app_server : 1;
	long long length;                  /* the announced length, -1 unknown */
	int code;                          /* the status code given, 0 before start_response */
	unsigned long long sent;
	PyObject *status, *prefix, *first; /* first: the held first chunk */
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

/* Runs the app for env (wsgi.input already set) and frames its response:
 * 1 if the connection may serve another request (as far as the response
 * goes), 0 if it must close, -1 with a Python error that is not the app's
 * (the app's, any BaseException, are answered and logged in there).
 * can_park: the caller is the connection's loop turn, which can send the
 * rest of a large body from the loop (2, below); else (the slow path) a
 * body past HIGH_WATER waits for the client here, as write() does. */
int respond(HttpConn *c, PyObject *env, int can_park);
/* respond()'s results: the connection closes, serves on, or the response
 * is parked on it (c->parked): the rest of its body goes out from the
 * loop, through respond_resume, before the next request is served. */
enum { RESPOND_CLOSE = 0, RESPOND_KEEP = 1, RESPOND_PARKED = 2 };
/* The parked response's turn, on the connection's loop thread, the output
 * below LOW_WATER: its tail sent, its iterator resumed. RESPOND_PARKED
 * again, or the response ended (parked cleared): RESPOND_KEEP or
 * RESPOND_CLOSE as respond() says; -1 with an error that is not the app's. */
int respond_resume(HttpConn *c);
/* The connection closed under a parked response: its iterable's close(),
 * the access log, the counts (once). Takes the reference. */
void respond_abandon(Respond *r);
/* Bytes a parked response still owes (at least 1: an iterator's are unknown). */
size_t respond_owed(const Respond *r);

/* Logs the pending exception (taken, cleared) through the worker's report
 * (wsgi.py's _report) with env (or NULL) and what failed. */
void report_exc(Server *s, PyObject *env, const char *what);

#define HIGH_WATER (1u << 20)      /* pending output that blocks write(), or parks a body */
#define LOW_WATER (64u << 10)      /* ... until it drains below this */

#endif /* SOCKHERD_HTTP_H */
