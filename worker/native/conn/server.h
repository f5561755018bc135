/* The Server: the one object of a worker that the engine's state hangs
 * from (its Python type: server_type.c, the assembly): which loop threads
 * poll which connections, the group queues of engine/dispatch.c, the
 * settings, and the counts every layer adds to. Here, in the connection
 * layer, because every connection function reads it (its fdcore table,
 * its threads, its tables of the layers above). It still holds settings
 * of the layers above by value (the codec's limits, parse/httpparse.h;
 * the adapters' objects): what only one layer reads is to move into that
 * layer's own struct (issue 37, step 2).
 */
#ifndef SOCKHERD_SERVER_H
#define SOCKHERD_SERVER_H

#include "conn.h"
#include "httpparse.h"     /* struct hp_limits: the codec's settings, held here */
#include "forwarded.h"     /* struct fwd_rules: the trusted proxies */

struct app_ops;             /* h1.h */

/* The request-duration histogram's bounds, seconds: prometheus_client's
 * default buckets, the ones the common exporters use, so a dashboard's
 * quantiles read the same; Server.durations gives them with the counts */
#define DURATION_BUCKETS 14
#define DURATION_BOUNDS {0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, \
                         1.0, 2.5, 5.0, 7.5, 10.0}

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
	PyObject *aio;                     /* ASGI: its asyncio loop (Server.set_aio), or NULL */
	int lead;                          /* its group's first loop thread: holds rq */
	/* dispatch.c's queue of the group, in its lead thread's entry: the
	 * connections whose reports wait, oldest first (each holds a strong
	 * reference), linked through their qprev/qnext */
	struct runq {
		struct conn *head, *tail;
	} rq;
	/* conn_tls.c: the connections of this thread whose session holds
	 * input no report will announce, read at its next turn (each holds a
	 * strong reference, linked through tls_next) */
	struct conn *tls_replay;
	/* h1_conn.c: the connections whose answers, ended under load, are
	 * written together at the turn's end or before its next poll (owe;
	 * each holds a strong reference, linked through owed_next), and when
	 * the first of them was queued */
	struct conn *owed;
	double owed_since, owed_last;      /* and when the last answer ended */
	/* set by accept() and take() for their call: the listener is a plain
	 * one beside TLS ones (per-bind TLS), so tls_open makes no session */
	int plain;
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

/* ---- the server: one per worker (engine.c; its Python type: server.c) ----
 * Its fields are grouped by the layer that reads them: fdcore and the
 * loop threads, the connections and timers (connection layer), lim and
 * the timeouts (codec), app .. no_body (the WSGI adapter), the counts. */
struct Server {
	PyObject_HEAD
	/* the layers above, as this Server's assembly chose them (server.c) */
	const struct conn_ops *ops;
	const struct app_ops *app_ops;
	struct fdc_api api;
	struct fdc_table *table;
	int nthreads;
	struct srv_thread *thr;
	struct conn **conns;                  /* by fd: the open connections (strong refs) */
	int maxfd;
	long count;                        /* open connections */
	uint64_t next_cookie;
	uint32_t kind_conn;
	PyObject *loop, *conns_dict, *forget, *post;
	/* slow: WSGI's slow path (wsgi.py serve_slow); ASGI's runner of one
	 * call (asgi.py run_call) */
	PyObject *app, *base, *slow, *access, *report, *sendfile, *file_wrapper, *bytes_io, *no_body;
	PyObject *scope_base;            /* ASGI: base sized for a whole scope (asgi_scope_base) */
	PyObject *event_type, *busy, *enter_app;
	int access_headers;     /* the access log's format names a response header (accesslog.py) */
	struct hp_limits lim;
	PyObject *script_name, *server_line;
	double header_timeout, keepalive_timeout, body_timeout;
	/* an open WebSocket silent this long is pinged, closed if still
	 * silent ws_ping_timeout after (asgi_ws_ping.c); 0: never */
	double ws_ping_interval, ws_ping_timeout;
	/* body_buffer: the most body read in the loop before the app runs
	 * (0: none, every incomplete body streams); min_body_rate: bytes/s
	 * that push the body deadline back a second (wsgi.py's MIN_BODY_RATE) */
	size_t body_buffer;
	double min_body_rate;
	int draining;
	int dispatch;                      /* connections shared by their group (dispatch.c) */
	unsigned long long requests;       /* answered: the app's, and our refusals */
	unsigned long long responses[6];   /* by status class: [0] other, [1] 1xx .. [5] 5xx */
	/* the app's requests by duration (srv_time): [i] those of at most
	 * DURATION_BOUNDS[i] seconds and more than the bound before, the
	 * last one those above every bound; and their seconds' sum */
	unsigned long long durations[DURATION_BUCKETS + 1];
	double duration_sum;
	unsigned long long retire_at;      /* max_requests (with jitter); 0: never */
	PyObject *on_retire;               /* called once when requests reach retire_at */
	unsigned long long refused[REFUSALS];  /* requests the engine refused, by refusal_kind() */
	/* the refusal log: at most a line a second (log_refusals' fn) */
	PyObject *on_refusal;
	double refusal_logged;             /* mono_now() of the last line */
	unsigned long long refusal_unlogged;   /* refusals since that line */
	/* the error log's throttle (conn_report.c report_exc): per kind (the
	 * place's text and the exception's type, compared as pointers, never
	 * read), a few lines an interval, then counted */
	struct report_kind {
		const char *what;
		const void *type;
		double since;                      /* mono_now() the interval began */
		unsigned logged;                   /* lines in it */
		unsigned long long unlogged;       /* not logged since the last line */
	} report_kinds[8];
	/* trusted proxy headers (forwarded.h): which peers, which fields */
	struct fwd_rules fwd;
	/* the PROXY protocol (conn_proxy.c, Server.set_proxy): the header
	 * expected (PP_*, proxy_proto.h; 0: none, and no cost), from which
	 * peers, and the connections closed over one */
	int proxy_mode;
	struct netmatch proxy_allow;       /* proxy_allow_from */
	unsigned long long proxy_refused;
	/* TLS (conn_tls_ctx.c, Server.set_tls): the context every connection's
	 * session comes from (NULL: plain HTTP, and no cost), the server's
	 * certificate in PEM (the ASGI tls extension's server_cert), the
	 * handshakes that failed and the plain HTTP requests refused */
	struct ssl_ctx_st *tls_ctx;
	const struct tls_ops *tls;
	PyObject *tls_server_pem;
	unsigned long long tls_failed, tls_abandoned, tls_plain;
	/* handshakes completed, and how many of them resumed a session
	 * (conn_tls.c tls_read: counted once per connection, tls_done) */
	unsigned long long tls_handshakes, tls_resumed;
	/* conn_type.c: the local address of the last TCP connection accepted
	 * (its sockaddr's bytes) and its objects, shared by every connection
	 * with the same one (one per listener, mostly): the (host, port)
	 * tuple of scope["server"] / conn.local and SERVER_PORT's str
	 * (immutable, so sharing them shows nowhere; ~200 bytes a connection
	 * not allocated: memory per idle WebSocket, issue 23) */
	unsigned char local_key[28];
	unsigned local_key_len;
	PyObject *local_obj, *local_port;
	/* the same for the last TCP peer's host str (connections from one
	 * client, or all from a proxy, share it): its address's bytes */
	unsigned char peer_key[17];
	unsigned peer_key_len;
	PyObject *peer_host;
};

/* The Server's type, for the layers' type checks: server_type.c (the
 * assembly, above every layer) defines it and the module's init sets this
 * (conn_type.c holds it) */
extern PyTypeObject *server_type;
extern PyMethodDef server_proxy_methods[]; /* conn_proxy.c: set_proxy */
extern PyMethodDef proxy_module_methods[]; /* conn_proxy.c: proxy_parse, proxy_signature */

/* ---- conn_proxy.c ---- */
struct pp_result;
/* A parsed header's dict (version, local, src, dst, the TLVs' values). */
PyObject *proxy_info(const struct pp_result *r);
/* The refusal log: fn(peer, status, reason, count) at most a line a
 * second (conn_report.c); status 0: a connection closed before any request. */
void srv_log_refusal(Server *s, PyObject *peer, int status, const char *reason);

/* One request of the app's ended (its response sent, failed or its client
 * gone), begun at `started` (mono_now() as the app was called): the
 * duration histogram's count. Two clock reads a request (vDSO, no
 * syscall) and at most 14 comparisons, always on: the histogram has no
 * switch. Caller: a loop thread, GIL held (s->durations is the GIL's). */
static inline void srv_time(Server *s, double started)
{
	static const double bounds[DURATION_BUCKETS] = DURATION_BOUNDS;
	double d = mono_now() - started;
	int i = 0;

	while (i < DURATION_BUCKETS && d > bounds[i])
		i++;
	s->durations[i]++;
	s->duration_sum += d;
}

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

/* dispatch.c: a batch that ran past this long hands the rest of its reports
 * to the group's queue (engine.h); conn_io.c reads it too */
#define SPILL_AFTER 0.002

/* conn_timers.c: ms until the thread's next deadline, or -1 */
int timers_timeout(struct srv_thread *t, double now);

/* Takes queued c off its group's queue, in O(1); the queue's reference
 * is the caller's now. The GIL's. Here, not in dispatch.c, since
 * conn_io.c's close takes a closing connection off too (it calls nothing
 * above it). */
static inline void runq_unlink(Server *s, struct conn *c)
{
	struct runq *q = &s->thr[c->queued - 1].rq;

	if (c->qprev)
		c->qprev->qnext = c->qnext;
	else
		q->head = c->qnext;
	if (c->qnext)
		c->qnext->qprev = c->qprev;
	else
		q->tail = c->qprev;
	c->qprev = c->qnext = NULL;
	c->queued = 0;
	c->qevents = 0;
}


#endif /* SOCKHERD_SERVER_H */
