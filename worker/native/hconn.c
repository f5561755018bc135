/* One HTTP/1.1 connection of the native engine: bytes in, requests
 * answered in order (pipelining), output buffered only as far as the
 * kernel does not take it.
 *
 * The event handler (hconn_on_events) runs on the owner loop thread under
 * the fd's running bit: one read, every complete request head answered,
 * their responses gathered and sent with one write. A request whose body
 * has fully arrived (or that has none) is served here, start to end. One
 * whose body is still coming is held (c->held) while the loop reads its
 * body, as nginx's client_body_buffer_size: the app runs once the body is
 * whole, and meanwhile no thread waits on the client, so a slow upload
 * costs its thread nothing. A body larger than body_buffer (a chunked one
 * once that much of it is here) goes to wsgi.py's slow path, which streams
 * wsgi.input from the socket: it is never held whole in memory. A
 * response body larger than the output buffer is parked on the connection
 * (c->parked, respond.c) and goes out on its POLLOUT events (resume):
 * meanwhile the connection reads nothing and its next request waits.
 *
 * The Python side sees a connection with the stream interface's names
 * (fd, th, cookie, pending, closed, last_active, write, close, flush_now,
 * adopted_by): the loop's drain, the relief's takeover, the gate's counts
 * and the slow path use it as they used stream.Connection.
 *
 * fdcore verbs take the calling loop thread's context (srv_current), never
 * the owner's (a review finding of the launch issue); a thread that is not
 * a loop thread posts write and close to the owner's mailbox.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "http.h"
#include <structmember.h>

#define READ_ROOM (16u << 10)        /* free room a read gets at least */

static const char *REASONS(int status)
{
	switch (status) {
	case 400: return "Bad Request";
	case 408: return "Request Timeout";
	case 413: return "Content Too Large";
	case 414: return "URI Too Long";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 501: return "Not Implemented";
	case 505: return "HTTP Version Not Supported";
	default: return "Error";
	}
}

/* ---- addresses ----------------------------------------------------------------- */

static PyObject *host_str(const struct sockaddr_storage *ss)
{
	char buf[INET6_ADDRSTRLEN];

	if (ss->ss_family == AF_INET)
		inet_ntop(AF_INET, &((const struct sockaddr_in *)ss)->sin_addr, buf, sizeof(buf));
	else
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)ss)->sin6_addr, buf, sizeof(buf));
	return PyUnicode_FromString(buf);
}

static int port_of(const struct sockaddr_storage *ss)
{
	return ntohs(ss->ss_family == AF_INET ? ((const struct sockaddr_in *)ss)->sin_port
	                                      : ((const struct sockaddr_in6 *)ss)->sin6_port);
}

/* SERVER_NAME, SERVER_PORT, REMOTE_ADDR, REMOTE_PORT, and peer / local
 * as Python's socket gives them ((host, port), or the unix path). */
static int addresses(HttpConn *c)
{
	struct sockaddr_storage local, peer;
	socklen_t ll = sizeof(local), pl = sizeof(peer);

	memset(&local, 0, sizeof(local));
	memset(&peer, 0, sizeof(peer));
	if (getsockname(c->fd, (struct sockaddr *)&local, &ll) < 0 ||
	    getpeername(c->fd, (struct sockaddr *)&peer, &pl) < 0) {
		/* reset already: the first read will tell */
		c->addr = Py_BuildValue("(ssss)", "", "", "", "");
		c->peer = Py_NewRef(Py_None);
		c->local = Py_NewRef(Py_None);
		return c->addr ? 0 : -1;
	}
	if (local.ss_family == AF_INET || local.ss_family == AF_INET6) {
		PyObject *lh = host_str(&local), *ph = host_str(&peer);

		if (!lh || !ph) {
			Py_XDECREF(lh);
			Py_XDECREF(ph);
			return -1;
		}
		c->addr = Py_BuildValue("(ONON)", lh, PyUnicode_FromFormat("%d", port_of(&local)), ph,
		                        PyUnicode_FromFormat("%d", port_of(&peer)));
		c->local = Py_BuildValue("(Oi)", lh, port_of(&local));
		c->peer = Py_BuildValue("(Oi)", ph, port_of(&peer));
		Py_DECREF(lh);
		Py_DECREF(ph);
	}
	else {
		const struct sockaddr_un *un = (const struct sockaddr_un *)&local;
		size_t n = ll > offsetof(struct sockaddr_un, sun_path)
		           ? strnlen(un->sun_path, ll - offsetof(struct sockaddr_un, sun_path)) : 0;

		c->local = PyUnicode_DecodeFSDefaultAndSize(un->sun_path, (Py_ssize_t)n);
		c->peer = PyUnicode_FromString("");
		c->addr = c->local ? Py_BuildValue("(Osss)", c->local, "", "", "") : NULL;
	}
	return c->addr && c->local && c->peer ? 0 : -1;
}

HttpConn *hconn_new(Server *s, int pos, int fd, uint64_t cookie)
{
	HttpConn *c = PyObject_New(HttpConn, &HttpConnType);

	if (!c)
		return NULL;
	memset((char *)c + sizeof(PyObject), 0, sizeof(HttpConn) - sizeof(PyObject));
	c->srv = (Server *)Py_NewRef(s);
	c->fd = fd;
	c->pos = pos;
	c->cookie = cookie;
	c->th = Py_NewRef(s->thr[pos].obj);
	c->tkind = -1;
	c->inside = -1;
	c->missed_timer = -1;
	c->last_active = mono_now();
	c->parser = parser_new(&s->lim, s->script_name);
	if (!c->parser || addresses(c) < 0) {
		c->closed = 1;
		Py_DECREF(c);
		return NULL;
	}
	return c;
}

/* ---- the fdcore side ---------------------------------------------------------------- */

/* The fdcore context for a verb on c: the calling loop thread's. From a
 * thread of the app's own (a WSGI write() from a producer thread) only
 * while c is serving: its owner is then inside the app, not in an fdcore
 * call (its poll runs only between requests), and the GIL orders the two
 * threads' C code, so the owner's context is used by one thread at a
 * time. Else NULL: the caller posts to the owner, or does nothing. */
static struct fdc_thread *ctx(HttpConn *c)
{
	int cur = srv_current(c->srv);

	if (cur >= 0)
		return c->srv->thr[cur].th;
	return c->serving ? c->srv->thr[c->pos].th : NULL;
}

/* Input is read unless output waits: past HIGH_WATER, or a parked body
 * (the requests behind it wait for it; what they send waits in the
 * socket, bounded by its buffer), or a close. */
static int reading(const HttpConn *c)
{
	return c->lingering || (!c->paused_out && !c->closing && !c->parked);
}

/* Output is owed: bytes buffered, or a parked body's rest. */
static int owed(const HttpConn *c)
{
	return hconn_pending(c) || c->parked;
}

/* Brings the fd's ACTIVE directions in line with what we want. */
static void sync_dirs(HttpConn *c)
{
	struct fdc_api *api = &c->srv->api;
	struct fdc_thread *th = ctx(c);
	size_t pending = hconn_pending(c);
	int want, rd;

	if (c->closed || !th)
		return;
	if (c->paused_out && pending < LOW_WATER)
		c->paused_out = 0;
	else if (!c->paused_out && pending > HIGH_WATER)
		c->paused_out = 1;
	want = owed(c);
	if (want != c->want_send) {
		c->want_send = (unsigned)want;
		(want ? api->want_send : api->stop_send)(th, c->fd);
	}
	rd = reading(c);
	if (rd != c->recv_on) {
		c->recv_on = (unsigned)rd;
		(rd ? api->want_recv : api->stop_recv)(th, c->fd);
	}
}

int hconn_close_now(HttpConn *c)
{
	Server *s = c->srv;
	struct fdc_thread *th;
	PyObject *r;
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
	c->closed = 1;
	timer_cancel(c);
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
	if (parked)
		respond_abandon(parked);   /* close() (once), the access log, the counts; holds c */
	dispatch_unqueue(s, c);        /* last: the caller holds c by a reference of its own */
	return 0;
}

static void fail(HttpConn *c)
{
	if (hconn_close_now(c) < 0)
		PyErr_WriteUnraisable((PyObject *)c);
}

void hconn_fail(HttpConn *c)
{
	fail(c);
}

/* Whether the client may still be sending: an upload not read whole, a
 * request (part of one) buffered, or bytes waiting in the socket. */
static int may_send_more(HttpConn *c)
{
	Parser *p = c->parser;
	int avail = 0;

	if (c->peer_eof)
		return 0;
	if (p->hp.state == HP_BODY || p->len > p->start)
		return 1;
	return ioctl(c->fd, FIONREAD, &avail) == 0 && avail > 0;
}

/* All output sent and the connection ends: at once, or, if the client may
 * still be sending, after a lingering close: our FIN now (shutdown), its
 * bytes read and dropped until it closes too or LINGER_SECONDS pass. */
static void end(HttpConn *c)
{
	if (c->lingering || !may_send_more(c) || shutdown(c->fd, SHUT_WR) < 0) {
		fail(c);
		return;
	}
	c->lingering = 1;
	timer_arm(c, TIMER_LINGER);
	sync_dirs(c);
}

/* Closes once the buffered output is sent. */
static void close_soft(HttpConn *c)
{
	if (c->closed)
		return;
	c->closing = 1;
	Py_CLEAR(c->held);                         /* a held request is never served now */
	if (!owed(c))
		end(c);
	else
		sync_dirs(c);
}

/* A lingering connection's input: dropped; its end closes it. */
static void discard(HttpConn *c)
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

/* The timer for what the connection waits for now, after a request or
 * some output went out: the client to take pending output (send), the
 * rest of a head (its clock runs from the first of its bytes: not re-armed
 * by the next ones), or the next request (keep-alive). */
static void rearm(HttpConn *c)
{
	/* held: the body timer runs from the head on, whatever goes out */
	if (c->closed || c->serving || c->lingering || c->held)
		return;
	if (owed(c)) {
		c->head_clock = 0;                 /* a head's clock starts again after */
		timer_arm(c, TIMER_SEND);
		return;
	}
	if (c->closing)
		return;
	if (parser_head_started(c->parser)) {
		if (!c->head_clock) {
			c->head_clock = 1;
			timer_arm(c, TIMER_HEADER);
		}
	}
	else {
		c->head_clock = 0;
		timer_arm(c, TIMER_KEEPALIVE);
	}
}

/* ---- output ------------------------------------------------------------------------------- */

int hconn_send(HttpConn *c, const char *data, size_t n, int now)
{
	if (c->closed)
		return 0;
	if (n) {
		if (buf_reserve(&c->out, &c->ostart, &c->olen, &c->ocap, n) < 0)
			return -1;
		memcpy(c->out + c->olen, data, n);
		c->olen += n;
	}
	return now ? hconn_flush(c) : 0;
}

/* One write of what is pending. 0, or the connection is closed (failed);
 * never a Python error. */
int hconn_flush(HttpConn *c)
{
	size_t pending = hconn_pending(c);
	ssize_t n;

	if (c->closed || !pending)
		return 0;
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
	if (c->ostart == c->olen) {
		/* nothing kept for an idle connection (memory per connection) */
		PyMem_Free(c->out);
		c->out = NULL;
		c->ostart = c->olen = c->ocap = 0;
		if (c->closing && !c->parked) {
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

void hconn_taken(HttpConn *c, size_t n)
{
	c->ostart += n;
	if (c->ostart == c->olen) {
		PyMem_Free(c->out);
		c->out = NULL;
		c->ostart = c->olen = c->ocap = 0;
	}
}

int hconn_flush_wait(HttpConn *c, double timeout, size_t below)
{
	double deadline = mono_now() + timeout;

	while (!c->closed && hconn_pending(c) > below) {
		struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};
		size_t before = hconn_pending(c);
		double left;
		int rc;

		hconn_flush(c);
		if (!c->closed && hconn_pending(c) < before)
			deadline = mono_now() + timeout;   /* progress: the client reads, slowly maybe */
		if (c->closed || hconn_pending(c) <= below)
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

/* A refusal counted by kind, and logged with the peer and the reason: a
 * line at most a second per worker (a flood of bad requests must not
 * flood the log), saying how many were refused since the last one. */
static void note_refusal(HttpConn *c, int status, int kind, const char *reason)
{
	Server *s = c->srv;
	double now;
	PyObject *rc;

	s->refused[kind]++;
	s->refusal_unlogged++;
	if (!s->on_refusal)
		return;
	now = mono_now();
	if (s->refusal_logged && now - s->refusal_logged < 1.0)
		return;
	rc = PyObject_CallFunction(s->on_refusal, "OisK", c->peer, status, reason,
	                           s->refusal_unlogged);
	s->refusal_logged = now;
	s->refusal_unlogged = 0;
	if (!rc)
		PyErr_WriteUnraisable(s->on_refusal);
	Py_XDECREF(rc);
}

/* hconn_refuse, counted under `kind` (refusal_kind() of the status, or
 * one the status does not tell apart) */
static void refuse_as(HttpConn *c, int status, int kind, const char *reason)
{
	char buf[1100];
	char body[600];
	const char *date;
	size_t dn;
	int bn = snprintf(body, sizeof(body), "%d %s: %.500s\n", status, REASONS(status), reason);
	srv_count(c->srv, status);
	note_refusal(c, status, kind, reason);
	http_date(&date, &dn);
	int hn = snprintf(buf, sizeof(buf),
	                  "HTTP/1.1 %d %s\r\n%.*sContent-Type: text/plain\r\nContent-Length: %d\r\n"
	                  "Connection: close\r\n\r\n%s", status, REASONS(status), (int)dn, date, bn,
	                  body);

	if (hconn_send(c, buf, (size_t)hn, 0) < 0)
		PyErr_Clear();                         /* no memory: the close says enough */
	close_soft(c);
	hconn_flush(c);
}

void hconn_refuse(HttpConn *c, int status, const char *reason)
{
	refuse_as(c, status, refusal_kind(status), reason);
}

/* ---- input: requests ------------------------------------------------------------------------ */

static int set_addr(HttpConn *c, PyObject *env)
{
	PyObject *keys[] = {K_SERVER_NAME, K_SERVER_PORT, K_REMOTE_ADDR, K_REMOTE_PORT};

	/* SERVER_NAME and SERVER_PORT are already set when the target was in
	 * absolute-form: its authority is the request's (RFC 9112 3.2.2) */
	for (int i = 0; i < 2; i++)
		if (!PyDict_SetDefault(env, keys[i], PyTuple_GET_ITEM(c->addr, i)))
			return -1;
	for (int i = 2; i < 4; i++)
		if (PyDict_SetItem(env, keys[i], PyTuple_GET_ITEM(c->addr, i)) < 0)
			return -1;
	return 0;
}

/* A request whose body is all here (or that has none), start to end. */
static int serve_whole(HttpConn *c, PyObject *env)
{
	Parser *p = c->parser;
	PyObject *body, *input;
	int keep;

	if (p->blen == p->bstart)
		input = Py_NewRef(c->srv->no_body);      /* most requests: no BytesIO to make */
	else {
		body = PyBytes_FromStringAndSize(p->body + p->bstart, (Py_ssize_t)(p->blen - p->bstart));
		if (!body)
			return -1;
		p->bstart = p->blen;                  /* the app's, through wsgi.input */
		input = PyObject_CallOneArg(c->srv->bytes_io, body);
		Py_DECREF(body);
	}
	if (!input || PyDict_SetItem(env, K_WSGI_INPUT, input) < 0) {
		Py_XDECREF(input);
		return -1;
	}
	Py_DECREF(input);
	keep = respond(c, env, 1);
	if (keep <= 0 || keep == RESPOND_PARKED)
		return keep;
	return parser_finish(p);
}

/* The rest of the body still to come, or a 100 Continue owed: wsgi.py's
 * slow path streams it (serve_slow(conn, env) -> keep). */
static int serve_streaming(HttpConn *c, PyObject *env)
{
	PyObject *r = PyObject_CallFunctionObjArgs(c->srv->slow, (PyObject *)c, env, NULL);
	int keep;

	if (!r)
		return -1;
	keep = PyObject_IsTrue(r);
	Py_DECREF(r);
	return keep;
}

/* Whether the rest of the current request's body is read here, in the
 * loop, before the app runs: a Content-Length within body_buffer (decided
 * at the head), or a chunked body while what is buffered of it is below
 * body_buffer. Else the slow path streams it. */
static int body_fits(HttpConn *c)
{
	Parser *p = c->parser;
	size_t room = c->srv->body_buffer;
	int64_t length = hp_content_length(&p->hp);

	if (!room)
		return 0;
	if (length >= 0)
		return (uint64_t)length <= room;
	return hp_chunked(&p->hp) && p->blen - p->bstart < room;
}

/* A held request's body progressed by n bytes (framing included, as the
 * slow path counts them): its deadline moves back n / min_body_rate
 * seconds, so a client sending at that rate or faster is never cut, one
 * trickling a byte at a time is (the slow path's rule). */
static void body_progress(HttpConn *c, size_t n)
{
	double rate = c->srv->min_body_rate;
	double due;

	if (c->tkind != TIMER_BODY || rate <= 0)
		return;
	due = c->due + (double)n / rate;
	timer_cancel(c);
	c->tkind = TIMER_BODY;
	c->due = due;
	timer_arm(c, -1);
}

/* Holds env (taken) while the loop reads its body: the body timer starts
 * now, and a client that waits for a 100 Continue is told to send, here
 * and now, as nginx does (RFC 9110 10.1.1: not an HTTP/1.0 client's). */
static void hold(HttpConn *c, PyObject *env)
{
	static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
	Parser *p = c->parser;

	c->held = env;
	timer_arm(c, TIMER_BODY);
	if (p->expect_continue) {
		p->expect_continue = 0;                /* said: the slow path must not say it again */
		if (p->hp.ll.http_minor && hconn_send(c, cont, sizeof(cont) - 1, 0) < 0)
			PyErr_Clear();                     /* no memory: the client sends after its wait */
	}
}

/* Answers every complete request head buffered, in order. 0, or -1 for
 * an error that is not the app's. */
static int serve_ready(HttpConn *c)
{
	Parser *p = c->parser;

	while (!c->closed && !c->closing && !c->serving && !c->parked) {
		int none, keep;
		PyObject *env;

		if (c->held) {
			/* ours again (the body's bytes were just read): whole now,
			 * still coming, or past the buffer */
			env = c->held;
			c->held = NULL;
			if (parser_pump_body(p) < 0) {
				Py_DECREF(env);
				return -1;
			}
		}
		else {
			env = parser_next(p, c->srv->base, &none);
			if (!env) {
				if (none)
					return 0;
				if (!PyErr_ExceptionMatches(HttpError))
					return -1;
				PyErr_Clear();
				hconn_refuse(c, p->hp.status, p->hp.reason ? p->hp.reason : "bad request");
				return 0;
			}
			if (set_addr(c, env) < 0) {
				Py_DECREF(env);
				return -1;
			}
			timer_cancel(c);
			c->head_clock = 0;                 /* this head is whole: the next one's clock */
			/* what already arrived of the body is checked before the app
			 * runs: a framing error there is a 400 and the app never sees it */
			if (parser_pump_body(p) < 0) {
				Py_DECREF(env);
				return -1;
			}
			if (p->hp.state == HP_BODY && body_fits(c)) {
				hold(c, env);
				return 0;
			}
		}
		if (p->hp.state == HP_ERROR) {
			Py_DECREF(env);
			hconn_refuse(c, p->hp.status, p->hp.reason ? p->hp.reason : "bad request");
			return 0;
		}
		if (p->hp.state == HP_BODY && body_fits(c)) {
			c->held = env;                     /* still coming: the body timer runs on */
			return 0;
		}
		timer_cancel(c);                       /* a held one's body timer */
		c->serving = 1;
		keep = p->hp.state == HP_DONE ? serve_whole(c, env) : serve_streaming(c, env);
		c->serving = 0;
		Py_CLEAR(c->response);
		Py_DECREF(env);
		if (keep < 0)
			return -1;
		if (keep == RESPOND_PARKED) {
			/* its rest goes out from the loop (resume): the next request
			 * waits for it */
			if (c->closed && c->parked) {
				Respond *r = c->parked;

				c->parked = NULL;
				respond_abandon(r);
			}
			return 0;
		}
		if (!keep) {
			close_soft(c);
			return 0;
		}
	}
	return 0;
}

/* After requests were served: one write of what is owed, then the timer
 * for what the connection waits for now and its directions. since: the
 * bytes written before a parked body's turn; without progress since then
 * its send timer runs on (NULL: re-armed whatever the write took). */
static void after_serving(HttpConn *c, const unsigned long long *since)
{
	if (c->closed)
		return;
	hconn_flush(c);
	if (c->closed)
		return;
	if (!since || c->wrote != *since || c->tkind != TIMER_SEND)
		rearm(c);
	sync_dirs(c);
}

/* The parked body's turn (a POLLOUT): more of it, and once it ended, the
 * requests that waited behind it. 0, or -1 for an error that is not the
 * app's. */
static int resume(HttpConn *c)
{
	unsigned long long wrote = c->wrote;
	int keep;

	c->serving = 1;                            /* the app's code may run (next, close) */
	keep = respond_resume(c);
	c->serving = 0;
	if (keep < 0)
		return -1;
	if (c->closed && c->parked) {
		Respond *r = c->parked;                /* closed under it while it ran */

		c->parked = NULL;
		respond_abandon(r);
		return 0;
	}
	if (!c->closed && keep != RESPOND_PARKED) {
		if (keep)
			keep = parser_finish(c->parser);
		if (!keep || c->closing)
			close_soft(c);
		else if (serve_ready(c) < 0)
			return -1;
	}
	after_serving(c, &wrote);
	return 0;
}

/* The requests a read completed, answered; one write of what they said. */
static int serve_read(HttpConn *c)
{
	if (serve_ready(c) < 0)
		return -1;
	after_serving(c, NULL);
	return 0;
}

/* One read into the parser: > 0 bytes read, 0 nothing to do now (EAGAIN;
 * or the connection failed, closed then), -2 end of input (EOF), -1 a
 * Python error. *filled: the read took all the room it was given. */
static ssize_t read_some(HttpConn *c, int *filled)
{
	Parser *p = c->parser;
	ssize_t n;
	size_t room;

	*filled = 0;
	if (buf_reserve(&p->pending, &p->start, &p->len, &p->cap, READ_ROOM) < 0)
		return -1;
	room = p->cap - p->len;
	n = read(c->fd, p->pending + p->len, room);
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
	if (n == 0)
		return -2;
	p->len += (size_t)n;
	if (c->held)
		body_progress(c, (size_t)n);
	*filled = (size_t)n == room;
	return n;
}

/* One read, the requests it completes, one write. A shared connection
 * (dispatch.c) is polled edge-triggered: after a read that filled its
 * room, bytes may wait that no new report will announce, so it reads
 * again while it may. */
static int read_and_serve(HttpConn *c)
{
	int filled;

	do {
		ssize_t n = read_some(c, &filled);

		if (n == -1)
			return -1;
		if (n == -2) {
			c->peer_eof = 1;
			close_soft(c);                 /* EOF: what is owed goes out first */
			return 0;
		}
		if (n == 0 || serve_read(c) < 0)
			return n == 0 ? 0 : -1;
	} while (filled && c->srv->dispatch && !c->closed && reading(c));
	return 0;
}

int hconn_read_first(HttpConn *c)
{
	int filled;
	ssize_t n = read_some(c, &filled);

	if (n == -1)
		return -1;
	if (n == -2)
		c->peer_eof = 1;
	else if (filled)
		c->missed |= FDC_POLL_IN;          /* more may wait: read as a report */
	return n != 0;
}

int hconn_serve_first(HttpConn *c)
{
	if (c->closed)
		return 0;
	if (c->peer_eof) {
		close_soft(c);
		return 0;
	}
	return serve_read(c);
}

int hconn_on_events(HttpConn *c, uint32_t events)
{
	c->last_active = mono_now();
	if (events & EV_FIRST)
		return hconn_serve_first(c);
	if (events & FDC_POLL_ERR) {             /* with POLL_CTL: not registered */
		fail(c);
		return 0;
	}
	if ((events & FDC_POLL_OUT) && hconn_pending(c))
		hconn_flush(c);
	if (c->parked && !c->closed && (events & FDC_POLL_OUT)) {
		unsigned long long before;
		int rc;

		/* edge-triggered (a shared connection, dispatch.c): a POLLOUT
		 * comes again only after the kernel was full; a resume whose
		 * writes it all took must go on while it makes progress */
		do {
			before = c->wrote;
			rc = resume(c);
		} while (rc == 0 && c->srv->dispatch && c->parked && !c->closed &&
		         !hconn_pending(c) && c->wrote != before);
		return rc;
	}
	if (c->lingering) {
		if (!c->closed && (events & (FDC_POLL_IN | FDC_POLL_HUP | FDC_POLL_RDHUP)))
			discard(c);
		return 0;
	}
	if ((events & (FDC_POLL_IN | FDC_POLL_HUP | FDC_POLL_RDHUP)) && !c->closed && reading(c))
		return read_and_serve(c);
	return 0;
}

int hconn_on_timeout(HttpConn *c, int kind)
{
	if (c->closed || c->serving)
		return 0;
	if (kind == TIMER_BODY && c->held) {
		Py_CLEAR(c->held);
		refuse_as(c, 408, REFUSAL_BODY_TIMEOUT, "the request body did not arrive in time");
		return 0;
	}
	if (c->lingering || kind == TIMER_SEND || kind == TIMER_LINGER) {
		/* lingering: it had its time to read the answer; send: it took
		 * nothing of its output for body_timeout (and a soft close would
		 * wait for that output forever) */
		fail(c);
		return 0;
	}
	if (parser_head_started(c->parser))
		hconn_refuse(c, 408, "the request head did not arrive in time");
	else
		close_soft(c);                         /* idle keep-alive: nothing to say */
	return 0;
}

/* ---- the Python side -------------------------------------------------------------------------- */

static void HttpConn_dealloc(HttpConn *c)
{
	PyMem_Free(c->out);
	Py_XDECREF(c->parser);
	Py_XDECREF(c->th);
	Py_XDECREF(c->addr);
	Py_XDECREF(c->peer);
	Py_XDECREF(c->local);
	Py_XDECREF(c->response);
	Py_XDECREF(c->parked);
	Py_XDECREF(c->held);
	Py_XDECREF(c->srv);
	PyObject_Free(c);
}

/* From a thread that is not a loop thread: run it on the owner's. */
static PyObject *post(HttpConn *c, const char *method, PyObject *arg)
{
	PyObject *fn = PyObject_GetAttrString((PyObject *)c, method), *r;

	if (!fn)
		return NULL;
	r = PyObject_CallFunctionObjArgs(c->srv->post, (PyObject *)c, fn, arg, NULL);
	Py_DECREF(fn);
	return r;
}

static PyObject *HttpConn_write(HttpConn *c, PyObject *data)
{
	Py_buffer b;

	if (c->closed || c->closing)
		Py_RETURN_NONE;
	/* From a thread that is not a loop thread: while c is serving, its
	 * owner is inside the app and this thread is the app's (ctx()), so
	 * the bytes go out now, as the WSGI write() of such a thread does;
	 * posted to the owner, the slow path's 100 Continue for a body read by
	 * a thread the owner waits for never went out (review). Else posted. */
	if (srv_current(c->srv) < 0 && !c->serving) {
		PyObject *copy = PyBytes_FromObject(data), *r;
		if (!copy)
			return NULL;
		r = post(c, "write", copy);
		Py_DECREF(copy);
		return r;
	}
	if (PyObject_GetBuffer(data, &b, PyBUF_SIMPLE) < 0)
		return NULL;
	int rc = hconn_send(c, b.buf, (size_t)b.len, 1);
	PyBuffer_Release(&b);
	if (rc < 0)
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *HttpConn_close(HttpConn *c, PyObject *noarg)
{
	(void)noarg;
	if (c->closed)
		Py_RETURN_NONE;
	if (srv_current(c->srv) < 0)
		return post(c, "close", NULL);
	close_soft(c);
	Py_RETURN_NONE;
}

static PyObject *HttpConn_close_now(HttpConn *c, PyObject *noarg)
{
	(void)noarg;
	if (hconn_close_now(c) < 0)
		return NULL;
	Py_RETURN_NONE;
}

PyDoc_STRVAR(flush_now_doc,
"flush_now(timeout, below=0): sends buffered output until at most `below`\n"
"bytes wait, waiting for the socket (the caller's thread is the\n"
"connection's while the app runs). Raises ClientGone if the client went\n"
"away or did not read for timeout seconds.");

static PyObject *HttpConn_flush_now(HttpConn *c, PyObject *args)
{
	double timeout;
	Py_ssize_t below = 0;

	if (!PyArg_ParseTuple(args, "d|n:flush_now", &timeout, &below))
		return NULL;
	if (hconn_flush_wait(c, timeout, (size_t)(below < 0 ? 0 : below)) < 0)
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *HttpConn_flush(HttpConn *c, PyObject *noarg)
{
	(void)noarg;
	hconn_flush(c);
	Py_RETURN_NONE;
}

PyDoc_STRVAR(adopted_by_doc,
"adopted_by(th): th took the connection over (fdcore takeover, recv\n"
"stopped): it owns it from now on, timer included. Work was waiting on\n"
"it: that is activity (a drain must not take it for idle).");

static PyObject *HttpConn_adopted_by(HttpConn *c, PyObject *th)
{
	Server *s = c->srv;
	int pos = -1;

	for (int i = 0; i < s->nthreads; i++)
		if (s->thr[i].obj == th)
			pos = i;
	if (pos < 0) {
		PyErr_SetString(PyExc_ValueError, "not one of this loop's threads");
		return NULL;
	}
	int kind = c->tkind;
	double due = c->due;
	timer_cancel(c);
	c->pos = pos;
	Py_SETREF(c->th, Py_NewRef(th));
	c->last_active = mono_now();
	c->want_send = 0;            /* the core keeps a wanted send: re-say it */
	c->recv_on = 0;              /* ... and stopped recv */
	if (kind >= 0) {
		c->tkind = kind;
		c->due = due;
		timer_arm(c, -1);        /* same deadline, the new owner's list */
	}
	sync_dirs(c);
	Py_RETURN_NONE;
}

PyDoc_STRVAR(respond_doc,
"respond(env) -> bool: runs the app for env (wsgi.input set by the caller)\n"
"and frames its response; False if the connection must close.");

static PyObject *HttpConn_respond(HttpConn *c, PyObject *env)
{
	int keep;

	if (!PyDict_Check(env)) {
		PyErr_SetString(PyExc_TypeError, "env must be a dict");
		return NULL;
	}
	/* the slow path's: it reads the rest of the request body after, so
	 * the response ends here (past HIGH_WATER it waits for the client) */
	keep = respond(c, env, 0);
	if (keep < 0)
		return NULL;
	return PyBool_FromLong(keep);
}

static PyObject *HttpConn_refuse(HttpConn *c, PyObject *args)
{
	int status;
	const char *reason;

	if (!PyArg_ParseTuple(args, "is:refuse", &status, &reason))
		return NULL;
	hconn_refuse(c, status, reason);
	Py_RETURN_NONE;
}

static PyMethodDef HttpConn_methods[] = {
	{"write", (PyCFunction)HttpConn_write, METH_O, "write(data): sends, buffering the rest."},
	{"close", (PyCFunction)HttpConn_close, METH_NOARGS, "Closes once the output is sent."},
	{"_close_now", (PyCFunction)HttpConn_close_now, METH_NOARGS, "Closes at once."},
	{"flush_now", (PyCFunction)HttpConn_flush_now, METH_VARARGS, flush_now_doc},
	{"flush", (PyCFunction)HttpConn_flush, METH_NOARGS,
	 "flush(): one write of the buffered output, what the kernel takes (no wait)."},
	{"adopted_by", (PyCFunction)HttpConn_adopted_by, METH_O, adopted_by_doc},
	{"respond", (PyCFunction)HttpConn_respond, METH_O, respond_doc},
	{"refuse", (PyCFunction)HttpConn_refuse, METH_VARARGS,
	 "refuse(status, reason): answers the error and closes."},
	{NULL},
};

static PyObject *get_pending(HttpConn *c, void *x)
{
	(void)x;
	return PyLong_FromSize_t(hconn_pending(c) + (c->parked ? respond_owed(c->parked) : 0));
}

static PyObject *get_closed(HttpConn *c, void *x)
{
	(void)x;
	return PyBool_FromLong(c->closed);
}

static PyObject *get_loop(HttpConn *c, void *x)
{
	(void)x;
	return Py_NewRef(c->srv->loop);
}

static PyObject *get_last_active(HttpConn *c, void *x)
{
	(void)x;
	return PyFloat_FromDouble(c->last_active);
}

static int set_last_active(HttpConn *c, PyObject *v, void *x)
{
	double d = v ? PyFloat_AsDouble(v) : -1.0;

	(void)x;
	if (!v || (d == -1.0 && PyErr_Occurred()))
		return -1;
	c->last_active = d;
	return 0;
}

static PyObject *get_response(HttpConn *c, void *x)
{
	(void)x;
	return Py_NewRef(c->response ? c->response : Py_None);
}

static PyObject *get_buffering(HttpConn *c, void *x)
{
	(void)x;
	return PyBool_FromLong(c->held != NULL);
}

static PyGetSetDef HttpConn_getset[] = {
	{"buffering", (getter)get_buffering, NULL,
	 "a request's body is being read before its app runs (not idle)", NULL},
	{"pending", (getter)get_pending, NULL,
	 "bytes written and not yet sent, with a parked body's rest (1 for an iterator's)", NULL},
	{"closed", (getter)get_closed, NULL, "closed (or failed)", NULL},
	{"loop", (getter)get_loop, NULL, "the worker's loop", NULL},
	{"last_active", (getter)get_last_active, (setter)set_last_active,
	 "monotonic time of the last event (the drain's idle grace)", NULL},
	{"response", (getter)get_response, NULL, "the Respond of the request being served", NULL},
	{NULL},
};

static PyMemberDef HttpConn_members[] = {
	{"fd", T_INT, offsetof(HttpConn, fd), READONLY, "the connection's fd"},
	{"cookie", T_ULONGLONG, offsetof(HttpConn, cookie), READONLY, "its owner cookie in the table"},
	{"th", T_OBJECT, offsetof(HttpConn, th), READONLY, "the owner loop thread's fdcore.Thread"},
	{"parser", T_OBJECT, offsetof(HttpConn, parser), READONLY, "its RequestParser"},
	{"peer", T_OBJECT, offsetof(HttpConn, peer), READONLY, "the client's address"},
	{"local", T_OBJECT, offsetof(HttpConn, local), READONLY, "our address"},
	{NULL},
};

PyTypeObject HttpConnType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "sockherd.worker._http.HttpConn",
	.tp_doc = "One HTTP/1.1 connection of the native engine.",
	.tp_basicsize = sizeof(HttpConn),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_dealloc = (destructor)HttpConn_dealloc,
	.tp_methods = HttpConn_methods,
	.tp_getset = HttpConn_getset,
	.tp_members = HttpConn_members,
};
