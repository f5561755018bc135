/* The native engine of the wsgi interface: one Server per worker, whose
 * turn() is one loop turn of one loop thread, in one C call:
 *
 *   update pass + epoll_wait (fdcore's fdc_poll; the GIL is released only
 *   when the wait may block: a first call with timeout 0 under the GIL,
 *   a second, blocking one without it only if the first found nothing)
 *   -> each connection's report handled here (hconn.c: read, parse,
 *   environ, the app, framing, write), each fd left after its handler
 *   -> the connection timers that are due.
 *
 * Reports that are not a connection's (listeners) go back to the Python
 * loop (worker/loop.py), which keeps what is policy: accepting (through
 * Server.accept, which takes and registers a batch in one call), the gate,
 * the drain, the relief. fdcore is the cffi module's, called through the
 * function pointers the table hands over (struct fdc_api): one
 * implementation, without cffi's GIL release around each call.
 *
 * Timers: the header timeout, the keep-alive timeout and the lingering
 * close (hconn.c), each one fixed duration, so a FIFO list per loop thread and kind is sorted by deadline
 * by construction (arm = append): arming, cancelling and finding the next
 * deadline are O(1). Only a takeover inserts out of order (into the new
 * owner's list, walking from the tail). The lists are the GIL's: every
 * change happens in C with the GIL held, with no Python call between.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http.h"

static _Thread_local Server *tls_srv;
static _Thread_local int tls_pos = -1;

int srv_current(Server *s)
{
	return tls_srv == s ? tls_pos : -1;
}

double mono_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- containment ------------------------------------------------------------------------------- */

/* An error out of a connection's handler (an event's or a timer's) that
 * is not the app's (those are answered in respond.c): ours, or no memory.
 * Logged, and that connection closes; the loop thread serves on: a loop
 * thread never ends while its worker serves (DESIGN §5, issue 18 §1). */
void contain(HttpConn *c)
{
	report_exc(c->srv, NULL, "a connection's handler");
	if (!c->closed && hconn_close_now(c) < 0)
		report_exc(c->srv, NULL, "closing a failed connection");
}

/* ---- timers ------------------------------------------------------------------------------------ */

static struct timer_list *list_of(HttpConn *c)
{
	return &c->srv->thr[c->tpos].timers[c->tkind];
}

void timer_cancel(HttpConn *c)
{
	struct timer_list *l;

	if (c->tkind < 0)
		return;
	l = list_of(c);
	if (c->tprev)
		c->tprev->tnext = c->tnext;
	else
		l->head = c->tnext;
	if (c->tnext)
		c->tnext->tprev = c->tprev;
	else
		l->tail = c->tprev;
	c->tprev = c->tnext = NULL;
	c->tkind = -1;
}

/* kind >= 0: a new deadline from now. kind -1: c->tkind and c->due are
 * set already (a takeover): into the owner's list at its place. */
void timer_arm(HttpConn *c, int kind)
{
	Server *s = c->srv;
	struct timer_list *l;
	HttpConn *after;

	if (kind >= 0) {
		double dur = kind == TIMER_HEADER ? s->header_timeout
		             : kind == TIMER_KEEPALIVE ? s->keepalive_timeout
		             : kind == TIMER_LINGER ? LINGER_SECONDS : s->body_timeout;

		timer_cancel(c);
		if (dur <= 0)
			return;                          /* 0: no timeout of that kind */
		c->tkind = kind;
		c->due = mono_now() + dur;
	}
	c->tpos = c->pos;
	l = list_of(c);
	after = l->tail;
	while (after && after->due > c->due)
		after = after->tprev;
	c->tprev = after;
	c->tnext = after ? after->tnext : l->head;
	if (c->tnext)
		c->tnext->tprev = c;
	else
		l->tail = c;
	if (after)
		after->tnext = c;
	else
		l->head = c;
}

/* ms until the thread's next deadline, or -1 */
static int timers_timeout(struct srv_thread *t, double now)
{
	double next = -1;

	for (int k = 0; k < TIMER_KINDS; k++) {
		HttpConn *h = t->timers[k].head;
		if (h && (next < 0 || h->due < next))
			next = h->due;
	}
	if (next < 0)
		return -1;
	return next <= now ? 0 : (int)((next - now) * 1000) + 1;
}

static int fire_timers(Server *s, int pos)
{
	struct srv_thread *t = &s->thr[pos];
	double now = mono_now();
	HttpConn *due[64];
	int kinds[64];
	double dues[64];
	int n = 0;

	for (int k = 0; k < TIMER_KINDS; k++) {
		HttpConn *h;

		while (n < 64 && (h = t->timers[k].head) && h->due <= now) {
			kinds[n] = k;
			dues[n] = h->due;
			timer_cancel(h);
			due[n++] = (HttpConn *)Py_NewRef(h);
		}
	}
	for (int i = 0; i < n; i++) {
		HttpConn *c = due[i];
		uint32_t gen;
		int fired = 0;

		/* the handler runs under the running bit, as for an event */
		if (!c->closed && (s->dispatch || c->pos == pos) &&
		    s->api.enter(t->th, c->fd, &gen) == FDC_DONE) {
			if (!c->closed && (s->dispatch || c->pos == pos)) {
				if ((s->dispatch ? dispatch_run(c, pos, 0, kinds[i])
				                 : hconn_on_timeout(c, kinds[i])) < 0)
					contain(c);
				fired = 1;
			}
			s->api.leave(t->th, c->fd, gen);
		}
		if (!fired && !c->closed && c->tkind < 0) {
			/* taken over while an earlier one of this batch ran (its
			 * Python may let the GIL go): the new owner fires it */
			c->tkind = kinds[i];
			c->due = dues[i];
			timer_arm(c, -1);
		}
		Py_DECREF(c);
	}
	return 0;
}

/* ---- the turn ------------------------------------------------------------------------------------ */

static int stamp(Server *s, int pos, double when)
{
	PyObject *f;

	if (s->busy == Py_None)
		return 0;
	f = PyFloat_FromDouble(when);
	return f ? PyList_SetItem(s->busy, pos, f) : -1;
}

static PyObject *event_obj(Server *s, const struct fdc_event *ev)
{
	return PyObject_CallFunction(s->event_type, "iIIIK", ev->fd, ev->events, ev->gen, ev->kind,
	                             (unsigned long long)ev->owner);
}

PyDoc_STRVAR(turn_doc,
"turn(pos, timeout_ms, relieved) -> (handled, others)\n\n"
"One loop turn of loop thread pos: poll (waiting up to timeout_ms, or the\n"
"next connection timer), handle every connection's report, fire the due\n"
"timers. others: the reports that are not a connection's (listeners), as\n"
"Event tuples, for the Python loop: still held (to leave one by one) unless\n"
"relieved, where the whole batch is left first and each fd entered again\n"
"right before its handler (a sibling may take what this thread has not\n"
"reached yet).");

/* Loop thread pos, now the calling OS thread's (see bind), or NULL. */
static struct srv_thread *as_thread(Server *s, int pos)
{
	if (pos < 0 || pos >= s->nthreads) {
		PyErr_SetString(PyExc_IndexError, "no such loop thread");
		return NULL;
	}
	tls_srv = s;
	tls_pos = pos;
	return &s->thr[pos];
}

static PyObject *Server_turn(Server *s, PyObject *args)
{
	int pos, timeout, relieved, n, handled = 0;
	PyObject *others = NULL;
	struct srv_thread *t;

	if (!PyArg_ParseTuple(args, "iip:turn", &pos, &timeout, &relieved) ||
	    !(t = as_thread(s, pos)))
		return NULL;
	/* first without waiting, under the GIL: under load there is work, and
	 * releasing and taking the GIL around a call that returns at once is
	 * pure cost; the blocking wait only when there was none. A wake-up
	 * (fdc_wake: stop, a mailbox, the relief) that the first call consumed
	 * reports no event, and must not be slept over: the counter tells. */
	struct fdc_counters before, after;

	/* work queued for the group (dispatch.c): never asleep on it */
	if (s->rq_len && dispatch_has_spilled(s, pos))
		timeout = 0;                           /* never asleep on queued work */
	s->api.counters(t->th, &before);
	n = s->api.poll(t->th, 0, t->ev, FDC_EVBATCH);
	if (n == 0 && timeout != 0)
		s->api.counters(t->th, &after);
	if (n == 0 && timeout != 0 && after.wakeups == before.wakeups) {
		int tt = timers_timeout(t, mono_now());

		if (tt >= 0 && (timeout < 0 || tt < timeout))
			timeout = tt;
		if (timeout != 0) {
			t->asleep = 1;                     /* for dispatch_wake_idle */
			Py_BEGIN_ALLOW_THREADS
			n = s->api.poll(t->th, timeout, t->ev, FDC_EVBATCH);
			Py_END_ALLOW_THREADS
			t->asleep = 0;
		}
	}
	if (n < 0) {
		errno = -n;
		return PyErr_SetFromErrno(PyExc_OSError);
	}
	if (relieved)
		s->api.leave_batch(t->th, t->ev, n);
	if (n && s->enter_app != Py_None) {
		PyObject *r = PyObject_CallFunction(s->enter_app, "i", pos);
		if (!r)
			goto fail;
		Py_DECREF(r);
	}
	double start = 0;
	int spilled = 0;
	/* dispatch: while the group has queued work, what this poll brought
	 * joins the queue behind it (served oldest first, below): a report
	 * run at once would overtake requests that wait longer (measured: a
	 * p50 below the ideal and a p99 of 2.4x it). With the queue empty
	 * the batch runs here (affinity, nothing handed over) until it has
	 * run for SPILL_AFTER. */
	int queue = s->dispatch && !relieved && s->rq_len && dispatch_has_spilled(s, pos);

	for (int i = 0; i < n; i++) {
		struct fdc_event *ev = &t->ev[i];
		HttpConn *c = NULL;

		if (ev->kind != s->kind_conn) {
			PyObject *e = event_obj(s, ev);

			if (!e || (!others && !(others = PyList_New(0))) || PyList_Append(others, e) < 0) {
				Py_XDECREF(e);
				goto fail;
			}
			Py_DECREF(e);
			continue;
		}
		if (ev->fd >= 0 && ev->fd < s->maxfd)
			c = s->conns[ev->fd];
		/* a shared connection (dispatch) is any group thread's */
		if (!c || c->cookie != ev->owner || (!s->dispatch && c->pos != pos)) {
			if (!relieved)              /* an older incarnation's, or moved */
				s->api.leave(t->th, ev->fd, ev->gen);
			continue;
		}
		double now = mono_now();

		if (!start)
			start = now;
		if (s->dispatch && !relieved && (queue || spilled || now - start > SPILL_AFTER) &&
		    dispatch_spill(s, c, ev->events) == 0) {
			spilled++;
			s->api.leave(t->th, ev->fd, ev->gen);
			continue;
		}
		Py_INCREF(c);
		if (stamp(s, pos, now) < 0) {
			Py_DECREF(c);
			goto fail;
		}
		/* an error is contained under the running bit, before the leave */
		if (relieved) {
			uint32_t gen;

			if (s->api.enter(t->th, ev->fd, &gen) == FDC_DONE) {
				if (gen == ev->gen && c->pos == pos && !c->closed &&
				    hconn_on_events(c, ev->events) < 0)
					contain(c);
				s->api.leave(t->th, ev->fd, gen);
			}
		}
		else {
			if ((s->dispatch ? dispatch_run(c, pos, ev->events, -1)
			                 : hconn_on_events(c, ev->events)) < 0)
				contain(c);
			s->api.leave(t->th, ev->fd, ev->gen);
		}
		Py_DECREF(c);
		handled++;
	}
	if (spilled && !queue)
		dispatch_wake_idle(s, pos);            /* this batch ran long: help */
	if (s->dispatch && s->rq_len)
		handled += dispatch_run_spilled(s, pos);
	if (fire_timers(s, pos) < 0 || stamp(s, pos, 0.0) < 0) {
		Py_XDECREF(others);
		return NULL;
	}
	return Py_BuildValue("(iN)", handled, others ? others : PyList_New(0));
fail:
	/* the error goes up with nothing of a held batch still held: what was
	 * left already is skipped by leave_batch; the listeners' reports never
	 * reach the Python loop (fd.h: fdc_leave_batch) */
	if (!relieved)
		s->api.leave_batch(t->th, t->ev, n);
	Py_XDECREF(others);
	return NULL;
}

/* One accepted connection into the table and the engine, owned by loop
 * thread pos, reading, with its header timer. 1 taken (2: a shared one
 * whose first read brought something: serve_first it), 0 dropped (closed:
 * beyond the table, or refused by it), -1 with a Python error (closed; not
 * for ValueError: the number is a live connection's, left alone). */
static int take_fd(Server *s, struct srv_thread *t, int pos, int fd)
{
	int one = 1, first = 0;
	uint64_t cookie = s->next_cookie++;
	HttpConn *c;
	PyObject *key;

	/* not for a unix socket: EOPNOTSUPP, harmless */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (fd < s->maxfd && s->conns[fd]) {
		/* a live connection's number (a caller's mistake): never closed here */
		PyErr_Format(PyExc_ValueError, "fd %d is a live connection of this engine", fd);
		return -1;
	}
	if (fd >= s->maxfd) {
		close(fd);                              /* beyond the table: nothing else to do */
		return 0;
	}
	if (s->dispatch) {
		/* shared by the group: its siblings' pollers may report it the
		 * instant it is registered, so the connection is made first,
		 * and no Python runs (no GIL hand-off) from the registration to
		 * its entry in conns */
		c = hconn_new(s, pos, fd, cookie);
		if (!c) {
			close(fd);
			return -1;
		}
		first = hconn_read_first(c);
		if (first < 0 || c->closed) {
			c->closed = 1;
			Py_DECREF(c);
			close(fd);
			return first < 0 ? -1 : 0;
		}
		/* what that read brought is this thread's to serve first
		 * (serve_first): a sibling that a report of the same socket
		 * wakes meanwhile (the end of input after it, more bytes) only
		 * records it, else it read the EOF and closed the connection
		 * with the first request unserved (a fuzz run's dropped request) */
		if (first)
			c->inside = pos;
		if (s->api.insert_shared(t->th, fd, cookie, s->kind_conn, t->group_mask) < 0) {
			c->closed = 1;
			Py_DECREF(c);
			close(fd);
			return 0;
		}
	}
	else {
		if (s->api.insert(s->table, fd, cookie, s->kind_conn, t->tgid, t->bit,
		                  FDC_ACCEPTED) < 0) {
			close(fd);
			return 0;
		}
		c = hconn_new(s, pos, fd, cookie);
		if (!c) {
			s->api.delete(t->th, fd);
			return -1;
		}
	}
	/* the header timer and reading, before any other thread can see it */
	c->head_clock = 1;
	timer_arm(c, TIMER_HEADER);
	c->recv_on = 1;
	if (!s->dispatch)
		s->api.want_recv(t->th, fd);
	s->conns[fd] = c;                            /* the array's reference */
	s->count++;
	key = PyLong_FromLong(fd);
	if (!key || PyDict_SetItem(s->conns_dict, key, (PyObject *)c) < 0) {
		Py_XDECREF(key);
		hconn_close_now(c);
		return -1;
	}
	Py_DECREF(key);
	return first ? 2 : 1;
}

/* A shared connection take_fd answered 2 for: what its first read brought
 * is served now, as a report (dispatch.c), under the fd's running bit. */
static int serve_first(Server *s, struct srv_thread *t, int pos, int fd)
{
	HttpConn *c = fd < s->maxfd ? s->conns[fd] : NULL;
	uint32_t gen;

	if (!c || c->inside != pos)
		return 0;
	c->inside = -1;                 /* held since take_fd: dispatch_run's now */
	if (c->closed || s->api.enter(t->th, fd, &gen) != FDC_DONE)
		return 0;
	Py_INCREF(c);
	if (dispatch_run(c, pos, EV_FIRST, -1) < 0)
		contain(c);
	s->api.leave(t->th, fd, gen);
	Py_DECREF(c);
	return 0;
}

PyDoc_STRVAR(take_doc,
"take(pos, fd) -> bool\n\n"
"A connection accepted elsewhere (a draining worker emptying a deleted\n"
"listener's queue) into the engine, owned by loop thread pos: as accept()\n"
"does for each of its batch. False if it was dropped (closed).");

static PyObject *Server_take(Server *s, PyObject *args)
{
	int pos, fd, rc;
	struct srv_thread *t;

	if (!PyArg_ParseTuple(args, "ii:take", &pos, &fd) || !(t = as_thread(s, pos)))
		return NULL;
	/* accepted elsewhere, maybe blocking: the engine's reads must never
	 * wait (a shared connection's first read would hold the GIL until its
	 * client sent: a whole worker stopped, found by a full test run) */
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0 && !(fl & O_NONBLOCK))
		fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	rc = take_fd(s, t, pos, fd);
	if (rc < 0 || (rc == 2 && serve_first(s, t, pos, fd) < 0))
		return NULL;                            /* (no listener to finish with first) */
	return PyBool_FromLong(rc);
}

PyDoc_STRVAR(accept_doc,
"accept(pos, lfd, max) -> count\n\n"
"Accepts up to max connections on listener lfd (held by loop thread pos),\n"
"and registers each one in the table, owned by that thread, reading, with\n"
"its header timer: one call for the whole batch. Raises OSError if the\n"
"first accept failed (EMFILE ...: the loop pauses accepting).");

static PyObject *Server_accept(Server *s, PyObject *args)
{
	int pos, lfd, max, n, ok = 0, fds[FDC_EVBATCH];
	struct srv_thread *t;

	if (!PyArg_ParseTuple(args, "iii:accept", &pos, &lfd, &max) || !(t = as_thread(s, pos)))
		return NULL;
	if (max > FDC_EVBATCH - t->nfirst)
		max = FDC_EVBATCH - t->nfirst;      /* room for each first read to serve */
	n = max > 0 ? s->api.accept(t->th, lfd, fds, max) : 0;
	if (n < 0) {
		errno = -n;
		return PyErr_SetFromErrno(PyExc_OSError);
	}
	for (int i = 0; i < n; i++) {
		int rc = take_fd(s, t, pos, fds[i]);

		if (rc < 0) {
			for (int k = i + 1; k < n; k++)
				close(fds[k]);
			return NULL;
		}
		ok += rc > 0;
		if (rc == 2 && t->nfirst < FDC_EVBATCH)
			t->first[t->nfirst++] = fds[i];
	}
	return PyLong_FromLong(ok);
}

PyDoc_STRVAR(serve_accepted_doc,
"serve_accepted(pos): serves what the first reads of loop thread pos's\n"
"last accept() brought (shared connections, dispatch: each was read once\n"
"before its siblings' pollers held it). The Python loop calls it once it\n"
"has done with the listener (requeue, gate), since the app runs in here.");

static PyObject *Server_serve_accepted(Server *s, PyObject *arg)
{
	long pos = PyLong_AsLong(arg);
	struct srv_thread *t;

	if ((pos == -1 && PyErr_Occurred()) || !(t = as_thread(s, (int)pos)))
		return NULL;
	while (t->nfirst) {
		int fd = t->first[--t->nfirst];

		if (serve_first(s, t, (int)pos, fd) < 0)
			return NULL;
	}
	Py_RETURN_NONE;
}

PyDoc_STRVAR(bind_doc,
"bind(pos): the calling OS thread acts as loop thread pos from now on (-1:\n"
"none): connection verbs called from it use that thread's context. turn()\n"
"and accept() bind by themselves; the loop's stop() binds the thread that\n"
"closes what is left.");

static PyObject *Server_bind(Server *s, PyObject *arg)
{
	long pos = PyLong_AsLong(arg);

	if (pos == -1 && PyErr_Occurred())
		return NULL;
	if (pos >= s->nthreads) {
		PyErr_SetString(PyExc_IndexError, "no such loop thread");
		return NULL;
	}
	tls_srv = pos < 0 ? NULL : s;
	tls_pos = pos < 0 ? -1 : (int)pos;
	Py_RETURN_NONE;
}

/* ---- construction ---------------------------------------------------------------------------------- */

static int api_fn(PyObject *api, const char *name, void **out)
{
	PyObject *v = PyDict_GetItemString(api, name);       /* borrowed */
	unsigned long long addr;

	if (!v) {
		PyErr_Format(PyExc_KeyError, "fdcore function %s missing", name);
		return -1;
	}
	addr = PyLong_AsUnsignedLongLong(v);
	if (PyErr_Occurred())
		return -1;
	*out = (void *)(uintptr_t)addr;
	return 0;
}

static int Server_init(Server *s, PyObject *args, PyObject *kw)
{
	static char *names[] = {"loop", "api", "threads", "maxfd", "kind_conn", "app", "base", "slow",
	                        "access", "report", "sendfile", "file_wrapper", "bytes_io", "no_body",
	                        "event_type", "busy", "enter_app", "limits", "script_name",
	                        "server_line", "header_timeout", "keepalive_timeout",
	                        "body_timeout", "body_buffer", "min_body_rate", NULL};
	PyObject *loop, *api, *threads, *app, *base, *slow, *access, *report, *sendfile, *fw, *bio, *nob;
	PyObject *evt, *busy, *enter_app, *script_name, *server_line, *seq;
	unsigned int line, field_size, nheaders;
	unsigned long long body;
	int maxfd;
	unsigned int kind;
	double ht, kt, bt, rate;
	Py_ssize_t bbuf;

	if (s->thr) {
		PyErr_SetString(PyExc_RuntimeError, "Server is set up once");
		return -1;
	}
	if (!PyArg_ParseTupleAndKeywords(args, kw, "$OO!OiIOO!OOOOOOOOOO(IIIK)UO!dddnd", names, &loop,
	                                 &PyDict_Type, &api, &threads, &maxfd, &kind, &app,
	                                 &PyDict_Type, &base, &slow, &access, &report, &sendfile, &fw,
	                                 &bio, &nob, &evt, &busy, &enter_app, &line, &field_size, &nheaders,
	                                 &body, &script_name, &PyBytes_Type, &server_line, &ht, &kt,
	                                 &bt, &bbuf, &rate))
		return -1;
	if (bbuf < 0 || rate < 0) {
		PyErr_SetString(PyExc_ValueError, "body_buffer and min_body_rate must not be negative");
		return -1;
	}
	if (maxfd <= 0 || !line || !field_size || !nheaders) {
		PyErr_SetString(PyExc_ValueError, "maxfd and the limits must be positive");
		return -1;
	}
	if (api_fn(api, "fdc_poll", (void **)&s->api.poll) < 0 ||
	    api_fn(api, "fdc_enter", (void **)&s->api.enter) < 0 ||
	    api_fn(api, "fdc_leave", (void **)&s->api.leave) < 0 ||
	    api_fn(api, "fdc_leave_batch", (void **)&s->api.leave_batch) < 0 ||
	    api_fn(api, "fdc_delete", (void **)&s->api.delete) < 0 ||
	    api_fn(api, "fdc_want_recv", (void **)&s->api.want_recv) < 0 ||
	    api_fn(api, "fdc_stop_recv", (void **)&s->api.stop_recv) < 0 ||
	    api_fn(api, "fdc_want_send", (void **)&s->api.want_send) < 0 ||
	    api_fn(api, "fdc_stop_send", (void **)&s->api.stop_send) < 0 ||
	    api_fn(api, "fdc_cant_recv", (void **)&s->api.cant_recv) < 0 ||
	    api_fn(api, "fdc_insert", (void **)&s->api.insert) < 0 ||
	    api_fn(api, "fdc_accept", (void **)&s->api.accept) < 0 ||
	    api_fn(api, "fdc_counters", (void **)&s->api.counters) < 0 ||
	    api_fn(api, "fdc_insert_shared", (void **)&s->api.insert_shared) < 0 ||
	    api_fn(api, "fdc_wake", (void **)&s->api.wake) < 0 ||
	    api_fn(api, "table", (void **)&s->table) < 0)
		return -1;
	seq = PySequence_Fast(threads, "threads: a list of (Thread, address, tgid, bit)");
	if (!seq)
		return -1;
	s->nthreads = (int)PySequence_Fast_GET_SIZE(seq);
	s->thr = PyMem_Calloc((size_t)(s->nthreads ? s->nthreads : 1), sizeof(*s->thr));
	s->conns = PyMem_Calloc((size_t)maxfd, sizeof(*s->conns));
	if (!s->thr || !s->conns) {
		Py_DECREF(seq);
		PyErr_NoMemory();
		return -1;
	}
	for (int i = 0; i < s->nthreads; i++) {
		PyObject *obj;
		unsigned long long addr, bit;
		int tgid;

		if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "OKiK", &obj, &addr, &tgid, &bit)) {
			Py_DECREF(seq);
			return -1;
		}
		s->thr[i].th = (struct fdc_thread *)(uintptr_t)addr;
		{
			PyObject *tid = PyObject_GetAttrString(obj, "tid");

			s->thr[i].tid = tid ? (int)PyLong_AsLong(tid) : -1;
			Py_XDECREF(tid);
			if (PyErr_Occurred()) {
				Py_DECREF(seq);
				return -1;
			}
		}
		s->thr[i].obj = Py_NewRef(obj);
		s->thr[i].tgid = tgid;
		s->thr[i].bit = bit;
	}
	Py_DECREF(seq);
	s->maxfd = maxfd;
	s->kind_conn = kind;
	s->next_cookie = 1ull << 40;        /* apart from the Python loop's listener cookies */
	s->loop = Py_NewRef(loop);
	s->conns_dict = PyObject_GetAttrString(loop, "conns");
	s->forget = PyObject_GetAttrString(loop, "forget");
	s->post = PyObject_GetAttrString(loop, "post");
	if (!s->conns_dict || !s->forget || !s->post)
		return -1;
	if (!PyDict_Check(s->conns_dict)) {
		PyErr_SetString(PyExc_TypeError, "loop.conns must be a dict");
		return -1;
	}
	s->app = Py_NewRef(app);
	s->base = Py_NewRef(base);
	s->slow = Py_NewRef(slow);
	s->access = Py_NewRef(access);
	s->report = Py_NewRef(report);
	s->sendfile = Py_NewRef(sendfile);
	s->file_wrapper = Py_NewRef(fw);
	s->bytes_io = Py_NewRef(bio);
	s->no_body = Py_NewRef(nob);
	s->event_type = Py_NewRef(evt);
	s->busy = Py_NewRef(busy);
	s->enter_app = Py_NewRef(enter_app);
	s->lim.line = line;
	s->lim.field_size = field_size;
	s->lim.fields = nheaders;
	s->lim.body = body;
	s->script_name = Py_NewRef(script_name);
	s->server_line = Py_NewRef(server_line);
	s->header_timeout = ht;
	s->keepalive_timeout = kt;
	s->body_timeout = bt;
	s->body_buffer = (size_t)bbuf;
	s->min_body_rate = rate;
	if (busy != Py_None && (!PyList_Check(busy) || PyList_GET_SIZE(busy) < s->nthreads)) {
		PyErr_SetString(PyExc_TypeError, "busy: None or a list, one float per loop thread");
		return -1;
	}
	return 0;
}

static int Server_traverse(Server *s, visitproc visit, void *arg)
{
	for (int i = 0; s->thr && i < s->nthreads; i++)
		Py_VISIT(s->thr[i].obj);
	Py_VISIT(s->file_wrapper);
	Py_VISIT(s->bytes_io);
	Py_VISIT(s->no_body);
	Py_VISIT(s->event_type);
	Py_VISIT(s->loop);
	Py_VISIT(s->conns_dict);
	Py_VISIT(s->forget);
	Py_VISIT(s->post);
	Py_VISIT(s->app);
	Py_VISIT(s->base);
	Py_VISIT(s->slow);
	Py_VISIT(s->access);
	Py_VISIT(s->report);
	Py_VISIT(s->sendfile);
	Py_VISIT(s->enter_app);
	Py_VISIT(s->busy);
	Py_VISIT(s->on_retire);
	Py_VISIT(s->on_refusal);
	for (int i = 0; i < s->rq_len; i++)
		Py_VISIT(s->runq[i].c);
	return 0;
}

static int Server_clear(Server *s)
{
	Py_CLEAR(s->loop);
	Py_CLEAR(s->conns_dict);
	Py_CLEAR(s->forget);
	Py_CLEAR(s->post);
	Py_CLEAR(s->app);
	Py_CLEAR(s->base);
	Py_CLEAR(s->slow);
	Py_CLEAR(s->access);
	Py_CLEAR(s->report);
	Py_CLEAR(s->sendfile);
	Py_CLEAR(s->enter_app);
	Py_CLEAR(s->busy);
	Py_CLEAR(s->on_retire);
	Py_CLEAR(s->on_refusal);
	dispatch_free_spilled(s);
	return 0;
}

static void Server_dealloc(Server *s)
{
	PyObject_GC_UnTrack(s);
	Server_clear(s);
	if (s->conns) {
		for (int fd = 0; fd < s->maxfd; fd++)
			Py_XDECREF(s->conns[fd]);
		PyMem_Free(s->conns);
	}
	if (s->thr) {
		for (int i = 0; i < s->nthreads; i++)
			Py_XDECREF(s->thr[i].obj);
		PyMem_Free(s->thr);
	}
	Py_XDECREF(s->file_wrapper);
	Py_XDECREF(s->bytes_io);
	Py_XDECREF(s->no_body);
	Py_XDECREF(s->event_type);
	Py_XDECREF(s->script_name);
	Py_XDECREF(s->server_line);
	Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *Server_retire_after(Server *s, PyObject *args)
{
	unsigned long long n;
	PyObject *fn;

	if (!PyArg_ParseTuple(args, "KO:retire_after", &n, &fn))
		return NULL;
	s->retire_at = n;
	Py_XSETREF(s->on_retire, n ? Py_NewRef(fn) : NULL);
	Py_RETURN_NONE;
}

static PyObject *Server_log_refusals(Server *s, PyObject *fn)
{
	Py_XSETREF(s->on_refusal, fn == Py_None ? NULL : Py_NewRef(fn));
	Py_RETURN_NONE;
}

static PyMethodDef Server_methods[] = {
	{"turn", (PyCFunction)Server_turn, METH_VARARGS, turn_doc},
	{"accept", (PyCFunction)Server_accept, METH_VARARGS, accept_doc},
	{"take", (PyCFunction)Server_take, METH_VARARGS, take_doc},
	{"bind", (PyCFunction)Server_bind, METH_O, bind_doc},
	{"retire_after", (PyCFunction)Server_retire_after, METH_VARARGS,
	 "retire_after(n, fn): fn() is called once, on the loop thread that answers the n-th "
	 "request (0: never)."},
	{"serve_accepted", (PyCFunction)Server_serve_accepted, METH_O, serve_accepted_doc},
	{"log_refusals", (PyCFunction)Server_log_refusals, METH_O,
	 "log_refusals(fn): fn(peer, status, reason, count) for a refused request, at most once a "
	 "second; count: the refusals since the last call, this one included (None: no log)."},
	{NULL},
};

static PyObject *get_draining(Server *s, void *c)
{
	(void)c;
	return PyBool_FromLong(s->draining);
}

static int set_draining(Server *s, PyObject *v, void *c)
{
	int t = v ? PyObject_IsTrue(v) : -1;

	(void)c;
	if (t < 0)
		return -1;
	s->draining = t;
	return 0;
}

static PyObject *get_dispatch(Server *s, void *c)
{
	(void)c;
	return PyBool_FromLong(s->dispatch);
}

/* Set before the first connection: each is then shared by the loop
 * threads of its group (dispatch.c). */
static int set_dispatch(Server *s, PyObject *v, void *c)
{
	int on = v ? PyObject_IsTrue(v) : -1;

	(void)c;
	if (on < 0)
		return -1;
	if (s->count) {
		PyErr_SetString(PyExc_RuntimeError, "dispatch is set before the first connection");
		return -1;
	}
	for (int i = 0; i < s->nthreads; i++) {
		s->thr[i].group_mask = 0;
		for (int j = 0; j < s->nthreads; j++)
			if (s->thr[j].tgid == s->thr[i].tgid)
				s->thr[i].group_mask |= s->thr[j].bit;
	}
	s->dispatch = on;
	return 0;
}

static PyObject *get_requests(Server *s, void *c)
{
	(void)c;
	return PyLong_FromUnsignedLongLong(s->requests);
}

static PyObject *get_count(Server *s, void *c)
{
	(void)c;
	return PyLong_FromLong(s->count);
}

static PyObject *get_responses(Server *s, void *c)
{
	(void)c;
	return Py_BuildValue("{sKsKsKsKsKsK}", "1xx", s->responses[1], "2xx", s->responses[2],
	                     "3xx", s->responses[3], "4xx", s->responses[4],
	                     "5xx", s->responses[5], "other", s->responses[0]);
}

static PyObject *get_refused(Server *s, void *c)
{
	static const char *names[REFUSALS] = REFUSAL_NAMES;
	PyObject *d = PyDict_New();

	(void)c;
	for (int i = 0; d && i < REFUSALS; i++) {
		PyObject *n = PyLong_FromUnsignedLongLong(s->refused[i]);

		if (!n || PyDict_SetItemString(d, names[i], n) < 0) {
			Py_XDECREF(n);
			Py_CLEAR(d);
			break;
		}
		Py_DECREF(n);
	}
	return d;
}

static PyGetSetDef Server_getset[] = {
	{"draining", (getter)get_draining, (setter)set_draining,
	 "responses carry Connection: close", NULL},
	{"count", (getter)get_count, NULL, "open connections", NULL},
	{"dispatch", (getter)get_dispatch, (setter)set_dispatch,
	 "connections shared by the loop threads of their group: a request goes to an idle one",
	 NULL},
	{"requests", (getter)get_requests, NULL, "requests answered", NULL},
	{"responses", (getter)get_responses, NULL, "responses by status class", NULL},
	{"refused", (getter)get_refused, NULL, "requests the engine refused, by reason", NULL},
	{NULL},
};

PyTypeObject ServerType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "sockherd.worker._http.Server",
	.tp_doc = "The native wsgi engine of one worker (see engine.c).",
	.tp_basicsize = sizeof(Server),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)Server_init,
	.tp_dealloc = (destructor)Server_dealloc,
	.tp_traverse = (traverseproc)Server_traverse,
	.tp_clear = (inquiry)Server_clear,
	.tp_methods = Server_methods,
	.tp_getset = Server_getset,
};
