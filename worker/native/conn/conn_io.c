/* The connection layer's I/O: one connection's fd through fdcore (its
 * directions, its delete), its output buffered only as far as the kernel
 * does not take it, backpressure (reading stops past HIGH_WATER), reads,
 * a soft close with its lingering end (the events of a poll report:
 * conn_events.c).
 * What the bytes mean is the protocol's: read, answered, timed out or
 * owed through the Server's struct conn_ops (conn.h), the only way up.
 *
 * fdcore verbs take the calling loop thread's context (srv_current), never
 * the owner's (a review finding of the launch issue); a thread that is not
 * a loop thread posts write and close to the owner's mailbox (conn_type.c).
 *
 * This file: the fd, the output, the input and the closes. A poll
 * report's and a timer's dispatch: conn_events.c (conn_io_int.h between
 * the two); the refusal log and the containment of a handler's error:
 * conn_report.c.
 *
 * May call: conn_timers.c, fdcore (struct fdc_api), the loop's Python
 * callables (forget, report); above only through struct conn_ops.
 */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server.h"
#include "conn_io_int.h"

/* the client went away (conn.h): made by the module's init (httpmodule.c) */
PyObject *ClientGone;

static _Thread_local Server *tls_srv;
static _Thread_local int tls_pos = -1;

int srv_current(Server *s)
{
	return tls_srv == s ? tls_pos : -1;
}

/* The calling OS thread acts as loop thread pos of s from now on (s
 * NULL: none): Server.bind, and the turn's and accept's own binding. */
void srv_bind(Server *s, int pos)
{
	tls_srv = s;
	tls_pos = pos;
}

/* ---- buffers ------------------------------------------------------------------ */

int buf_reserve(char **buf, size_t *start, size_t *len, size_t *cap, size_t more)
{
	if (*start && *start == *len)
		*start = *len = 0;
	if (*len + more <= *cap)
		return 0;
	if (*start) {                        /* slide what is left to the front */
		memmove(*buf, *buf + *start, *len - *start);
		*len -= *start;
		*start = 0;
		if (*len + more <= *cap)
			return 0;
	}
	size_t ncap = *cap ? *cap : 4096;
	while (ncap < *len + more)
		ncap *= 2;
	char *nbuf = PyMem_Realloc(*buf, ncap);
	if (!nbuf) {
		PyErr_NoMemory();
		return -1;
	}
	*buf = nbuf;
	*cap = ncap;
	return 0;
}

/* ---- the fdcore side ---------------------------------------------------------------- */

/* The fdcore context for a verb on c: the calling loop thread's. From a
 * thread of the app's own (a WSGI write() from a producer thread) only
 * while c is serving: its owner is then inside the app, not in an fdcore
 * call (its poll runs only between requests), and the GIL orders the two
 * threads' C code, so the owner's context is used by one thread at a
 * time. Else NULL: the caller posts to the owner, or does nothing. */
static struct fdc_thread *ctx(struct conn *c)
{
	int cur = srv_current(c->srv);

	if (cur >= 0)
		return c->srv->thr[cur].th;
	return c->serving ? c->srv->thr[c->pos].th : NULL;
}

/* c closes: its entry in the group's queue (dispatch.c), if queued,
 * leaves it now (here, not in dispatch.c: the connection layer's close
 * calls nothing above it). A closed
 * connection's report is never run, and the entry's reference must not
 * outlive the connection: a loop that stopped with entries still queued
 * (each run ends past SPILL_AFTER) left them for good, and the engine with
 * them (c references its engine from an object the garbage collector does
 * not track). The GIL's; the caller holds a reference to c of its own. */
static void unqueue(Server *s, struct conn *c)
{
	if (!c->queued)
		return;
	runq_unlink(s, c);
	Py_DECREF(c);
}

/* Brings the fd's ACTIVE directions in line with what we want. */
static void sync_dirs(struct conn *c)
{
	struct fdc_api *api = &c->srv->api;
	struct fdc_thread *th = ctx(c);
	size_t pending = conn_pending(c);
	int want, rd;

	if (c->closed || !th)
		return;
	if (c->paused_out && pending < LOW_WATER)
		c->paused_out = 0;
	else if (!c->paused_out && pending > HIGH_WATER)
		c->paused_out = 1;
	/* a TLS read waits for room to send its handshake's flight */
	want = conn_owed(c) || c->tls_rw;
	if (want != c->want_send) {
		c->want_send = (unsigned)want;
		(want ? api->want_send : api->stop_send)(th, c->fd);
	}
	rd = conn_reading(c) || c->tls_wr;    /* a TLS write may wait for input */
	if (rd && !c->recv_on && c->ssl && c->srv->tls->buffered(c))
		c->srv->tls->replay(c);                      /* held by the session: no report will come */
	if (rd && c->in_kept) {
		/* input a report brought while we did not read (keep_input):
		 * the thread inside c reads it as a report of its own */
		c->in_kept = 0;
		c->missed |= FDC_POLL_IN;
	}
	if (rd != c->recv_on) {
		c->recv_on = (unsigned)rd;
		(rd ? api->want_recv : api->stop_recv)(th, c->fd);
	}
}

int conn_close_now(struct conn *c)
{
	Server *s = c->srv;
	struct fdc_thread *th;
	PyObject *r, *call;
	Respond *parked;

	if (c->closed)
		return 0;
	th = ctx(c);
	if (!th) {
		PyErr_SetString(PyExc_RuntimeError, "a connection closed outside its loop's threads");
		return -1;
	}
	/* a body the loop was sending ends below. Serving: the resumption
	 * running now sees the close and ends it itself */
	parked = c->serving ? NULL : c->parked;
	if (parked)
		c->parked = NULL;
	call = c->call;                /* its reference: the adapter's below */
	c->call = NULL;
	c->closed = 1;
	timer_cancel(c);
	if (c->ssl || c->tls_pre)
		s->tls->free(c);
	Py_CLEAR(c->held);
	PyMem_Free(c->out);
	c->out = NULL;
	c->ostart = c->olen = c->ocap = 0;
	Py_CLEAR(c->response);
	/* the loop's dict and the gate's counts (loop.forget) */
	if (s->forget) {
		r = PyObject_CallOneArg(s->forget, (PyObject *)c);
		if (!r)
			PyErr_WriteUnraisable(s->forget);
		Py_XDECREF(r);
	}
	/* deferred to the leave of whichever thread is inside it */
	s->api.delete(th, c->fd);
	if (c->fd < s->maxfd && s->conns[c->fd] == c) {
		s->conns[c->fd] = NULL;
		s->count--;
		Py_DECREF(c);
	}
	if (parked || call)
		s->ops->closed(c, parked, call);   /* the layers above's end of them; holds c */
	unqueue(s, c);                 /* last: the caller holds c by a reference of its own */
	return 0;
}

static void fail(struct conn *c)
{
	if (conn_close_now(c) < 0)
		PyErr_WriteUnraisable((PyObject *)c);
}

void conn_fail(struct conn *c)
{
	fail(c);
}

/* Whether the client may still be sending: an upload not read whole, a
 * request (part of one) buffered, or bytes waiting in the socket. */
static int may_send_more(struct conn *c)
{
	int avail = 0;

	if (c->peer_eof)
		return 0;
	if (c->srv->ops->unread(c))
		return 1;
	return ioctl(c->fd, FIONREAD, &avail) == 0 && avail > 0;
}

/* All output sent and the connection ends: at once, or, if the client may
 * still be sending, after a lingering close: our FIN now (shutdown), its
 * bytes read and dropped until it closes too or LINGER_SECONDS pass. */
static void end(struct conn *c)
{
	if (c->ssl)
		c->srv->tls->close_notify(c);
	if (c->lingering || !may_send_more(c) || shutdown(c->fd, SHUT_WR) < 0) {
		fail(c);
		return;
	}
	c->lingering = 1;
	timer_arm(c, TIMER_LINGER);
	sync_dirs(c);
}

/* Closes once the buffered output is sent. */
static void close_soft(struct conn *c)
{
	if (c->closed)
		return;
	c->closing = 1;
	Py_CLEAR(c->held);                         /* a held request is never served now */
	if (!conn_owed(c))
		end(c);
	else
		sync_dirs(c);
}

/* A lingering connection's input: dropped; its end closes it. */
void discard(struct conn *c)
{
	char sink[16384];

	for (int i = 0; i < 16; i++) {
		ssize_t n = read(c->fd, sink, sizeof(sink));

		if (n > 0)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
			struct fdc_thread *th = ctx(c);
			if (th && errno == EAGAIN)
				c->srv->api.cant_recv(th, c->fd);
			return;
		}
		fail(c);                               /* its FIN (or a reset): done */
		return;
	}
}

/* The timer for what the connection waits for now: the protocol's call
 * (a head's clock, keep-alive, a held body), made after output went out. */
static void rearm(struct conn *c)
{
	c->srv->ops->rearm(c);
}

void conn_close_soft(struct conn *c)
{
	close_soft(c);
}

void conn_sync(struct conn *c)
{
	sync_dirs(c);
}

/* ---- output ------------------------------------------------------------------------------- */

int conn_send(struct conn *c, const char *data, size_t n, int now)
{
	if (c->closed)
		return 0;
	if (n) {
		if (buf_reserve(&c->out, &c->ostart, &c->olen, &c->ocap, n) < 0)
			return -1;
		memcpy(c->out + c->olen, data, n);
		c->olen += n;
	}
	return now ? conn_flush(c) : 0;
}

/* One write of what is pending. 0, or the connection is closed (failed);
 * never a Python error. */
int conn_flush(struct conn *c)
{
	size_t pending = conn_pending(c);
	ssize_t n;

	if (c->closed || !pending)
		return 0;
	if (c->ssl) {
		/* every TLS write goes through here: a retry after WANT_WRITE
		 * then always offers the same bytes first (conn_tls.c) */
		n = c->srv->tls->write(c, c->out + c->ostart, pending);
		if (n < 0) {
			fail(c);
			return 0;
		}
	}
	else
		n = write(c->fd, c->out + c->ostart, pending);
	if (n < 0) {
		if (errno == EAGAIN || errno == EINTR)
			n = 0;
		else {
			fail(c);                          /* reset, EPIPE: the client is gone */
			return 0;
		}
	}
	c->ostart += (size_t)n;
	c->wrote += (unsigned long long)n;
	if (n > 0 && c->srv->draining)
		/* a drain's (or a standby's) idle grace counts from the last
		 * byte out too: an answer written after a slow app call (owed,
		 * or a thread's only one in its app) is when the client sends
		 * its next request, and closing it then as idle since its
		 * request came was a keep-alive race (reload_under_load) */
		c->last_active = mono_now();
	if (c->ostart == c->olen) {
		/* nothing kept for an idle connection (memory per connection) */
		PyMem_Free(c->out);
		c->out = NULL;
		c->ostart = c->olen = c->ocap = 0;
		if (c->closing && !conn_owed(c)) {
			end(c);
			return 0;
		}
		rearm(c);
	}
	else if (n > 0 || c->tkind != TIMER_SEND)
		rearm(c);                          /* progress: the client reads */
	sync_dirs(c);
	return 0;
}

void conn_taken(struct conn *c, size_t n)
{
	c->ostart += n;
	if (c->ostart == c->olen) {
		PyMem_Free(c->out);
		c->out = NULL;
		c->ostart = c->olen = c->ocap = 0;
	}
}

int conn_flush_wait(struct conn *c, double timeout, size_t below)
{
	double deadline = mono_now() + timeout;

	while (!c->closed && conn_pending(c) > below) {
		struct pollfd pfd = {.fd = c->fd, .events = POLLOUT | (c->tls_wr ? POLLIN : 0)};
		size_t before = conn_pending(c);
		double left;
		int rc;

		conn_flush(c);
		if (!c->closed && conn_pending(c) < before)
			deadline = mono_now() + timeout;   /* progress: the client reads, slowly maybe */
		if (c->closed || conn_pending(c) <= below)
			break;
		left = deadline - mono_now();
		if (left <= 0) {
			/* nothing more will reach it: closed here, so a ClientGone
			 * on an open connection is always a read side's (respond) */
			fail(c);
			PyErr_SetString(ClientGone, "the client does not read");
			return -1;
		}
		Py_BEGIN_ALLOW_THREADS
		rc = poll(&pfd, 1, (int)(left * 1000) + 1);
		Py_END_ALLOW_THREADS
		(void)rc;
	}
	if (c->closed) {
		PyErr_SetString(ClientGone, "the client went away");
		return -1;
	}
	sync_dirs(c);
	return 0;
}

ssize_t conn_sendfile(struct conn *c, int ffd, off_t *off, size_t count)
{
	ssize_t n;

	if (!c->ssl)
		return sendfile(c->fd, ffd, off, count);
	/* TLS (no kTLS on these kernels): read into the output, encrypted
	 * there; at most 256 KiB a call, the output's own bound */
	if (count > (256u << 10))
		count = 256u << 10;
	if (buf_reserve(&c->out, &c->ostart, &c->olen, &c->ocap, count) < 0) {
		PyErr_Clear();
		errno = ENOMEM;
		return -1;
	}
	do
		n = pread(ffd, c->out + c->olen, count, *off);
	while (n < 0 && errno == EINTR);
	if (n <= 0)
		return n;
	c->olen += (size_t)n;
	*off += n;
	conn_flush(c);
	return n;
}

/* ---- input ---------------------------------------------------------------------------------- */

void conn_cant_recv(struct conn *c)
{
	struct fdc_thread *th = ctx(c);

	if (th && !c->closed && c->recv_on)
		c->srv->api.cant_recv(th, c->fd);
}

ssize_t conn_read(struct conn *c, char *buf, size_t room)
{
	ssize_t n;

	if (c->ssl)
		return c->srv->tls->read(c, buf, room);
	n = read(c->fd, buf, room);

	if (n < 0) {
		if (errno == EAGAIN || errno == EINTR) {
			struct fdc_thread *th = ctx(c);
			if (th && errno == EAGAIN && !c->closed && c->recv_on)
				c->srv->api.cant_recv(th, c->fd);
			return 0;
		}
		fail(c);
		return 0;
	}
	return n == 0 ? -2 : n;
}
