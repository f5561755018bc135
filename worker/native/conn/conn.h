/* The connection layer of the native engine: one accepted socket, its fd
 * owned through fdcore, bytes in and out, backpressure, timers, close.
 * It knows no protocol: what the bytes mean is the layer above's (today
 * the HTTP/1 codec, h1.h; a WebSocket codec beside it later), reached only
 * through the table of callbacks below (struct conn_ops), one per Server,
 * which the Server's assembly (server.c) fills.
 *
 * The layers are folders of worker/native, bottom up (layers.py says
 * which stands on which; docs/ARCHITECTURE.md draws them): parse/ (byte
 * parsers and matchers), conn/ (this one), engine/ (the loop turn, accept,
 * dispatch), proto/http1/ and proto/ws/ (the codecs), app/wsgi/ and
 * app/asgi/ (the adapters), and the assembly at the root. A file sees only
 * its own folder's and the lower folders' headers (the build's include
 * directories) and calls only their functions (tests/worker/
 * test_native_layers.py); a layer reaches the one above it only through a
 * table of callbacks (struct conn_ops, struct app_ops) the assembly fills.
 *
 * Threading: every function here runs with the GIL held, and the GIL is
 * what serialises the loop threads' use of these objects (a connection is
 * only touched by its owner thread, or by a relieving sibling while the
 * owner is stuck elsewhere, both under the GIL). The GIL is released only
 * around a wait that may block: the poll of a turn (engine.c) and the poll
 * of a blocked writer or reader (conn_io.c), and nothing shared is changed
 * across those.
 */
#ifndef SOCKHERD_CONN_H
#define SOCKHERD_CONN_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <sys/types.h>

#include "fd.h"        /* fdcore's types only: its code is reached via struct fdc_api */

/* the module's exception the connection layer raises (conn_io.c holds it;
 * the module's init, httpmodule.c, makes it) */
extern PyObject *ClientGone;

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
	int (*dump)(struct fdc_table *, int, struct fdc_fdinfo *);
};

typedef struct Server Server;      /* server.h */
struct conn;
/* the layers above's objects, opaque here: the codec's parser (h1.h) and
 * the adapter's response (wsgi.h) */
typedef struct Parser Parser;
typedef struct Respond Respond;

/* header: a head must arrive whole (header_timeout); keepalive: idle
 * between requests; linger: a closed connection's last bytes (below);
 * send: output waits and the client takes none (body_timeout); body: a
 * request body read in the loop before the app runs (body_timeout, pushed
 * back by what arrives at min_body_rate); ping: a call's connection (a
 * WebSocket's, c->call_ping) heard nothing from its client for
 * ws_ping_interval (the adapter pings it); pong: nothing came for
 * ws_ping_timeout after that ping (the adapter closes it). Two kinds, not
 * one of two durations: each list stays sorted by construction. */
enum { TIMER_HEADER = 0, TIMER_KEEPALIVE = 1, TIMER_LINGER = 2, TIMER_SEND = 3, TIMER_BODY = 4,
       TIMER_PING = 5, TIMER_PONG = 6, TIMER_KINDS = 7 };

/* How long a connection we close may still send (its unread upload, a
 * pipelined request) while we discard it: closing with unread input sends
 * a reset, and a reset can destroy the response before the client reads
 * it (nginx's lingering close; its lingering_timeout is 5 s too). */
#define LINGER_SECONDS 5.0

struct timer_list {
	struct conn *head, *tail;
};

#define HIGH_WATER (1u << 20)      /* pending output that blocks write(), or parks a body */
#define LOW_WATER (64u << 10)      /* ... until it drains below this */

/* ---- one connection ----
 * The fields up to `peer_eof` and the timer's are this layer's; parser and
 * held are the codec's, response and parked the adapter's: this layer
 * only clears them when the connection closes (held, response), asks the
 * table about them (parked) and shows them to Python. */
struct conn {
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
	         serving : 1, head_clock : 1, lingering : 1, peer_eof : 1,
	         in_kept : 1,                  /* conn_io.c: input left while not reading */
	         in_full : 1,                  /* the protocol takes no more input now (call) */
	         trusted : 1,                  /* its peer may send forwarding fields (conn_trust_peer) */
	         /* the layer above has more output than the buffer, which it
	          * sends itself once the buffer is out (an ASGI pathsend's
	          * file, by sendfile): owed, like the buffer (POLLOUT wanted,
	          * the send timer runs, a close waits for it) */
	         out_more : 1,
	         /* the call's connection runs TIMER_PING / TIMER_PONG while it
	          * owes nothing (an open WebSocket, asgi_ws_ping.c): h1_rearm
	          * keeps them, the adapter's input re-arms the ping */
	         call_ping : 1;
	/* dispatch.c's spill queue (below): the events of the reports merged
	 * into c's entry (here, beside the flags: no padding either side) */
	uint32_t qevents;
	double last_active;
	double due;                        /* timer: deadline, its list and links */
	int tkind, tpos;
	struct conn *tprev, *tnext;
	/* (SERVER_NAME, SERVER_PORT, REMOTE_ADDR, REMOTE_PORT): WSGI's, made
	 * on its first request (conn_addr), NULL before (ASGI never needs it) */
	PyObject *addr;
	PyObject *peer, *local;
	PyObject *response;                /* the Respond of the request being served */
	/* dispatch.c (a connection shared by its group's threads): the loop
	 * thread handling it, -1 none; what others recorded for it meanwhile */
	int inside;
	uint32_t missed;                   /* FDC_POLL_* bits of reports it missed */
	int missed_timer;                  /* a due timer's kind, -1 none */
	/* its entry in its group's spill queue (dispatch.c, server.h: struct
	 * runq), once at most: the queue's loop thread + 1 (0: not queued),
	 * the links, the events of the reports merged into it */
	int queued;
	struct conn *qprev, *qnext;
	/* issue 21: a response whose body goes out from the loop (wsgi_body.c,
	 * respond_resume): held here between POLLOUT events; the next
	 * pipelined request waits for it, reading is off meanwhile */
	Respond *parked;
	unsigned long long wrote;          /* bytes the kernel took: progress, for the send timer */
	/* the environ of a request whose body the loop reads before the app
	 * runs (body_buffer): set from its head until its body is whole (or it
	 * goes to the slow path, or the connection ends); NULL otherwise */
	PyObject *held;
	/* An adapter's request still running after its serve returned (ASGI:
	 * the app is a task of the owner thread's asyncio loop): the requests
	 * behind it wait (as for parked), but input is still read (its body as
	 * the app asks, the client's end) up to a bound (in_full), output is
	 * owed only while bytes wait, and no timer runs for the app's own
	 * time. The adapter's object; the connection drops it (conn_ops.drop)
	 * when it closes first. Owner thread only: a connection with a call is
	 * never shared or taken over (asgi_app.c says why). */
	PyObject *call;
	/* The PROXY protocol (conn_proxy.c): a header may still come ahead of
	 * the codec's bytes (proxy_wait), from a peer that must send one
	 * (proxy_trusted) or may not; what a header told (its dict), or NULL */
	unsigned proxy_wait : 1, proxy_trusted : 1;
	/* TLS (conn_tls.c), after the PROXY header: the session, or NULL (a
	 * plain connection: no cost); raw bytes read ahead of it (a PROXY
	 * header's tail, the first byte looked at), which its BIO reads
	 * first; whether that first byte was looked at (plain HTTP sent to a
	 * TLS port), a read that waits for the socket to be writable (rw) or
	 * a write for it to be readable (wr), the BIO's last read saw EAGAIN
	 * (eagain), the end (eof) or emptied the socket (short), c queued
	 * for a read of what the session holds (queued, its link), the
	 * handshake's outcome counted (done: completed, failed or plain
	 * HTTP; a close without one counts it abandoned); the environ keys
	 * of the session. (Its flags share the PROXY flags' word: one word,
	 * no padding, for every connection: issue 23's memory.) */
	unsigned tls_checked : 1, tls_rw : 1, tls_wr : 1, tls_eagain : 1, tls_eof : 1,
	         tls_short : 1, tls_queued : 1, tls_done : 1,
	         owed_queued : 1;              /* in its thread's owed list (h1_conn.c: owe) */
	PyObject *proxy;
	struct ssl_st *ssl;
	char *tls_pre;
	size_t tls_pre_start, tls_pre_len, tls_pre_cap;
	struct conn *tls_next;
	struct conn *owed_next;               /* its thread's owed list (h1_conn.c: owe) */
	PyObject *tls_env;
};

extern PyTypeObject ConnType;

/* ---- what this layer calls above it: one table per Server ----
 * Each entry runs on the connection's loop thread, GIL held; the int ones
 * return 0 or -1 with a Python error that is not the app's (the engine
 * contains it: logged, the connection closed). */
struct conn_ops {
	/* a new connection: its protocol state (c->parser) */
	int (*open)(struct conn *c);
	/* the fd is readable (or hung up): read, answer what came */
	int (*readable)(struct conn *c);
	/* A group-shared connection just accepted (dispatch): its first read
	 * is made before any sibling's poller holds it (what is there at the
	 * registration would wake every idle sibling), 1 if that read brought
	 * something to serve (bytes, or the end of input), 0 nothing, -1 a
	 * Python error; closed if the read failed. Then conn_on_events(c,
	 * EV_FIRST) serves what it read (serve_first). */
	int (*read_first)(struct conn *c);
	int (*serve_first)(struct conn *c);
	/* the fd is writable and a response is parked on c: its turn */
	int (*resume)(struct conn *c);
	/* a timer of the protocol's kinds (header, keep-alive, body) is due */
	int (*timeout)(struct conn *c, int kind);
	/* output went out (or all of it): the timer for what c waits for now */
	void (*rearm)(struct conn *c);
	/* the protocol has input it did not finish (an upload, a buffered
	 * request, a close handshake it awaits): a close lingers */
	int (*unread)(struct conn *c);
	/* bytes a parked response still owes (at least 1) */
	size_t (*owed)(struct conn *c);
	/* c closed (c->closed set) under what the layers above still held of
	 * it, taken off c already and each reference passed (NULL: none):
	 * the parked response (its end: the access log, the counts), the
	 * call (the app learns that its client is gone). Either may run app
	 * code; the caller holds c. */
	void (*closed)(struct conn *c, Respond *parked, PyObject *call);
	/* the answers the protocol queued for loop thread pos's next turn
	 * (srv_thread.owed), written: called by the turn before its poll and
	 * at its end, only while the list is not empty (the HTTP/1 codec's
	 * h1_owed_run for WSGI and ASGI alike: only it queues). 1 if a
	 * connection closed: the turn then polls without sleeping, so its
	 * owner (the drain) hears it. */
	int (*write_owed)(Server *s, int pos);
};

/* ---- what this layer's I/O calls of the TLS step (conn_tls.c) ----
 * Through a table, as the layers above: conn_tls.c sits above conn_io.c
 * (it sends, closes, logs through it), and conn_io.c reaches it only for
 * a connection with a session (c->ssl), through its Server's table. */
struct tls_ops {
	ssize_t (*read)(struct conn *c, char *buf, size_t room);
	ssize_t (*write)(struct conn *c, const char *buf, size_t n);
	void (*free)(struct conn *c);
	int (*buffered)(const struct conn *c);
	void (*replay)(struct conn *c);
	void (*close_notify)(struct conn *c);
};

/* ---- conn_timers.c ---- */
double mono_now(void);
void timer_arm(struct conn *c, int kind);
/* c's timer of kind due at due (not a fixed time from now) */
void timer_arm_at(struct conn *c, int kind, double due);
void timer_cancel(struct conn *c);

/* ---- conn_io.c ---- */
/* The loop thread the calling OS thread is (Server.bind / turn), or -1;
 * srv_bind makes it pos of s (s NULL: none). */
int srv_current(Server *s);
void srv_bind(Server *s, int pos);
int conn_close_now(struct conn *c);
/* Closes once the buffered output is sent. */
void conn_close_soft(struct conn *c);
/* Brings the fd's ACTIVE directions in line with what we want. */
void conn_sync(struct conn *c);
/* Appends to the output; flushes what the kernel takes when `now`. */
int conn_send(struct conn *c, const char *data, size_t n, int now);
int conn_flush(struct conn *c);
/* n bytes of the pending output went out (written with more, by wsgi_body.c). */
void conn_taken(struct conn *c, size_t n);
/* Closes at once (reset, EPIPE): the client is gone. */
void conn_fail(struct conn *c);
/* Sends output until at most `below` bytes wait, blocking in poll (GIL
 * released) while the client takes some at least every timeout seconds;
 * -1 with ClientGone set on failure. */
int conn_flush_wait(struct conn *c, double timeout, size_t below);
/* One read(2) of at most room bytes into buf: > 0 bytes read, 0 nothing
 * to do now (EAGAIN; or the connection failed, closed then), -2 end of
 * input (EOF). */
ssize_t conn_read(struct conn *c, char *buf, size_t room);
/* The read met EAGAIN: fdcore's READY_R off (the calling loop thread's). */
void conn_cant_recv(struct conn *c);
/* A growable buffer: buf[start .. len) used, room for `more` after len. */
int buf_reserve(char **buf, size_t *start, size_t *len, size_t *cap, size_t more);

/* ---- conn_events.c ---- */
/* The handler of one poll report, under the running bit. 0 or -1 (a
 * Python error that must end the loop thread: not an app's). */
int conn_on_events(struct conn *c, uint32_t events);
int conn_on_timeout(struct conn *c, int kind);
#define EV_FIRST 0x80000000u               /* not an fdcore bit: see conn_ops.read_first */

/* ---- conn_report.c ---- */
/* Logs the pending exception (taken, cleared) through the worker's report
 * (wsgi.py's _report) with env (or NULL) and what failed. */
void report_exc(Server *s, PyObject *env, const char *what);
/* An error out of c's handler that is not the app's: logged, c closed;
 * the loop thread serves on. */
void contain(struct conn *c);

static inline size_t conn_pending(const struct conn *c) { return c->olen - c->ostart; }

/* Input is read unless output waits: past HIGH_WATER, or a parked body
 * (the requests behind it wait for it; what they send waits in the
 * socket, bounded by its buffer), or a close. */
static inline int conn_reading(const struct conn *c)
{
	return c->lingering || (!c->paused_out && !c->closing && !c->parked && !c->in_full);
}

/* Output is owed: bytes buffered, a parked body's rest, or the layer
 * above's own (out_more). */
static inline int conn_owed(const struct conn *c)
{
	return conn_pending(c) || c->parked || c->out_more;
}

/* The client's address as the layers above must show it ((host, port),
 * a unix peer's "" or path, None when unknown): the socket's peer, or the
 * source a trusted PROXY protocol header named. REMOTE_ADDR and
 * REMOTE_PORT are c->addr's last two, from the same source. */
static inline PyObject *conn_peer(const struct conn *c) { return c->peer; }

/* d[key] = v, taking v's reference (released whatever happens): 0, or -1
 * with an error set, also when v is NULL (its maker failed). The
 * connection layer's dicts of what a PROXY header or a TLS session tells
 * (conn_proxy.c, conn_tls.c). */
static inline int dict_put(PyObject *d, const char *key, PyObject *v)
{
	int rc;

	if (!v)
		return -1;
	rc = PyDict_SetItemString(d, key, v);
	Py_DECREF(v);
	return rc;
}

/* Sends a file's bytes from *off (count at most): sendfile(2), or under
 * TLS pread into the output and encrypted there. > 0 bytes taken, 0 the
 * file ended, -1 with errno (EAGAIN: the kernel is full). */
ssize_t conn_sendfile(struct conn *c, int ffd, off_t *off, size_t count);

/* ---- conn_proxy.c ---- */
/* c->addr, made from c->local and c->peer the first time (a borrowed
 * reference), NULL with an error. */
PyObject *conn_addr(struct conn *c);
/* The header ahead of buf[0 .. len) (the codec's buffered input; eof: no
 * more will come). Returns the header's bytes, which the caller drops
 * from its buffer; while c->proxy_wait stays set more bytes are needed;
 * a bad header, or one from a peer not allowed, closes c (logged). -1: a
 * Python error. */
ssize_t conn_proxy_read(struct conn *c, const char *buf, size_t len, int eof);
/* header_timeout passed with the header not whole: c closes (logged). */
void conn_proxy_timeout(struct conn *c);

/* ---- conn_type.c ---- */
struct conn *conn_new(Server *s, int pos, int fd, uint64_t cookie);

/* The peer address the trusted-proxy rules judge (forwarded.h): set from
 * getpeername at accept; a layer that learns the client's own address
 * before the first request (the PROXY protocol) calls it again with that
 * one. Sets c->trusted; costs a few compares, nothing with no rules. */
struct sockaddr;
void conn_trust_peer(struct conn *c, const struct sockaddr *sa, unsigned len);
/* the connection type's own methods, joined with the layers' above by the
 * module before the type is readied (httpmodule.c) */
extern PyMethodDef conn_methods[];


#endif /* SOCKHERD_CONN_H */
