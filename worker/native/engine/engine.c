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
 * loop (worker/loop_turn.py), which keeps what is policy: accepting
 * (through Server.accept, engine_accept.c, which takes and registers a
 * batch in one call), the gate, the drain, the relief. fdcore is the cffi module's, called through the
 * function pointers the table hands over (struct fdc_api): one
 * implementation, without cffi's GIL release around each call. The
 * timers' lists are conn_timers.c's; the due ones are fired here.
 *
 * This file holds the turn, bind and the small settings methods; taking
 * connections in (accept, take, serve_accepted) is engine_accept.c's,
 * beside it: neither calls the other (both bind through as_thread,
 * engine.h).
 *
 * The top of the connection layer. May call: dispatch.c, conn_type.c,
 * conn_io.c, conn_timers.c, fdcore.
 */
#include <errno.h>
#include <limits.h>

#include "engine.h"

/* ---- timers: the due ones fired --------------------------------------------------------------- */

static int fire_timers(Server *s, int pos)
{
	struct srv_thread *t = &s->thr[pos];
	double now = mono_now();
	struct conn *due[64];
	int kinds[64];
	double dues[64];
	int n = 0;

	for (int k = 0; k < TIMER_KINDS; k++) {
		struct conn *h;

		while (n < 64 && (h = t->timers[k].head) && h->due <= now) {
			kinds[n] = k;
			dues[n] = h->due;
			timer_cancel(h);
			due[n++] = (struct conn *)Py_NewRef(h);
		}
	}
	for (int i = 0; i < n; i++) {
		struct conn *c = due[i];
		uint32_t gen;
		int fired = 0;

		/* the handler runs under the running bit, as for an event */
		if (!c->closed && (s->dispatch || c->pos == pos) &&
		    s->api.enter(t->th, c->fd, &gen) == FDC_DONE) {
			if (!c->closed && (s->dispatch || c->pos == pos)) {
				if ((s->dispatch ? dispatch_run(c, pos, 0, kinds[i])
				                 : conn_on_timeout(c, kinds[i])) < 0)
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

/* The reads queued for loop thread pos (conn_tls.c, tls_replay): input
 * a TLS session holds that no poll report will announce, read as a
 * report of its own. Returns the connections run. */
static int tls_replay_run(Server *s, int pos)
{
	struct srv_thread *t = &s->thr[pos];
	struct conn *c, *next = t->tls_replay;
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
			                 : conn_on_events(c, FDC_POLL_IN)) < 0)
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
	/* the answers queued since the last turn, before this poll (h1_conn.c: owe) */
	if (t->owed && s->ops->write_owed(s, pos))
		timeout = 0;                           /* a close the Python side must see */
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
		struct conn *c = NULL;

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
				    conn_on_events(c, ev->events) < 0)
					contain(c);
				s->api.leave(t->th, ev->fd, gen);
			}
		}
		else {
			if ((s->dispatch ? dispatch_run(c, pos, ev->events, -1)
			                 : conn_on_events(c, ev->events)) < 0)
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
	if (t->owed)
		(void)s->ops->write_owed(s, pos);      /* what this turn's events ended */
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

/* the Server type's methods (server.c holds the rest of the type; engine_accept.c's
 * accept, take and serve_accepted are joined to these: httpmodule.c) */
PyMethodDef server_methods[] = {
	{"turn", (PyCFunction)(void (*)(void))Server_turn, METH_FASTCALL, turn_doc},
	{"bind", (PyCFunction)Server_bind, METH_O, bind_doc},
	{"retire_after", (PyCFunction)Server_retire_after, METH_VARARGS,
	 "retire_after(n, fn): fn() is called once, on the loop thread that answers the n-th "
	 "request (0: never)."},
	{"log_refusals", (PyCFunction)Server_log_refusals, METH_O,
	 "log_refusals(fn): fn(peer, status, reason, count) for a refused request, at most once a "
	 "second; count: the refusals since the last call, this one included (None: no log)."},
	{NULL},
};
