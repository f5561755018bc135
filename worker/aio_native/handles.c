/* sockherd.worker._aio: the hot part of a loop thread's asyncio loop in C
 * (worker/aio.py ThreadEventLoop): its callback handles, its call_soon,
 * and the pass that runs the ready callbacks of one iteration (its
 * call_soon / call_at / call_later bound to the loop: callers.c; its
 * iteration: runner.c; create_task and get_debug: tasks.c; the module:
 * aio.c).
 *
 * Why: asyncio's Handle, call_soon and the ready pass of _run_once are
 * Python; an iteration that runs one short callback spends most of its
 * instructions there (bench/asgi_loop.py, callgrind: 13k instructions per
 * call_soon chain step, uvloop's 4.8k). uvloop answers with a loop in C;
 * this keeps asyncio's loop (its selector, its timers heap, its API) and
 * replaces only what each callback costs.
 *
 * Handle and TimerHandle behave as asyncio's (cancel, cancelled,
 * get_context, when, _run, the attributes asyncio's own code reads:
 * _cancelled, _callback, _args, _context, _loop, _when, _scheduled,
 * _source_traceback), without being subclasses of asyncio.Handle (as
 * uvloop's are not). A callback's exception other than SystemExit and
 * KeyboardInterrupt goes to loop.call_exception_handler with the message
 * asyncio writes. A loop in debug mode never makes these (aio.py).
 *
 * Threads: each object is its loop's, touched under the GIL only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <string.h>

#include "aio.h"

static PyObject *S_call_exception_handler, *S_timer_handle_cancelled, *S_append,
                *S_cancelled_attr, *S_run_attr;

/* ---- making and freeing -------------------------------------------------------------------------- */

Handle *aio_handle_make(PyTypeObject *type, PyObject *callback, PyObject *args,
                           PyObject *loop, PyObject *context)
{
	Handle *h;

	if (!PyTuple_Check(args)) {
		PyErr_SetString(PyExc_TypeError, "Handle: args must be a tuple");
		return NULL;
	}
	h = PyObject_GC_New(Handle, type);
	if (!h)
		return NULL;
	h->context = context == Py_None ? PyContext_CopyCurrent() : Py_NewRef(context);
	if (!h->context) {
		h->callback = h->args = h->loop = h->repr = h->weakrefs = NULL;
		Py_DECREF(h);
		return NULL;
	}
	h->callback = Py_NewRef(callback);
	h->args = Py_NewRef(args);
	h->loop = Py_NewRef(loop);
	h->repr = Py_NewRef(Py_None);
	h->weakrefs = NULL;
	h->cancelled = h->scheduled = 0;
	h->when = 0;
	PyObject_GC_Track(h);
	return h;
}

/* Handle(callback, args, loop, context) as asyncio's (context None: a copy
 * of the current one) */
static PyObject *Handle_new(PyTypeObject *type, PyObject *a, PyObject *kw)
{
	PyObject *callback, *args, *loop, *context = Py_None;

	if (kw && PyDict_GET_SIZE(kw)) {
		PyErr_SetString(PyExc_TypeError, "Handle() takes positional arguments only");
		return NULL;
	}
	if (!PyArg_UnpackTuple(a, "Handle", 3, 4, &callback, &args, &loop, &context))
		return NULL;
	return (PyObject *)aio_handle_make(type, callback, args, loop, context);
}

/* TimerHandle(when, callback, args, loop, context) */
static PyObject *TimerHandle_new(PyTypeObject *type, PyObject *a, PyObject *kw)
{
	PyObject *when, *callback, *args, *loop, *context = Py_None;
	Handle *h;
	double w;

	if (kw && PyDict_GET_SIZE(kw)) {
		PyErr_SetString(PyExc_TypeError, "TimerHandle() takes positional arguments only");
		return NULL;
	}
	if (!PyArg_UnpackTuple(a, "TimerHandle", 4, 5, &when, &callback, &args, &loop, &context))
		return NULL;
	w = PyFloat_AsDouble(when);
	if (w == -1.0 && PyErr_Occurred())
		return NULL;
	h = aio_handle_make(type, callback, args, loop, context);
	if (h)
		h->when = w;
	return (PyObject *)h;
}

static int Handle_traverse(Handle *h, visitproc visit, void *arg)
{
	Py_VISIT(h->callback);
	Py_VISIT(h->args);
	Py_VISIT(h->context);
	Py_VISIT(h->loop);
	Py_VISIT(h->repr);
	return 0;
}

static int Handle_clear(Handle *h)
{
	Py_CLEAR(h->callback);
	Py_CLEAR(h->args);
	Py_CLEAR(h->context);
	Py_CLEAR(h->loop);
	Py_CLEAR(h->repr);
	return 0;
}

static void Handle_dealloc(Handle *h)
{
	PyObject_GC_UnTrack(h);
	if (h->weakrefs)
		PyObject_ClearWeakRefs((PyObject *)h);
	Handle_clear(h);
	Py_TYPE(h)->tp_free((PyObject *)h);
}

/* ---- running ----------------------------------------------------------------------------------------- */

/* The callback's error (pending) to its loop's exception handler, as
 * asyncio's Handle._run words it; SystemExit and KeyboardInterrupt stay
 * pending (-1): they end the loop's run, as asyncio's do. */
static int handle_failed(Handle *h)
{
	PyObject *exc, *fmt = NULL, *src = NULL, *msg = NULL, *ctx = NULL, *r = NULL;
	int rc = -1;

	if (PyErr_ExceptionMatches(PyExc_SystemExit) || PyErr_ExceptionMatches(PyExc_KeyboardInterrupt))
		return -1;
	{
		PyObject *type, *tb;

		PyErr_Fetch(&type, &exc, &tb);
		PyErr_NormalizeException(&type, &exc, &tb);
		if (exc && tb)
			PyException_SetTraceback(exc, tb);
		Py_XDECREF(type);
		Py_XDECREF(tb);
		if (!exc)
			exc = Py_NewRef(Py_None);
	}
	{
		PyObject *mod = PyImport_ImportModule("asyncio.format_helpers");

		if (mod) {
			fmt = PyObject_GetAttrString(mod, "_format_callback_source");
			Py_DECREF(mod);
		}
	}
	if (fmt)
		src = PyObject_CallFunctionObjArgs(fmt, h->callback ? h->callback : Py_None,
		                                   h->args ? h->args : Py_None, NULL);
	if (!src) {
		PyErr_Clear();
		src = PyObject_Repr(h->callback ? h->callback : Py_None);
	}
	if (src)
		msg = PyUnicode_FromFormat("Exception in callback %U", src);
	if (msg)
		ctx = Py_BuildValue("{sOsOsO}", "message", msg, "exception", exc, "handle", h);
	if (ctx)
		r = PyObject_CallMethodOneArg(h->loop, S_call_exception_handler, ctx);
	if (r)
		rc = 0;
	Py_XDECREF(r);
	Py_XDECREF(ctx);
	Py_XDECREF(msg);
	Py_XDECREF(src);
	Py_XDECREF(fmt);
	Py_XDECREF(exc);
	return rc;
}

/* Runs h's callback in its context; 0, or -1 with an exception pending
 * (SystemExit, KeyboardInterrupt, or the exception handler's own). */
static int handle_run(Handle *h)
{
	PyObject *r, *ctx = Py_NewRef(h->context);
	PyObject *cb = Py_XNewRef(h->callback), *args = Py_XNewRef(h->args);
	int rc = 0;

	if (!cb || !args) {                     /* cancelled by an earlier callback: skipped */
		Py_XDECREF(cb);
		Py_XDECREF(args);
		Py_DECREF(ctx);
		return 0;
	}
	if (PyContext_Enter(ctx) < 0) {
		rc = handle_failed(h);
		goto out;
	}
	r = PyObject_Call(cb, args, NULL);
	if (PyContext_Exit(ctx) < 0) {
		Py_XDECREF(r);
		r = NULL;
	}
	if (r)
		Py_DECREF(r);
	else
		rc = handle_failed(h);
out:
	Py_DECREF(cb);
	Py_DECREF(args);
	Py_DECREF(ctx);
	return rc;
}

static PyObject *Handle_run(Handle *h, PyObject *unused)
{
	if (handle_run(h) < 0)
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *Handle_cancel(Handle *h, PyObject *unused)
{
	if (!h->cancelled) {
		if (Py_IS_TYPE(h, &aio_TimerHandleType) && h->scheduled) {
			/* the loop counts cancelled timers still in its heap (its purge) */
			PyObject *r = PyObject_CallMethodOneArg(h->loop, S_timer_handle_cancelled,
			                                        (PyObject *)h);
			if (!r)
				return NULL;
			Py_DECREF(r);
		}
		h->cancelled = 1;
		Py_CLEAR(h->callback);
		Py_CLEAR(h->args);
	}
	Py_RETURN_NONE;
}

static PyObject *Handle_cancelled(Handle *h, PyObject *unused)
{
	return PyBool_FromLong(h->cancelled);
}

static PyObject *Handle_get_context(Handle *h, PyObject *unused)
{
	return Py_NewRef(h->context);
}

static PyObject *Handle_when(Handle *h, PyObject *unused)
{
	return PyFloat_FromDouble(h->when);
}

static PyObject *Handle_repr(Handle *h)
{
	const char *name = Py_TYPE(h)->tp_name;

	if (h->cancelled)
		return PyUnicode_FromFormat("<%s cancelled>", name);
	if (Py_IS_TYPE(h, &aio_TimerHandleType)) {
		PyObject *w = PyFloat_FromDouble(h->when), *r;

		if (!w)
			return NULL;
		r = PyUnicode_FromFormat("<%s when=%R %R>", name, w, h->callback);
		Py_DECREF(w);
		return r;
	}
	return PyUnicode_FromFormat("<%s %R>", name, h->callback);
}

/* when of a timer in a loop's heap: ours, or asyncio's (a loop that was
 * debugging for a while holds both); 1 if `t` is neither, -1 on error */
static int any_when(PyObject *t, double *when)
{
	PyObject *w;

	if (PyObject_TypeCheck(t, &aio_TimerHandleType)) {
		*when = ((Handle *)t)->when;
		return 0;
	}
	if (!(w = PyObject_GetAttrString(t, "_when"))) {
		if (!PyErr_ExceptionMatches(PyExc_AttributeError))
			return -1;
		PyErr_Clear();
		return 1;
	}
	*when = PyFloat_AsDouble(w);
	Py_DECREF(w);
	if (*when == -1.0 && PyErr_Occurred()) {
		PyErr_Clear();
		return 1;
	}
	return 0;
}

/* TimerHandles order by when (the heap), also against asyncio's own
 * TimerHandle (which answers NotImplemented to ours: Python then asks us
 * the reflected question); equal as asyncio's are */
static PyObject *Timer_richcompare(PyObject *a, PyObject *b, int op)
{
	double wa, wb;
	int ra, rb;

	if ((ra = any_when(a, &wa)) < 0 || (rb = any_when(b, &wb)) < 0)
		return NULL;
	if (ra || rb)
		Py_RETURN_NOTIMPLEMENTED;
	switch (op) {
	case Py_LT: return PyBool_FromLong(wa < wb);
	case Py_LE: return PyBool_FromLong(wa <= wb);
	case Py_GT: return PyBool_FromLong(wa > wb);
	case Py_GE: return PyBool_FromLong(wa >= wb);
	case Py_EQ:
	case Py_NE: {
		Handle *x = (Handle *)a, *y = (Handle *)b;
		int eq = a == b;

		if (!eq && PyObject_TypeCheck(a, &aio_TimerHandleType) &&
		    PyObject_TypeCheck(b, &aio_TimerHandleType))
			eq = x->when == y->when && x->callback == y->callback &&
			     x->cancelled == y->cancelled && x->args == y->args;
		return PyBool_FromLong(op == Py_EQ ? eq : !eq);
	}
	}
	Py_RETURN_NOTIMPLEMENTED;
}

static Py_hash_t Timer_hash(PyObject *a)
{
	return _Py_HashDouble(a, ((Handle *)a)->when);
}

static PyObject *Handle_none(Handle *h, void *unused)
{
	Py_RETURN_NONE;
}

static PyMethodDef Handle_methods[] = {
	{"cancel", (PyCFunction)Handle_cancel, METH_NOARGS, "Cancels the callback (asyncio's)."},
	{"cancelled", (PyCFunction)Handle_cancelled, METH_NOARGS, "Whether it was cancelled."},
	{"get_context", (PyCFunction)Handle_get_context, METH_NOARGS, "The callback's context."},
	{"_run", (PyCFunction)Handle_run, METH_NOARGS, "Runs the callback (the loop's)."},
	{NULL},
};

static PyMethodDef Timer_methods[] = {
	{"when", (PyCFunction)Handle_when, METH_NOARGS, "When it is due (the loop's clock)."},
	{NULL},
};

static PyMemberDef Handle_members[] = {
	{"_callback", T_OBJECT, offsetof(Handle, callback), READONLY, NULL},
	{"_args", T_OBJECT, offsetof(Handle, args), READONLY, NULL},
	{"_context", T_OBJECT, offsetof(Handle, context), READONLY, NULL},
	{"_loop", T_OBJECT, offsetof(Handle, loop), READONLY, NULL},
	{"_repr", T_OBJECT, offsetof(Handle, repr), READONLY, NULL},
	{"_cancelled", T_BOOL, offsetof(Handle, cancelled), READONLY, NULL},
	{NULL},
};

static PyMemberDef Timer_members[] = {
	{"_when", T_DOUBLE, offsetof(Handle, when), READONLY, NULL},
	{"_scheduled", T_BOOL, offsetof(Handle, scheduled), 0, NULL},
	{NULL},
};

static PyGetSetDef Handle_getset[] = {
	{"_source_traceback", (getter)Handle_none, NULL, "None: made only when not debugging", NULL},
	{NULL},
};

PyTypeObject aio_HandleType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "sockherd.worker._aio.Handle",
	.tp_basicsize = sizeof(Handle),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
	.tp_doc = "A callback of a loop thread's asyncio loop (asyncio.Handle's behaviour).",
	.tp_new = Handle_new,
	.tp_dealloc = (destructor)Handle_dealloc,
	.tp_traverse = (traverseproc)Handle_traverse,
	.tp_clear = (inquiry)Handle_clear,
	.tp_repr = (reprfunc)Handle_repr,
	.tp_weaklistoffset = offsetof(Handle, weakrefs),
	.tp_methods = Handle_methods,
	.tp_members = Handle_members,
	.tp_getset = Handle_getset,
};

PyTypeObject aio_TimerHandleType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "sockherd.worker._aio.TimerHandle",
	.tp_basicsize = sizeof(Handle),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
	.tp_doc = "A timer of a loop thread's asyncio loop (asyncio.TimerHandle's behaviour).",
	.tp_base = &aio_HandleType,
	.tp_new = TimerHandle_new,
	.tp_dealloc = (destructor)Handle_dealloc,
	.tp_traverse = (traverseproc)Handle_traverse,
	.tp_clear = (inquiry)Handle_clear,
	.tp_richcompare = Timer_richcompare,
	.tp_hash = Timer_hash,
	.tp_methods = Timer_methods,
	.tp_members = Timer_members,
};

/* ---- the loop's side --------------------------------------------------------------------------------- */

/* call_soon(ready, loop, callback, args, context) -> Handle: a new handle
 * appended to the ready deque (ThreadEventLoop.call_soon, not debugging). */
PyObject *aio_call_soon(PyObject *mod, PyObject *const *a, Py_ssize_t n)
{
	Handle *h;
	PyObject *r;

	if (n != 5) {
		PyErr_SetString(PyExc_TypeError, "call_soon(ready, loop, callback, args, context)");
		return NULL;
	}
	h = aio_handle_make(&aio_HandleType, a[2], a[3], a[1], a[4]);
	if (!h)
		return NULL;
	r = PyObject_CallMethodOneArg(a[0], S_append, (PyObject *)h);
	if (!r) {
		Py_DECREF(h);
		return NULL;
	}
	Py_DECREF(r);
	return (PyObject *)h;
}

/* run_ready(popleft, n): the ready pass of one iteration: n handles taken
 * from the ready deque (its popleft) and each run unless cancelled; ours
 * in C, any other (a reader's asyncio.Handle) through its _run. Stops at
 * an exception of a callback that ends the loop's run (SystemExit,
 * KeyboardInterrupt), as asyncio's pass does; the rest stay queued. */
PyObject *aio_ready_pass(PyObject *popleft, Py_ssize_t todo)
{
	for (Py_ssize_t i = 0; i < todo; i++) {
		PyObject *h = PyObject_CallNoArgs(popleft);
		int rc = 0;

		if (!h)
			return NULL;
		if (Py_IS_TYPE(h, &aio_HandleType) || Py_IS_TYPE(h, &aio_TimerHandleType)) {
			if (!((Handle *)h)->cancelled)
				rc = handle_run((Handle *)h);
		}
		else {
			PyObject *c = PyObject_GetAttr(h, S_cancelled_attr);
			int cancelled = c ? PyObject_IsTrue(c) : -1;

			Py_XDECREF(c);
			if (cancelled < 0)
				rc = -1;
			else if (!cancelled) {
				PyObject *r = PyObject_CallMethodNoArgs(h, S_run_attr);

				rc = r ? 0 : -1;
				Py_XDECREF(r);
			}
		}
		Py_DECREF(h);
		if (rc < 0)
			return NULL;
	}
	Py_RETURN_NONE;
}

PyObject *aio_run_ready(PyObject *mod, PyObject *const *a, Py_ssize_t n)
{
	Py_ssize_t todo;

	if (n != 2) {
		PyErr_SetString(PyExc_TypeError, "run_ready(popleft, n)");
		return NULL;
	}
	todo = PyLong_AsSsize_t(a[1]);
	if (todo == -1 && PyErr_Occurred())
		return NULL;
	return aio_ready_pass(a[0], todo);
}


int aio_handles_init(void)
{
	if (PyType_Ready(&aio_HandleType) < 0 || PyType_Ready(&aio_TimerHandleType) < 0)
		return -1;
	S_call_exception_handler = PyUnicode_InternFromString("call_exception_handler");
	S_timer_handle_cancelled = PyUnicode_InternFromString("_timer_handle_cancelled");
	S_append = PyUnicode_InternFromString("append");
	S_cancelled_attr = PyUnicode_InternFromString("_cancelled");
	S_run_attr = PyUnicode_InternFromString("_run");
	if (!S_call_exception_handler || !S_timer_handle_cancelled || !S_append ||
	    !S_cancelled_attr || !S_run_attr)
		return -1;
	return 0;
}
