/* sockherd.worker._aio: a loop's iteration (_run_once) in C, with the
 * loop thread's turn (moved out of handles.c: it runs the handles' ready
 * pass, aio_ready_pass, and reads the loop through callers.c's helpers).
 *
 * Threads: each object is its loop's, touched under the GIL only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <time.h>

#include "aio.h"

/* A loop's _run_once in C, set on the loop instance (run_forever calls
 * self._run_once()): asyncio's iteration (cancelled timers dropped from
 * the heap's head, the wait computed, the select, the due timers made
 * ready, the ready pass) but that while callbacks or due timers are ready
 * it turns only every `every` iterations or `after` seconds (aio.py says
 * why). A turn is the selector's select without its Python frames: the
 * loop thread's turn (selector._turn(ms), worker/loop.py) called here,
 * then, as PollerSelector.select does, the loop stopped if the Loop
 * stops and the app's own fds' reports (most turns have none) handed to
 * asyncio (selector._app_ready, loop._process_events). A
 * debugging loop runs asyncio's own iteration (ThreadEventLoop._fast
 * takes this one away). A heap worth purging (asyncio's rule: past 100
 * timers, half of them cancelled) is purged here as asyncio would (purge),
 * not by a pass of base _run_once: its ready callbacks went unstamped.
 * `base` is kept for the signature's sake. */
typedef struct {
	PyObject_HEAD
	PyObject *loop, *ready, *popleft, *append, *base;
	/* selector._turn, and the Loop's stop: selector._stopping, a
	 * threading.Event whose is_set() is `return self._flag` (its _flag
	 * read here: the call is a Python frame, ~500 instructions a turn),
	 * or is_set of another kind of event (stop NULL) */
	PyObject *selector, *poll, *stop, *is_set;
	/* the Loop's busy stamps (worker/relief.py's list) and this thread's
	 * place in it, or NULL: written around each ready pass (stamp_busy) */
	PyObject *busy;
	Py_ssize_t me;
	int every, since;
	double after, turned_at, resolution;
	vectorcallfunc vectorcall;
} Runner;

static PyTypeObject RunnerType;
static PyObject *S_scheduled_list, *S_append, *S_cancelled_attr,
                *S_stopping, *S_cancelled_count, *S_when_attr, *S_scheduled_attr, *heappop, *heapify,
                *zero_count,
                *S_failed, *S_stop, *S_app_ready, *S_process_events, *S_flag, *event_type;

#define MAX_SELECT 86400.0                 /* asyncio's MAXIMUM_SELECT_TIMEOUT */
#define MAX_WAIT_MS 3600000                /* aio.py's _MAX_WAIT_MS: poll's timeout is 32-bit */

/* One turn of the loop thread, waiting at most timeout seconds (< 0: no
 * bound), as PollerSelector.select and ThreadEventLoop's select step do
 * it (aio.py): 0, or -1 with the error (the turn's own marks the selector
 * failed: the loop thread ends). */
static int runner_turn(Runner *r, double timeout)
{
	PyObject *ms, *reports, *flag, *res;
	long wait = timeout < 0 ? -1 : timeout == 0 ? 0
	            : timeout * 1000 >= MAX_WAIT_MS ? MAX_WAIT_MS : (long)ceil(timeout * 1000);
	int stop, rc = 0;

	if (!(ms = PyLong_FromLong(wait)))
		return -1;
	reports = PyObject_CallOneArg(r->poll, ms);
	Py_DECREF(ms);
	if (!reports) {
		PyObject *type, *val, *tb;

		PyErr_Fetch(&type, &val, &tb);         /* ours: the thread ends (aio.run) */
		if (PyObject_SetAttr(r->selector, S_failed, Py_True) < 0)
			PyErr_Clear();
		PyErr_Restore(type, val, tb);
		return -1;
	}
	flag = r->stop ? aio_loop_attr(r->stop, S_flag) : PyObject_CallNoArgs(r->is_set);
	if (!flag || (stop = PyObject_IsTrue(flag)) < 0)
		goto fail;
	Py_CLEAR(flag);
	if (stop) {                                /* run_forever returns after this iteration */
		if (!(res = PyObject_CallMethodNoArgs(r->loop, S_stop)))
			goto fail;
		Py_DECREF(res);
	}
	if (PyList_CheckExact(reports) && !PyList_GET_SIZE(reports))
		goto out;
	/* the app's fds: asyncio's events, as select() returns them */
	if (!(res = PyObject_CallMethodOneArg(r->selector, S_app_ready, reports)))
		goto fail;
	if ((stop = PyObject_IsTrue(res)) > 0) {
		Py_SETREF(res, PyObject_CallMethodOneArg(r->loop, S_process_events, res));
		stop = res ? 0 : -1;
	}
	Py_XDECREF(res);
	if (stop < 0)
		goto fail;
out:
	Py_DECREF(reports);
	return rc;
fail:
	Py_XDECREF(flag);
	rc = -1;
	goto out;
}

static int timer_cancelled(PyObject *t)
{
	if (PyObject_TypeCheck(t, &aio_HandleType))
		return ((Handle *)t)->cancelled;
	return aio_loop_flag(t, S_cancelled_attr);
}

static int timer_when(PyObject *t, double *when)
{
	PyObject *w;

	if (PyObject_TypeCheck(t, &aio_HandleType)) {
		*when = ((Handle *)t)->when;
		return 0;
	}
	if (!(w = PyObject_GetAttr(t, S_when_attr)))
		return -1;
	*when = PyFloat_AsDouble(w);
	Py_DECREF(w);
	return *when == -1.0 && PyErr_Occurred() ? -1 : 0;
}

static int timer_unscheduled(PyObject *t)
{
	if (PyObject_TypeCheck(t, &aio_HandleType)) {
		((Handle *)t)->scheduled = 0;
		return 0;
	}
	return PyObject_SetAttr(t, S_scheduled_attr, Py_False);
}

static PyObject *pop_timer(PyObject *heap)
{
	return PyObject_CallOneArg(heappop, heap);
}

/* asyncio's purge of cancelled timers (base _run_once's): the live ones
 * kept, heapified, as loop._scheduled, the cancelled ones unscheduled, the
 * cancelled count 0. The new heap (a new reference), or NULL. */
static PyObject *purge(PyObject *loop, PyObject *heap)
{
	PyObject *kept = PyList_New(0), *r;
	Py_ssize_t i;
	int flag;

	if (!kept)
		return NULL;
	for (i = 0; i < PyList_GET_SIZE(heap); i++) {
		PyObject *t = PyList_GET_ITEM(heap, i);

		if ((flag = timer_cancelled(t)) < 0 ||
		    (flag ? timer_unscheduled(t) : PyList_Append(kept, t)) < 0)
			goto fail;
	}
	if (!(r = PyObject_CallOneArg(heapify, kept)))
		goto fail;
	Py_DECREF(r);
	if (PyObject_SetAttr(loop, S_scheduled_list, kept) < 0 ||
	    PyObject_SetAttr(loop, S_cancelled_count, zero_count) < 0)
		goto fail;
	return kept;
fail:
	Py_DECREF(kept);
	return NULL;
}

/* The app's callbacks run in the ready pass: the loop thread is in the
 * app from the stamp until the 0.0 after it, as a WSGI handler is between
 * the engine's stamps. The worker's stuck-request watch (worker/stuck.py,
 * `timeout`) reads these: before, nothing stamped an asyncio loop, and a
 * loop blocked in the app (time.sleep in a coroutine) was never noticed
 * (issue 35 point 7). 0.0 is a float made at init, so unstamping cannot
 * fail. */
static PyObject *zero_stamp;

static int stamp_busy(Runner *r, double when)
{
	PyObject *v;

	if (!r->busy)
		return 0;
	v = when == 0.0 ? Py_NewRef(zero_stamp) : PyFloat_FromDouble(when);
	if (!v)
		return -1;
	return PyList_SetItem(r->busy, r->me, v);     /* steals v; me checked at creation */
}

static PyObject *runner_once(Runner *r, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
	PyObject *loop = r->loop, *heap = NULL, *t;
	Py_ssize_t nready;
	int flag, stopping, turn = 1;
	double now, timeout = -1;                  /* -1: no bound (None) */

	if (PyVectorcall_NARGS(nargsf) || kwnames) {
		PyErr_SetString(PyExc_TypeError, "_run_once() takes no arguments");
		return NULL;
	}
	if (!(heap = aio_loop_attr(loop, S_scheduled_list)))
		return NULL;
	if (!PyList_Check(heap)) {
		PyErr_SetString(PyExc_TypeError, "loop._scheduled is not a list");
		goto fail;
	}
	if (PyList_GET_SIZE(heap) > 100) {
		PyObject *c = PyObject_GetAttr(loop, S_cancelled_count);
		long n = c ? PyLong_AsLong(c) : -1;

		Py_XDECREF(c);
		if (n == -1 && PyErr_Occurred())
			goto fail;
		if ((double)n / PyList_GET_SIZE(heap) > 0.5) {
			/* asyncio's purge (base _run_once's), done here: handing
			 * the iteration to base _run_once ran its ready callbacks
			 * unstamped, and a loop blocked in them was never noticed
			 * by `timeout` (issue 35 review of point 7) */
			PyObject *kept = purge(loop, heap);

			Py_DECREF(heap);
			if (!(heap = kept))
				return NULL;
		}
	}
	while (PyList_GET_SIZE(heap) && (flag = timer_cancelled(PyList_GET_ITEM(heap, 0))) != 0) {
		PyObject *c, *c1;

		if (flag < 0)
			goto fail;
		if (!(c = PyObject_GetAttr(loop, S_cancelled_count)))
			goto fail;
		{
			long v = PyLong_AsLong(c);

			c1 = v == -1 && PyErr_Occurred() ? NULL : PyLong_FromLong(v - 1);
		}
		Py_DECREF(c);
		if (!c1 || PyObject_SetAttr(loop, S_cancelled_count, c1) < 0) {
			Py_XDECREF(c1);
			goto fail;
		}
		Py_DECREF(c1);
		if (!(t = pop_timer(heap)))
			goto fail;
		flag = timer_unscheduled(t);
		Py_DECREF(t);
		if (flag < 0)
			goto fail;
	}
	if ((stopping = aio_loop_flag(loop, S_stopping)) < 0 || (nready = PyObject_Length(r->ready)) < 0)
		goto fail;
	now = aio_mono();
	if (nready || stopping)
		timeout = 0;
	else if (PyList_GET_SIZE(heap)) {
		double when;

		if (timer_when(PyList_GET_ITEM(heap, 0), &when) < 0)
			goto fail;
		/* a timer due already (within the clock's resolution, as the
		 * due test below counts it) is work ready as a callback is */
		timeout = when - now;
		/* a NaN due time (a timer asyncio's own call_at made: ours
		 * refuse NaN) is due now, as asyncio's _run_once counts it; as
		 * a wait it was no bound at all (issue 35 point 9: a hang) */
		timeout = isnan(timeout) || timeout <= r->resolution ? 0
		          : timeout > MAX_SELECT ? MAX_SELECT : timeout;
	}
	if (timeout == 0 && !stopping && r->since < r->every && now - r->turned_at < r->after) {
		r->since++;
		turn = 0;
	}
	if (turn) {
		if (runner_turn(r, timeout) < 0)
			goto fail;
		r->since = 0;
		r->turned_at = now = aio_mono();
		/* the turn may have replaced the heap (never asyncio's select; the
		 * app's callbacks do not run in it): read it again all the same */
		Py_DECREF(heap);
		if (!(heap = aio_loop_attr(loop, S_scheduled_list)))
			return NULL;
		if (!PyList_Check(heap)) {
			PyErr_SetString(PyExc_TypeError, "loop._scheduled is not a list");
			goto fail;
		}
	}
	{
		double end = now + r->resolution, when;

		while (PyList_GET_SIZE(heap)) {
			PyObject *res;

			if (timer_when(PyList_GET_ITEM(heap, 0), &when) < 0)
				goto fail;
			if (when >= end)            /* (NaN: due, as above) */
				break;
			if (!(t = pop_timer(heap)))
				goto fail;
			if (timer_unscheduled(t) < 0 ||
			    !(res = PyObject_CallOneArg(r->append, t))) {
				Py_DECREF(t);
				goto fail;
			}
			Py_DECREF(res);
			Py_DECREF(t);
		}
	}
	Py_CLEAR(heap);
	/* the callbacks ready now, not those they schedule (asyncio's rule) */
	if ((nready = PyObject_Length(r->ready)) < 0)
		return NULL;
	if (!nready)
		return aio_ready_pass(r->popleft, 0);
	/* `now`: this pass's clock read (after the turn when there was one);
	 * only the due timers' moves to ready lie between it and the app's
	 * code, and a second clock read was ~1 % of a raw ASGI hello */
	if (stamp_busy(r, now) < 0)
		return NULL;
	t = aio_ready_pass(r->popleft, nready);
	stamp_busy(r, 0.0);         /* a stored float: raises nothing, keeps t's error */
	return t;
fail:
	Py_XDECREF(heap);
	return NULL;
}

/* runner(loop, selector, base, every, after, busy=None, me=0) */
PyObject *aio_runner(PyObject *mod, PyObject *args)
{
	PyObject *loop, *selector, *base, *res, *busy = Py_None;
	int every;
	Py_ssize_t me = 0;
	double after;
	Runner *r;

	if (!PyArg_ParseTuple(args, "OOOid|On:runner", &loop, &selector, &base, &every, &after,
	                      &busy, &me))
		return NULL;
	if (busy != Py_None && (!PyList_CheckExact(busy) || me < 0 || me >= PyList_GET_SIZE(busy)))
		return PyErr_Format(PyExc_ValueError,
		                    "runner: busy must be a list with an item at me (%zd)", me);
	r = PyObject_GC_New(Runner, &RunnerType);
	if (!r)
		return NULL;
	r->busy = busy == Py_None ? NULL : Py_NewRef(busy);
	r->me = me;
	r->loop = Py_NewRef(loop);
	r->selector = Py_NewRef(selector);
	r->base = Py_NewRef(base);
	r->poll = PyObject_GetAttrString(selector, "_turn");
	res = r->poll ? PyObject_GetAttrString(selector, "_stopping") : NULL;
	r->stop = res && Py_IS_TYPE(res, (PyTypeObject *)event_type) ? Py_NewRef(res) : NULL;
	r->is_set = res ? PyObject_GetAttrString(res, "is_set") : NULL;
	Py_XDECREF(res);
	r->every = every;
	r->since = 0;
	r->after = after;
	r->turned_at = 0;
	r->vectorcall = (vectorcallfunc)runner_once;
	r->ready = r->is_set ? PyObject_GetAttrString(loop, "_ready") : NULL;
	r->popleft = r->ready ? PyObject_GetAttrString(r->ready, "popleft") : NULL;
	r->append = r->popleft ? PyObject_GetAttr(r->ready, S_append) : NULL;
	res = r->append ? PyObject_GetAttrString(loop, "_clock_resolution") : NULL;
	r->resolution = res ? PyFloat_AsDouble(res) : -1;
	Py_XDECREF(res);
	PyObject_GC_Track(r);
	if (!r->append || PyErr_Occurred()) {
		Py_DECREF(r);
		return NULL;
	}
	return (PyObject *)r;
}

static int Runner_traverse(Runner *r, visitproc visit, void *arg)
{
	Py_VISIT(r->loop);
	Py_VISIT(r->ready);
	Py_VISIT(r->popleft);
	Py_VISIT(r->append);
	Py_VISIT(r->selector);
	Py_VISIT(r->poll);
	Py_VISIT(r->stop);
	Py_VISIT(r->is_set);
	Py_VISIT(r->base);
	Py_VISIT(r->busy);
	return 0;
}

static int Runner_clear(Runner *r)
{
	Py_CLEAR(r->loop);
	Py_CLEAR(r->ready);
	Py_CLEAR(r->popleft);
	Py_CLEAR(r->append);
	Py_CLEAR(r->selector);
	Py_CLEAR(r->poll);
	Py_CLEAR(r->stop);
	Py_CLEAR(r->is_set);
	Py_CLEAR(r->base);
	Py_CLEAR(r->busy);
	return 0;
}

static void Runner_dealloc(Runner *r)
{
	PyObject_GC_UnTrack(r);
	Runner_clear(r);
	Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyTypeObject RunnerType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "sockherd.worker._aio.Runner",
	.tp_basicsize = sizeof(Runner),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
	.tp_doc = "A loop's _run_once, in C.",
	.tp_vectorcall_offset = offsetof(Runner, vectorcall),
	.tp_call = PyVectorcall_Call,
	.tp_dealloc = (destructor)Runner_dealloc,
	.tp_traverse = (traverseproc)Runner_traverse,
	.tp_clear = (inquiry)Runner_clear,
};

int aio_runner_init(void)
{
	PyObject *hq = PyImport_ImportModule("heapq"), *th;

	heappop = hq ? PyObject_GetAttrString(hq, "heappop") : NULL;
	heapify = hq ? PyObject_GetAttrString(hq, "heapify") : NULL;
	Py_XDECREF(hq);
	zero_count = PyLong_FromLong(0);
	if (!heappop || !heapify || !zero_count || PyType_Ready(&RunnerType) < 0)
		return -1;
	S_scheduled_list = PyUnicode_InternFromString("_scheduled");
	S_append = PyUnicode_InternFromString("append");
	S_cancelled_attr = PyUnicode_InternFromString("_cancelled");
	S_stopping = PyUnicode_InternFromString("_stopping");
	S_cancelled_count = PyUnicode_InternFromString("_timer_cancelled_count");
	S_when_attr = PyUnicode_InternFromString("_when");
	S_scheduled_attr = PyUnicode_InternFromString("_scheduled");
	S_failed = PyUnicode_InternFromString("failed");
	S_stop = PyUnicode_InternFromString("stop");
	S_app_ready = PyUnicode_InternFromString("_app_ready");
	S_process_events = PyUnicode_InternFromString("_process_events");
	S_flag = PyUnicode_InternFromString("_flag");
	zero_stamp = PyFloat_FromDouble(0.0);
	if (!S_scheduled_list || !S_append || !S_cancelled_attr || !S_stopping ||
	    !S_cancelled_count || !S_when_attr || !S_scheduled_attr || !S_failed || !S_stop ||
	    !S_app_ready || !S_process_events || !S_flag || !zero_stamp)
		return -1;
	th = PyImport_ImportModule("threading");
	event_type = th ? PyObject_GetAttrString(th, "Event") : NULL;
	Py_XDECREF(th);
	return event_type ? 0 : -1;
}
