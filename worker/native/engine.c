/* The native engine: one Server per worker (its Python type: server.c),
 * whose turn() is one loop turn of one loop thread, in one C call:
 *
 *   update pass + epoll_wait (fdcore's fdc_poll; the GIL is released only
 *   when the wait may block: a first call with timeout 0 under the GIL,
 *   a second, blocking one without it only if the first found nothing)
 *   -> each connection's report handled here (conn_io.c, and through its
 *   table the codec and the adapter: read, parse, environ, the app,
 *   framing, write), each fd left after its handler
 *   -> the connection timers that are due.
 *
 * Reports that are not a connection's (listeners) go back to the Python
 * loop (worker/loop.py), which keeps what is policy: accepting (through
 * Server.accept, which takes and registers a batch in one call), the gate,
 * the drain, the relief. fdcore is the cffi module's, called through the
 * function pointers the table hands over (struct fdc_api): one
 * implementation, without cffi's GIL release around each call. The
 * timers' lists are conn_timers.c's; the due ones are fired here.
 *
 * The top of the connection layer. May call: dispatch.c, conn_type.c,
 * conn_io.c, conn_timers.c, fdcore; above only through struct conn_ops
 * (read_first: a shared connection's first read).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine.h"

/* ---- timers: the due ones fired --------------------------------------------------------------- */

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
	srv_bind(s, pos);
	return &s->thr[pos];
}

/* The reads queued for loop thread pos (conn_tls.c, tls_replay): input
 * a TLS session holds that no poll report will announce, read as a
 * report of its own. Returns the connections run. */
static int tls_replay_run(Server *s, int pos)
{
	struct srv_thread *t = &s->thr[pos];
	HttpConn *c, *next = t->tls_replay;
	int ran = 0;

	t->tls_replay = NULL;
	while ((c = next)) {
		uint32_t gen;

		next = c->tls_next;
		c->tls_next = NULL;
		c->tls_queued = 0;
		if (!c->closed && c->fd < s->maxfd && s->conns[c->fd] == c &&
		    (s->dispatch || c->pos == pos) && s->api.enter(t->th, c->fd, &gen) == FDC_DONE) {
			if ((s->dispatch ? dispatch_run(c, pos, FDC_POLL_IN, -1)
			                 : hconn_on_events(c, FDC_POLL_IN)) < 0)
				contain(c);
			s->api.leave(t->th, c->fd, gen);
			ran++;
		}
		Py_DECREF(c);
	}
	return ran;
}

/* turn's arguments (pos, timeout_ms, relieved), as PyArg_ParseTuple's
 * "iip" would take them, without its format parsing: a turn per request
 * or two under load (fastcall: ~1 % of a WSGI hello request's
 * instructions, http_callgrind). 0, or -1 with the error set. */
static int turn_args(PyObject *const *args, Py_ssize_t nargs, int *pos, int *timeout,
                     int *relieved)
{
	long v[2];

	if (nargs != 3) {
		PyErr_Format(PyExc_TypeError, "turn() takes exactly 3 arguments (%zd given)", nargs);
		return -1;
	}
	for (int i = 0; i < 2; i++) {
		v[i] = PyLong_AsLong(args[i]);
		if (v[i] == -1 && PyErr_Occurred())
			return -1;
		if (v[i] < INT_MIN || v[i] > INT_MAX) {
			PyErr_SetString(PyExc_OverflowError, "turn(): argument out of range for a C int");
			return -1;
		}
	}
	*pos = (int)v[0];
	*timeout = (int)v[1];
	*relieved = PyObject_IsTrue(args[2]);
	return *relieved < 0 ? -1 : 0;
}

static PyObject *Server_turn(Server *s, PyObject *const *args, Py_ssize_t nargs)
{
	int pos, timeout, relieved, n, handled = 0;
	PyObject *others = NULL;
	struct srv_thread *t;

	if (turn_args(args, nargs, &pos, &timeout, &relieved) < 0 || !(t = as_thread(s, pos)))
		return NULL;
	/* first without waiting, under the GIL: under load there is work, and
	 * releasing and taking the GIL around a call that returns at once is
	 * pure cost; the blocking wait only when there was none. A wake-up
	 * (fdc_wake: stop, a mailbox, the relief) that the first call consumed
	 * reports no event, and must not be slept over: the counter tells. */
	struct fdc_counters before, after;

	/* work queued for the group (dispatch.c): never asleep on it */
	if (s->dispatch && dispatch_has_spilled(s, pos))
		timeout = 0;                           /* never asleep on queued work */
	if (t->tls_replay)
		timeout = 0;                           /* nor on input a TLS session holds */
	/* A worker's only loop thread skips that first call: nobody else
	 * wants the GIL between its turns (the main thread waits in select
	 * with it released), so letting it go around a call that returns at
	 * once costs two uncontended mutex round trips, while the first call
	 * cost a whole epoll_wait in every turn that then slept: 0.89
	 * epoll_wait per WSGI hello request against the C reference's 0.46
	 * (bench/RESULTS.md, 2026-11-26, hello_syscalls). With siblings the
	 * first call stays: letting the GIL go with work in hand would hand
	 * it to a sibling and queue this thread's work behind its turn. */
	int direct = s->nthreads == 1 && timeout != 0;

	s->api.counters(t->th, &before);
	n = direct ? 0 : s->api.poll(t->th, 0, t->ev, FDC_EVBATCH);
	if (n == 0 && timeout != 0)
		s->api.counters(t->th, &after);
	if (n == 0 && timeout != 0 && after.wakeups == before.wakeups) {
		int tt = timers_timeout(t, mono_now());

		if (tt >= 0 && (timeout < 0 || tt < timeout))
			timeout = tt;
		/* a due timer (tt 0): one call without waiting, as above */
		if (timeout != 0 || direct) {
			t->asleep = timeout != 0;          /* for dispatch_wake_idle */
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
	int queue = s->dispatch && !relieved && dispatch_has_spilled(s, pos);

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
		if (s->dispatch && !relieved && (queue || spilled || now - start > SPILL_AFTER)) {
			dispatch_spill(s, c, ev->events);
			spilled++;
			s->api.leave(t->th, ev->fd, ev->gen);
			continue;
		}
		Py_INCREF(c);
		if (engine_stamp(s, pos, now) < 0) {
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
	if (s->dispatch && dispatch_has_spilled(s, pos))
		handled += dispatch_run_spilled(s, pos);
	if (t->tls_replay && !relieved)
		handled += tls_replay_run(s, pos);
	if (fire_timers(s, pos) < 0 || engine_stamp(s, pos, 0.0) < 0) {
		Py_XDECREF(others);
		return NULL;
	}
	if (!others && !(others = PyList_New(0)))
		return NULL;
	PyObject *count = PyLong_FromLong(handled), *r = count ? PyTuple_Pack(2, count, others) : NULL;

	Py_XDECREF(count);
	Py_DECREF(others);
	return r;
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
		first = s->ops->read_first(c);
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
"take(pos, fd, plain=False) -> bool\n\n"
"A connection accepted elsewhere (a draining worker emptying a deleted\n"
"listener's queue) into the engine, owned by loop thread pos: as accept()\n"
"does for each of its batch. False if it was dropped (closed). plain: from\n"
"a listener that does not serve TLS (see accept).");

static PyObject *Server_take(Server *s, PyObject *args)
{
	int pos, fd, rc, plain = 0;
	struct srv_thread *t;

	if (!PyArg_ParseTuple(args, "ii|p:take", &pos, &fd, &plain) || !(t = as_thread(s, pos)))
		return NULL;
	/* accepted elsewhere, maybe blocking: the engine's reads must never
	 * wait (a shared connection's first read would hold the GIL until its
	 * client sent: a whole worker stopped, found by a full test run) */
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0 && !(fl & O_NONBLOCK))
		fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	t->plain = plain;
	rc = take_fd(s, t, pos, fd);
	t->plain = 0;
	if (rc < 0 || (rc == 2 && serve_first(s, t, pos, fd) < 0))
		return NULL;                            /* (no listener to finish with first) */
	return PyBool_FromLong(rc);
}

PyDoc_STRVAR(accept_doc,
"accept(pos, lfd, max, plain=False) -> count\n\n"
"Accepts up to max connections on listener lfd (held by loop thread pos),\n"
"and registers each one in the table, owned by that thread, reading, with\n"
"its header timer: one call for the whole batch. Raises OSError if the\n"
"first accept failed (EMFILE ...: the loop pauses accepting). plain: lfd\n"
"does not serve TLS although set_tls was called (TLS per bind: its\n"
"connections get no session).");

static PyObject *Server_accept(Server *s, PyObject *args)
{
	int pos, lfd, max, n, ok = 0, plain = 0, fds[FDC_EVBATCH];
	struct srv_thread *t;

	if (!PyArg_ParseTuple(args, "iii|p:accept", &pos, &lfd, &max, &plain) ||
	    !(t = as_thread(s, pos)))
		return NULL;
	if (max > FDC_EVBATCH - t->nfirst)
		max = FDC_EVBATCH - t->nfirst;      /* room for each first read to serve */
	n = max > 0 ? s->api.accept(t->th, lfd, fds, max) : 0;
	if (n < 0) {
		errno = -n;
		return PyErr_SetFromErrno(PyExc_OSError);
	}
	for (int i = 0; i < n; i++) {
		int rc;

		t->plain = plain;                       /* read by tls_open (hconn_new) */
		rc = take_fd(s, t, pos, fds[i]);
		t->plain = 0;
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
	srv_bind(pos < 0 ? NULL : s, pos < 0 ? -1 : (int)pos);
	Py_RETURN_NONE;
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

/* the Server type's methods (server.c holds the rest of the type) */
PyMethodDef server_methods[] = {
	{"turn", (PyCFunction)(void (*)(void))Server_turn, METH_FASTCALL, turn_doc},
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
