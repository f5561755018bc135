/* The HTTP/1 codec's side of one connection: bytes in, requests answered
 * in order (pipelining), refusals, the header, keep-alive and body timers.
 *
 * The connection layer calls in through struct conn_ops (the h1_* entries,
 * conn.h): on a readable fd, one read, every complete request head
 * answered, their responses gathered and sent with one write. A request
 * whose body has fully arrived (or that has none) is served here, start to
 * end. One whose body is still coming is held (c->held) while the loop
 * reads its body, as nginx's client_body_buffer_size: the app runs once
 * the body is whole, and meanwhile no thread waits on the client, so a
 * slow upload costs its thread nothing. A body larger than body_buffer (a
 * chunked one once that much of it is here) goes to the adapter's
 * streaming path (wsgi.py's slow path), which streams wsgi.input from the
 * socket: it is never held whole in memory. A response body larger than
 * the output buffer is parked on the connection (c->parked, the
 * adapter's) and goes out on its POLLOUT events (h1_resume): meanwhile
 * the connection reads nothing and its next request waits.
 *
 * This file: reads, the requests they complete, the body held before the
 * app, 100 Continue, a parked body's turn. The timers (header,
 * keep-alive, body) and the refusals: h1_timers.c, h1_conn_int.h between
 * the two.
 *
 * May call: h1_timers.c, h1_parser.c, h1_response.c (the Date line), the
 * connection layer (conn_io.c, conn_timers.c); the adapter only through
 * struct app_ops (c->srv->app_ops).
 */
#include <string.h>

#include "h1.h"
#include "conn_tls.h"
#include "h1_conn_int.h"

#define READ_ROOM (16u << 10)        /* free room a read gets at least */

/* ---- input: requests ------------------------------------------------------------------------ */

/* A parked response's end, by the adapter that parked it (r's reference
 * passed). */
static void abandon(struct conn *c, Respond *r)
{
	const struct app_ops *app = c->srv->app_ops;

	if (app->abandon)
		app->abandon(r);
	else
		Py_DECREF((PyObject *)r);
}

/* Whether the rest of the current request's body is read here, in the
 * loop, before the app runs: a Content-Length within body_buffer (decided
 * at the head), or a chunked body while what is buffered of it is below
 * body_buffer. Else the slow path streams it. */
static int body_fits(struct conn *c)
{
	Parser *p = c->parser;
	size_t room = c->srv->body_buffer;
	int64_t length = hp_content_length(p->hp);

	if (!room)
		return 0;
	if (length >= 0)
		return (uint64_t)length <= room;
	return hp_chunked(p->hp) && p->blen - p->bstart < room;
}

/* Holds env (taken) while the loop reads its body: the body timer starts
 * now, and a client that waits for a 100 Continue is told to send, here
 * and now, as nginx does (RFC 9110 10.1.1: not an HTTP/1.0 client's). */
static void hold(struct conn *c, PyObject *env)
{
	static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
	Parser *p = c->parser;

	c->held = env;
	timer_arm(c, TIMER_BODY);
	if (p->expect_continue) {
		p->expect_continue = 0;                /* said: the slow path must not say it again */
		if (p->hp->ll.http_minor && conn_send(c, cont, sizeof(cont) - 1, 0) < 0)
			PyErr_Clear();                     /* no memory: the client sends after its wait */
	}
}

/* Answers every complete request head buffered, in order. 0, or -1 for
 * an error that is not the app's. */
static int serve_ready(struct conn *c)
{
	Parser *p = c->parser;

	while (!c->closed && !c->closing && !c->serving && !c->parked && !c->call) {
		int keep, whole;
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
			int rc = parser_head(p);

			if (rc <= 0) {
				if (rc == 0)
					return 0;
				if (!PyErr_ExceptionMatches(HttpError))
					return -1;
				PyErr_Clear();
				conn_refuse(c, p->hp->status, p->hp->reason ? p->hp->reason : "bad request");
				return 0;
			}
			/* the adapter's request object (an environ, with the addresses) */
			env = c->srv->app_ops->request(c);
			if (!env)
				return -1;
			timer_cancel(c);
			c->head_clock = 0;                 /* this head is whole: the next one's clock */
			/* what already arrived of the body is checked before the app
			 * runs: a framing error there is a 400 and the app never sees it */
			if (parser_pump_body(p) < 0) {
				Py_DECREF(env);
				return -1;
			}
			if (p->hp->state == HP_BODY && body_fits(c)) {
				hold(c, env);
				return 0;
			}
		}
		if (p->hp->state == HP_ERROR) {
			Py_DECREF(env);
			conn_refuse(c, p->hp->status, p->hp->reason ? p->hp->reason : "bad request");
			return 0;
		}
		if (p->hp->state == HP_BODY && body_fits(c)) {
			c->held = env;                     /* still coming: the body timer runs on */
			return 0;
		}
		/* whole: its body is all here (or it has none), served start to
		 * end; else the adapter streams the rest of it */
		whole = p->hp->state == HP_DONE;
		/* Streamed: WSGI's slow path waits on this client inside the turn,
		 * for as long as its upload takes (up to body_timeout). The
		 * answers the thread owes (other clients', whole) go first: they
		 * waited for a stranger's upload (review: tests/worker/
		 * test_owed_answers_wsgi.py). Before the timer_cancel: c may be
		 * one of them, and its after_serving re-arms its timer. */
		if (!whole && c->srv->thr[c->pos].owed)
			(void)h1_owed_run(c->srv, c->pos);     /* a close is seen by the turn's end */
		timer_cancel(c);                       /* a held one's body timer */
		c->serving = 1;
		keep = c->srv->app_ops->serve(c, env, whole);
		if (whole && keep > 0 && keep != RESPOND_PARKED)
			keep = parser_finish(p);
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
				abandon(c, r);
			}
			return 0;
		}
		if (!keep) {
			conn_close_soft(c);
			return 0;
		}
	}
	return 0;
}

/* After requests were served: one write of what is owed, then the timer
 * for what the connection waits for now and its directions. since: the
 * bytes written before a parked body's turn; without progress since then
 * its send timer runs on (NULL: re-armed whatever the write took). */
static void after_serving(struct conn *c, const unsigned long long *since)
{
	if (c->closed)
		return;
	conn_flush(c);
	if (c->closed)
		return;
	if (!since || c->wrote != *since || c->tkind != TIMER_SEND)
		h1_rearm(c);
	conn_sync(c);
}

/* The parked body's turn (a POLLOUT): more of it, and once it ended, the
 * requests that waited behind it. 0, or -1 for an error that is not the
 * app's. */
int h1_resume(struct conn *c)
{
	unsigned long long wrote = c->wrote;
	int keep;

	c->serving = 1;                            /* the app's code may run (next, close) */
	keep = c->srv->app_ops->resume(c);
	c->serving = 0;
	if (keep < 0)
		return -1;
	if (c->closed && c->parked) {
		Respond *r = c->parked;                /* closed under it while it ran */

		c->parked = NULL;
		abandon(c, r);
		return 0;
	}
	if (!c->closed && keep != RESPOND_PARKED) {
		if (keep)
			keep = parser_finish(c->parser);
		if (!keep || c->closing)
			conn_close_soft(c);
		else if (serve_ready(c) < 0)
			return -1;
	}
	after_serving(c, &wrote);
	return 0;
}

/* ---- a turn's answers, written together ------------------------------------------------
 *
 * Answers end one request after another: WSGI ones in the turn's events,
 * ASGI ones in their tasks' steps, in the asyncio loop's ready pass.
 * Written each at its end, every write wakes the client (or the proxy in
 * front) once per answer, and the loop thread is preempted by it as
 * often. Queued on the thread's list instead and written together (at the
 * turn's end, and before its next poll), they reach the other side as one
 * burst: the same writes, far fewer wake-ups. Measured (bench/RESULTS.md,
 * 2026-11-26, "a turn's answers written together"): per FastAPI request
 * the workers' system time 16 -> 7 us and the client's 7.3 -> 5.6 us.
 *
 * Only under load, and never long: an answer is queued only if the
 * thread's previous answer ended less than OWED_MAX before it (answers
 * coming fast; after a pause, or from a slow app, it goes at once), and
 * while the list is younger than OWED_MAX (older: written with this one).
 * The loop turns at least every 16 iterations or 1 ms while callbacks are
 * ready (worker/aio.py: _TURN_EVERY, _TURN_AFTER). What stays: an answer
 * queued just before a slow app call waits for that call (measured: all of
 * it, tests/asgi/test_owed_answers.py); not for the slow path's wait on a
 * large upload's client, which serve_ready precedes with the list's write.
 * Only a thread alone with its connections queues (dispatch: a sibling may
 * serve one of them next). */
#define OWED_MAX 0.0005                         /* seconds */

/* c's answer queued on its thread's list: 1, or 0 to write it now (as
 * every answer was written before; the list, if any, went first). */
static int owe(struct conn *c)
{
	Server *s = c->srv;
	struct srv_thread *t = &s->thr[c->pos];
	double now, last;

	if (c->closed || s->dispatch || !conn_pending(c))
		return 0;
	now = mono_now();
	last = t->owed_last;
	t->owed_last = now;
	if (now - last > OWED_MAX || (t->owed && now - t->owed_since > OWED_MAX)) {
		if (t->owed)
			(void)h1_owed_run(s, c->pos);      /* a close is seen by the next turn */
		return 0;
	}
	if (c->owed_queued)
		return 1;
	if (!t->owed)
		t->owed_since = now;
	c->owed_queued = 1;
	c->owed_next = t->owed;
	t->owed = (struct conn *)Py_NewRef(c);
	return 1;
}

/* The requests a read completed, answered; one write of what they said. */
static int serve_read(struct conn *c)
{
	if (serve_ready(c) < 0)
		return -1;
	if (owe(c))
		return 0;
	after_serving(c, NULL);
	return 0;
}

/* Input while a call runs: its body moved through the body parser, the
 * adapter told (its receive may wait for it), and reading stops while
 * more than CALL_INPUT_MAX waits unread (a client pipelining ahead of a
 * slow app, an upload the app does not read). */
static int call_input(struct conn *c)
{
	if (parser_pump_body(c->parser) < 0)
		return -1;
	h1_input_room(c);
	return c->srv->app_ops->input ? c->srv->app_ops->input(c) : 0;
}

void h1_input_room(struct conn *c)
{
	Parser *p = c->parser;
	int full = c->call && (p->len - p->start) + (p->blen - p->bstart) > CALL_INPUT_MAX;

	if (full != c->in_full) {
		c->in_full = (unsigned)full;
		conn_sync(c);
	}
}

void h1_call_detached(struct conn *c)
{
	Parser *p = c->parser;

	c->in_full = 0;
	p->body_due = 0;                           /* the next request's body has its own */
	p->body_wait = p->body_late = 0;
}

int h1_owed_run(Server *s, int pos)
{
	struct srv_thread *t = &s->thr[pos];
	struct conn *c, *next = t->owed;
	int closed = 0;

	t->owed = NULL;
	while ((c = next)) {
		next = c->owed_next;
		if (c->pos != pos) {
			/* adopted by a sibling since it was queued (adopted_by):
			 * never so today (queuing needs no dispatch; relief needs
			 * dispatch for WSGI and is off for ASGI). Not written here,
			 * in the wrong thread's context: adopted_by synced its
			 * directions, so what it holds is a POLLOUT of its new
			 * owner's. Were relief ever to move queued connections,
			 * adopted_by would have to unlink it first: meanwhile the new
			 * owner's owe() takes it for queued (owed_queued). */
			c->owed_next = NULL;
			c->owed_queued = 0;
			Py_DECREF(c);
			continue;
		}
		c->owed_next = NULL;
		c->owed_queued = 0;
		after_serving(c, NULL);
		closed |= c->closed;
		Py_DECREF(c);
	}
	return closed;
}

void h1_owed_free(Server *s)
{
	for (int i = 0; s->thr && i < s->nthreads; i++)
		while (s->thr[i].owed) {
			struct conn *c = s->thr[i].owed;

			s->thr[i].owed = c->owed_next;
			c->owed_next = NULL;
			c->owed_queued = 0;
			Py_DECREF(c);
		}
}

int h1_call_done(struct conn *c, int keep)
{
	if (c->closed)
		return 0;
	h1_call_detached(c);
	if (keep)
		keep = parser_finish(c->parser);       /* 0 if the app left body unread */
	if (!keep || c->closing)
		conn_close_soft(c);
	else if (serve_ready(c) < 0)
		return -1;
	if (owe(c))
		return 0;
	after_serving(c, NULL);
	return 0;
}

/* One read into the parser: > 0 bytes read, 0 nothing to do now (EAGAIN;
 * or the connection failed, closed then), -2 end of input (EOF), -1 a
 * Python error. *filled: the read took all the room it was given. */
static ssize_t read_some(struct conn *c, int *filled)
{
	Parser *p = c->parser;
	ssize_t n;
	size_t room;

	*filled = 0;
	if (buf_reserve(&p->pending, &p->start, &p->len, &p->cap, READ_ROOM) < 0)
		return -1;
	room = p->cap - p->len;
	if (c->call) {
		/* a call runs: what it may leave unread is bounded (h1_input_room),
		 * so one read takes at most what is left of the bound */
		size_t buffered = (p->len - p->start) + (p->blen - p->bstart);
		size_t left = buffered < CALL_INPUT_MAX ? CALL_INPUT_MAX - buffered : 0;

		if (room > left)
			room = left > READ_ROOM ? left : READ_ROOM;
	}
	n = conn_read(c, p->pending + p->len, room);
	if (n <= 0)
		return n;
	p->len += (size_t)n;
	if (c->held)
		body_progress(c, (size_t)n);
	else if (c->call)
		call_body_progress(c, (size_t)n);
	*filled = (size_t)n == room;
	return n;
}

/* The PROXY protocol header ahead of the first request, through the
 * connection layer's step (conn_proxy.c) on the buffered bytes: its bytes
 * leave the buffer, what follows them stays for the requests. 1: go on to
 * the requests, 0: not now (the header is not whole, or c closed over a
 * bad one), -1 a Python error. eof: no byte will follow. */
static int proxy_step(struct conn *c, int eof)
{
	Parser *p = c->parser;
	ssize_t used;

	if (!c->proxy_wait)
		return 1;
	used = conn_proxy_read(c, p->pending + p->start, p->len - p->start, eof);
	if (used < 0)
		return -1;
	p->start += (size_t)used;
	if (c->proxy_wait || c->closed)
		return 0;
	/* nothing after the header yet: the header timer armed at accept runs
	 * on for the head (serving nothing would arm keep-alive's) */
	return p->len > p->start || eof;
}

/* One read, the requests it completes, one write. A shared connection
 * (dispatch.c) is polled edge-triggered: after a read that filled its
 * room, bytes may wait that no new report will announce, so it reads
 * again while it may. */
int h1_readable(struct conn *c)
{
	int filled;

	do {
		ssize_t n = read_some(c, &filled);

		if (n == -1)
			return -1;
		if (n != 0 && c->proxy_wait) {
			int go = proxy_step(c, n == -2);

			if (go <= 0) {
				if (go == 0 && n == -2 && !c->closed)
					conn_close_soft(c);       /* EOF before a header: nothing to serve */
				return go;
			}
		}
		if (n == -2) {
			c->peer_eof = 1;
			if (c->call && call_input(c) < 0)  /* its app learns of the end */
				return -1;
			conn_close_soft(c);           /* EOF: what is owed goes out first */
			return 0;
		}
		if (n > 0 && c->call && call_input(c) < 0)
			return -1;
		if (n == 0 || serve_read(c) < 0)
			return n == 0 ? 0 : -1;
	/* TLS: the session may hold what the room did not take, which no
	 * report announces (conn_tls.c) */
	} while (filled && (c->srv->dispatch || tls_buffered(c)) && !c->closed && conn_reading(c));
	return 0;
}

int h1_read_first(struct conn *c)
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

int h1_serve_first(struct conn *c)
{
	if (c->closed)
		return 0;
	if (c->proxy_wait) {
		int go = proxy_step(c, c->peer_eof);

		if (go <= 0) {
			if (go == 0 && c->peer_eof && !c->closed)
				conn_close_soft(c);
			return go;
		}
	}
	if (c->peer_eof) {
		conn_close_soft(c);
		return 0;
	}
	return serve_read(c);
}

/* Whether the client may still be sending, as far as the parser knows: an
 * upload not read whole, a request (part of one) buffered. */
int h1_unread(struct conn *c)
{
	Parser *p = c->parser;
	const struct app_ops *app = c->srv->app_ops;

	if (c->call && app->lingers && app->lingers(c))
		return 1;
	return p->hp->state == HP_BODY || p->len > p->start;
}

/* struct conn_ops's owed: what the adapter's parked response owes. */
size_t h1_owed(struct conn *c)
{
	const struct app_ops *app = c->srv->app_ops;

	return app->owed ? app->owed(c) : 0;
}


/* struct conn_ops's closed: c closed under what the adapter held of it
 * (each reference passed): the parked response ends, the call learns its
 * client is gone. */
void h1_closed(struct conn *c, Respond *parked, PyObject *call)
{
	const struct app_ops *app = c->srv->app_ops;

	if (parked)
		abandon(c, parked);   /* close() (once), the access log, the counts; holds c */
	if (call) {
		if (app->drop)
			app->drop(c, call);   /* the app's receive says disconnect; holds c */
		else
			Py_DECREF(call);
	}
}

/* A new connection's parser, with the Server's limits. */
int h1_open(struct conn *c)
{
	c->parser = parser_new(&c->srv->lim, c->srv->script_name);
	return c->parser ? 0 : -1;
}
