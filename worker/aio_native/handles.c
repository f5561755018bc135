/* sockherd.worker._aio: the hot part of a loop thread's asyncio loop in C
 * (worker/aio.py ThreadEventLoop): its callback handles, its call_soon,
 * and the pass that runs the ready callbacks of one iteration (its
 * create_task and get_debug: tasks.c).
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
#include <time.h>

#include "aio.h"

typedef struct {
	PyObject_HEAD
	PyObject *callback;                    /* NULL once cancelled */
	PyObject *args;                        /* a tuple; NULL once cancelled */
	PyObject *context;
	PyObject *loop;
	PyObject *repr;                        /* asyncio's _repr: always None here */
	PyObject *weakrefs;
	char cancelled;
	char scheduled;                        /* TimerHandle: in its loop's heap */
	double when;                           /* TimerHandle */
} Handle;

static PyTypeObject HandleType, TimerHandleType;
static PyObject *S_call_exception_handler, *S_timer_handle_cancelled, *S_append,
                *S_cancelled_attr, *S_run_attr;

/* ---- making and freeing -------------------------------------------------------------------------- */

static Handle *handle_make(PyTypeObject *type, PyObject *callback, PyObject *args,
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
	return (PyObject *)handle_make(type, callback, args, loop, context);
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
	h = handle_make(type, callback, args, loop, context);
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
		if (Py_IS_TYPE(h, &TimerHandleType) && h->scheduled) {
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
	if (Py_IS_TYPE(h, &TimerHandleType)) {
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

	if (PyObject_TypeCheck(t, &TimerHandleType)) {
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

		if (!eq && PyObject_TypeCheck(a, &TimerHandleType) &&
		    PyObject_TypeCheck(b, &TimerHandleType))
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

static PyTypeObject HandleType = {
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

static PyTypeObject TimerHandleType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "sockherd.worker._aio.TimerHandle",
	.tp_basicsize = sizeof(Handle),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
	.tp_doc = "A timer of a loop thread's asyncio loop (asyncio.TimerHandle's behaviour).",
	.tp_base = &HandleType,
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
static PyObject *call_soon(PyObject *mod, PyObject *const *a, Py_ssize_t n)
{
	Handle *h;
	PyObject *r;

	if (n != 5) {
		PyErr_SetString(PyExc_TypeError, "call_soon(ready, loop, callback, args, context)");
		return NULL;
	}
	h = handle_make(&HandleType, a[2], a[3], a[1], a[4]);
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
static PyObject *ready_pass(PyObject *popleft, Py_ssize_t todo)
{
	for (Py_ssize_t i = 0; i < todo; i++) {
		PyObject *h = PyObject_CallNoArgs(popleft);
		int rc = 0;

		if (!h)
			return NULL;
		if (Py_IS_TYPE(h, &HandleType) || Py_IS_TYPE(h, &TimerHandleType)) {
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

static PyObject *run_ready(PyObject *mod, PyObject *const *a, Py_ssize_t n)
{
	Py_ssize_t todo;

	if (n != 2) {
		PyErr_SetString(PyExc_TypeError, "run_ready(popleft, n)");
		return NULL;
	}
	todo = PyLong_AsSsize_t(a[1]);
	if (todo == -1 && PyErr_Occurred())
		return NULL;
	return ready_pass(a[0], todo);
}

/* ---- call_soon, call_at, call_later bound to one loop -------------------------------------------- */

/* A loop's call_soon / call_at / call_later as a C callable set on the
 * loop instance (ThreadEventLoop._fast): asyncio's C Task and Future find
 * it where they look (loop.call_soon) and call it with no Python frame.
 * Only while the loop is open and not debugging (_fast takes it away
 * then: asyncio's methods check and say why); an argument asyncio's own
 * code would refuse (when or delay None, another keyword) goes to
 * asyncio's method (`base`), which says why. */
enum { CALL_SOON, CALL_AT, CALL_LATER };

typedef struct {
	PyObject_HEAD
	PyObject *loop;                        /* owned: a cycle with the loop, the GC's */
	PyObject *ready;                       /* loop._ready, never replaced by asyncio */
	PyObject *append;                      /* ready.append */
	PyObject *base;                        /* asyncio's unbound method */
	int kind;
	vectorcallfunc vectorcall;
} Caller;

static PyTypeObject CallerType;
static PyObject *S_scheduled_list, *S_context, *heappush;

static double mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);   /* time.monotonic's clock */
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static PyObject *caller_base(Caller *c, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
	Py_ssize_t n = PyVectorcall_NARGS(nargsf), nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
	PyObject **all = PyMem_Malloc((n + nkw + 1) * sizeof(PyObject *)), *r;

	if (!all)
		return PyErr_NoMemory();
	all[0] = c->loop;
	memcpy(all + 1, args, (n + nkw) * sizeof(PyObject *));
	r = PyObject_Vectorcall(c->base, all, n + 1, kwnames);
	PyMem_Free(all);
	return r;
}

/* loop.<name> (a new reference): the loop's own attributes asyncio keeps
 * in its instance dict (_scheduled, _stopping), read there first. The
 * generic getattr walks the class's MRO for a descriptor first: about 240
 * instructions a read, two or three an iteration (callgrind, bench/
 * asgi_loop.py micro). The loop classes define no descriptor of these
 * names, so the instance dict's value is what getattr returns. */
static PyObject *loop_attr(PyObject *loop, PyObject *name)
{
	PyObject **dp = _PyObject_GetDictPtr(loop), *v;

	if (dp && *dp && PyDict_CheckExact(*dp) && (v = PyDict_GetItemWithError(*dp, name)))
		return Py_NewRef(v);
	if (PyErr_Occurred())
		return NULL;
	return PyObject_GetAttr(loop, name);
}

static int loop_flag(PyObject *loop, PyObject *name)
{
	PyObject *v = loop_attr(loop, name);
	int r;

	if (!v)
		return -1;
	r = PyObject_IsTrue(v);
	Py_DECREF(v);
	return r;
}

static PyObject *caller_call(Caller *c, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
	Py_ssize_t n = PyVectorcall_NARGS(nargsf), first = c->kind == CALL_SOON ? 0 : 1;
	PyObject *context = Py_None, *cbargs, *list;
	Handle *h;
	double when = 0;

	if (kwnames) {
		if (PyTuple_GET_SIZE(kwnames) != 1 ||
		    PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), S_context) != 0)
			return caller_base(c, args, nargsf, kwnames);    /* its error */
		context = args[n];
	}
	if (n < first + 1 || (first && args[0] == Py_None))
		return caller_base(c, args, nargsf, kwnames);
	if (first) {
		when = PyFloat_AsDouble(args[0]);
		if (when == -1.0 && PyErr_Occurred())
			return NULL;
		if (c->kind == CALL_LATER)
			when += mono();
	}
	cbargs = PyTuple_New(n - first - 1);
	if (!cbargs)
		return NULL;
	for (Py_ssize_t i = first + 1; i < n; i++)
		PyTuple_SET_ITEM(cbargs, i - first - 1, Py_NewRef(args[i]));
	h = handle_make(first ? &TimerHandleType : &HandleType, args[first], cbargs, c->loop,
	                context);
	Py_DECREF(cbargs);
	if (!h)
		return NULL;
	h->when = when;
	if (!first)
		list = Py_NewRef(c->ready);
	else if (!(list = loop_attr(c->loop, S_scheduled_list))) {
		Py_DECREF(h);
		return NULL;
	}
	{
		PyObject *r = first ? PyObject_CallFunctionObjArgs(heappush, list, h, NULL)
		                    : PyObject_CallOneArg(c->append, (PyObject *)h);

		Py_DECREF(list);
		if (!r) {
			Py_DECREF(h);
			return NULL;
		}
		Py_DECREF(r);
	}
	h->scheduled = (char)first;
	return (PyObject *)h;
}

/* caller(loop, kind, base): 0 call_soon, 1 call_at, 2 call_later */
static PyObject *caller(PyObject *mod, PyObject *args)
{
	PyObject *loop, *base;
	int kind;
	Caller *c;

	if (!PyArg_ParseTuple(args, "OiO:caller", &loop, &kind, &base))
		return NULL;
	if (kind < CALL_SOON || kind > CALL_LATER) {
		PyErr_SetString(PyExc_ValueError, "caller: kind 0, 1 or 2");
		return NULL;
	}
	c = PyObject_GC_New(Caller, &CallerType);
	if (!c)
		return NULL;
	c->loop = Py_NewRef(loop);
	c->base = Py_NewRef(base);
	c->kind = kind;
	c->vectorcall = (vectorcallfunc)caller_call;
	c->ready = PyObject_GetAttrString(loop, "_ready");
	c->append = c->ready ? PyObject_GetAttr(c->ready, S_append) : NULL;
	PyObject_GC_Track(c);
	if (!c->append) {
		Py_DECREF(c);
		return NULL;
	}
	return (PyObject *)c;
}

static int Caller_traverse(Caller *c, visitproc visit, void *arg)
{
	Py_VISIT(c->loop);
	Py_VISIT(c->ready);
	Py_VISIT(c->append);
	Py_VISIT(c->base);
	return 0;
}

static int Caller_clear(Caller *c)
{
	Py_CLEAR(c->loop);
	Py_CLEAR(c->ready);
	Py_CLEAR(c->append);
	Py_CLEAR(c->base);
	return 0;
}

static void Caller_dealloc(Caller *c)
{
	PyObject_GC_UnTrack(c);
	Caller_clear(c);
	Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *Caller_repr(Caller *c)
{
	static const char *names[] = {"call_soon", "call_at", "call_later"};

	return PyUnicode_FromFormat("<sockherd %s of %R>", names[c->kind], c->loop);
}

static PyTypeObject CallerType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "sockherd.worker._aio.Caller",
	.tp_basicsize = sizeof(Caller),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
	.tp_doc = "A loop's call_soon, call_at or call_later, in C.",
	.tp_vectorcall_offset = offsetof(Caller, vectorcall),
	.tp_call = PyVectorcall_Call,
	.tp_dealloc = (destructor)Caller_dealloc,
	.tp_traverse = (traverseproc)Caller_traverse,
	.tp_clear = (inquiry)Caller_clear,
	.tp_repr = (reprfunc)Caller_repr,
};

/* ---- one iteration ------------------------------------------------------------------------------------ */

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
 * takes this one away); so does, once, a heap worth purging (`base`;
 * asyncio's rule: past 100 timers, half of them cancelled). */
typedef struct {
	PyObject_HEAD
	PyObject *loop, *ready, *popleft, *append, *base;
	/* selector._turn, and the Loop's stop: selector._stopping, a
	 * threading.Event whose is_set() is `return self._flag` (its _flag
	 * read here: the call is a Python frame, ~500 instructions a turn),
	 * or is_set of another kind of event (stop NULL) */
	PyObject *selector, *poll, *stop, *is_set;
	int every, since;
	double after, turned_at, resolution;
	vectorcallfunc vectorcall;
} Runner;

static PyTypeObject RunnerType;
static PyObject *S_stopping, *S_cancelled_count, *S_when_attr, *S_scheduled_attr, *heappop,
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
	flag = r->stop ? loop_attr(r->stop, S_flag) : PyObject_CallNoArgs(r->is_set);
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
	if (PyObject_TypeCheck(t, &HandleType))
		return ((Handle *)t)->cancelled;
	return loop_flag(t, S_cancelled_attr);
}

static int timer_when(PyObject *t, double *when)
{
	PyObject *w;

	if (PyObject_TypeCheck(t, &HandleType)) {
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
	if (PyObject_TypeCheck(t, &HandleType)) {
		((Handle *)t)->scheduled = 0;
		return 0;
	}
	return PyObject_SetAttr(t, S_scheduled_attr, Py_False);
}

static PyObject *pop_timer(PyObject *heap)
{
	return PyObject_CallOneArg(heappop, heap);
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
	if (!(heap = loop_attr(loop, S_scheduled_list)))
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
			Py_DECREF(heap);
			return PyObject_CallOneArg(r->base, loop);    /* asyncio's purge, this once */
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
	if ((stopping = loop_flag(loop, S_stopping)) < 0 || (nready = PyObject_Length(r->ready)) < 0)
		goto fail;
	now = mono();
	if (nready || stopping)
		timeout = 0;
	else if (PyList_GET_SIZE(heap)) {
		double when;

		if (timer_when(PyList_GET_ITEM(heap, 0), &when) < 0)
			goto fail;
		/* a timer due already (within the clock's resolution, as the
		 * due test below counts it) is work ready as a callback is */
		timeout = when - now;
		timeout = timeout <= r->resolution ? 0 : timeout > MAX_SELECT ? MAX_SELECT : timeout;
	}
	if (timeout == 0 && !stopping && r->since < r->every && now - r->turned_at < r->after) {
		r->since++;
		turn = 0;
	}
	if (turn) {
		if (runner_turn(r, timeout) < 0)
			goto fail;
		r->since = 0;
		r->turned_at = now = mono();
		/* the turn may have replaced the heap (never asyncio's select; the
		 * app's callbacks do not run in it): read it again all the same */
		Py_DECREF(heap);
		if (!(heap = loop_attr(loop, S_scheduled_list)))
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
			if (when >= end)
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
	return ready_pass(r->popleft, nready);
fail:
	Py_XDECREF(heap);
	return NULL;
}

/* runner(loop, selector, base, every, after) */
static PyObject *runner(PyObject *mod, PyObject *args)
{
	PyObject *loop, *selector, *base, *res;
	int every;
	double after;
	Runner *r;

	if (!PyArg_ParseTuple(args, "OOOid:runner", &loop, &selector, &base, &every, &after))
		return NULL;
	r = PyObject_GC_New(Runner, &RunnerType);
	if (!r)
		return NULL;
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

static PyMethodDef module_methods[] = {
	{"call_soon", (PyCFunction)(void (*)(void))call_soon, METH_FASTCALL,
	 "call_soon(ready, loop, callback, args, context) -> Handle, appended to ready"},
	{"caller", (PyCFunction)caller, METH_VARARGS,
	 "caller(loop, kind, base): loop's call_soon (0), call_at (1) or call_later (2) in C"},
	{"runner", (PyCFunction)runner, METH_VARARGS,
	 "runner(loop, selector, base, every, after): loop's _run_once in C"},
	{"run_ready", (PyCFunction)(void (*)(void))run_ready, METH_FASTCALL,
	 "run_ready(popleft, n): runs n ready handles"},
	{"task_maker", aio_task_maker, METH_VARARGS,
	 "task_maker(loop, base): loop's create_task in C (tasks.c)"},
	{"future_maker", aio_future_maker, METH_VARARGS,
	 "future_maker(loop, base): loop's create_future in C (tasks.c)"},
	{"not_debugging", aio_not_debugging, METH_NOARGS,
	 "not_debugging() -> False: a loop's get_debug while not debugging (tasks.c)"},
	{NULL},
};

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT, "sockherd.worker._aio",
	"A loop thread's asyncio handles and ready pass, in C (worker/aio.py).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__aio(void)
{
	PyObject *m;

	if (PyType_Ready(&HandleType) < 0 || PyType_Ready(&TimerHandleType) < 0 ||
	    PyType_Ready(&CallerType) < 0 || PyType_Ready(&RunnerType) < 0 ||
	    aio_tasks_init() < 0)
		return NULL;
	{
		PyObject *hq = PyImport_ImportModule("heapq");

		heappush = hq ? PyObject_GetAttrString(hq, "heappush") : NULL;
		heappop = hq ? PyObject_GetAttrString(hq, "heappop") : NULL;
		Py_XDECREF(hq);
		if (!heappush || !heappop)
			return NULL;
	}
	S_scheduled_list = PyUnicode_InternFromString("_scheduled");
	S_context = PyUnicode_InternFromString("context");
	S_stopping = PyUnicode_InternFromString("_stopping");
	S_cancelled_count = PyUnicode_InternFromString("_timer_cancelled_count");
	S_when_attr = PyUnicode_InternFromString("_when");
	S_scheduled_attr = PyUnicode_InternFromString("_scheduled");
	S_failed = PyUnicode_InternFromString("failed");
	S_stop = PyUnicode_InternFromString("stop");
	S_app_ready = PyUnicode_InternFromString("_app_ready");
	S_process_events = PyUnicode_InternFromString("_process_events");
	S_flag = PyUnicode_InternFromString("_flag");
	if (!S_failed || !S_stop || !S_app_ready || !S_process_events || !S_flag)
		return NULL;
	{
		PyObject *th = PyImport_ImportModule("threading");

		event_type = th ? PyObject_GetAttrString(th, "Event") : NULL;
		Py_XDECREF(th);
		if (!event_type)
			return NULL;
	}
	if (!S_scheduled_list || !S_context || !S_stopping ||
	    !S_cancelled_count || !S_when_attr || !S_scheduled_attr)
		return NULL;
	S_call_exception_handler = PyUnicode_InternFromString("call_exception_handler");
	S_timer_handle_cancelled = PyUnicode_InternFromString("_timer_handle_cancelled");
	S_append = PyUnicode_InternFromString("append");
	S_cancelled_attr = PyUnicode_InternFromString("_cancelled");
	S_run_attr = PyUnicode_InternFromString("_run");
	if (!S_call_exception_handler || !S_timer_handle_cancelled || !S_append ||
	    !S_cancelled_attr || !S_run_attr)
		return NULL;
	m = PyModule_Create(&module);
	if (!m)
		return NULL;
	if (PyModule_AddObjectRef(m, "Handle", (PyObject *)&HandleType) < 0 ||
	    PyModule_AddObjectRef(m, "TimerHandle", (PyObject *)&TimerHandleType) < 0) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
