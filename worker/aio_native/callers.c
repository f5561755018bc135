/* sockherd.worker._aio: a loop's call_soon, call_at and call_later in C,
 * bound to the loop (moved out of handles.c, whose handles they make),
 * and the loop attributes, and the clock, that runner.c reads too.
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
static PyObject *S_scheduled_list, *S_context, *S_append, *heappush;

double aio_mono(void)
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
PyObject *aio_loop_attr(PyObject *loop, PyObject *name)
{
	PyObject **dp = _PyObject_GetDictPtr(loop), *v;

	if (dp && *dp && PyDict_CheckExact(*dp) && (v = PyDict_GetItemWithError(*dp, name)))
		return Py_NewRef(v);
	if (PyErr_Occurred())
		return NULL;
	return PyObject_GetAttr(loop, name);
}

int aio_loop_flag(PyObject *loop, PyObject *name)
{
	PyObject *v = aio_loop_attr(loop, name);
	int r;

	if (!v)
		return -1;
	r = PyObject_IsTrue(v);
	Py_DECREF(v);
	return r;
}

/* Whether a keyword's name (a str: the vectorcall protocol's kwnames
 * hold exact str) is "context". asyncio's C Task passes a name of its own
 * making, not interned (3.11's context_kwname): PyUnicode_Compare cost
 * ~95 instructions a call_soon, once per task step scheduled. */
static inline int is_context(PyObject *k)
{
	return k == S_context ||
	       (PyUnicode_IS_COMPACT_ASCII(k) && PyUnicode_GET_LENGTH(k) == 7 &&
	        !memcmp(PyUnicode_DATA(k), "context", 7));
}

static PyObject *caller_call(Caller *c, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
	Py_ssize_t n = PyVectorcall_NARGS(nargsf), first = c->kind == CALL_SOON ? 0 : 1;
	PyObject *context = Py_None, *cbargs, *list;
	Handle *h;
	double when = 0;

	if (kwnames) {
		if (PyTuple_GET_SIZE(kwnames) != 1 || !is_context(PyTuple_GET_ITEM(kwnames, 0)))
			return caller_base(c, args, nargsf, kwnames);    /* its error */
		context = args[n];
	}
	if (n < first + 1 || (first && args[0] == Py_None))
		return caller_base(c, args, nargsf, kwnames);
	if (first) {
		when = PyFloat_AsDouble(args[0]);
		if (when == -1.0 && PyErr_Occurred())
			return NULL;
		/* a NaN due time orders nowhere in the heap and bounds no wait
		 * (the loop polled forever: issue 35 point 9): refused, as
		 * Python 3.13's asyncio.sleep refuses a NaN delay */
		if (isnan(when))
			return PyErr_Format(PyExc_ValueError, "Invalid %s: NaN (not a number)",
			                    c->kind == CALL_LATER ? "delay" : "when");
		if (c->kind == CALL_LATER)
			when += aio_mono();
	}
	cbargs = PyTuple_New(n - first - 1);
	if (!cbargs)
		return NULL;
	for (Py_ssize_t i = first + 1; i < n; i++)
		PyTuple_SET_ITEM(cbargs, i - first - 1, Py_NewRef(args[i]));
	h = aio_handle_make(first ? &aio_TimerHandleType : &aio_HandleType, args[first], cbargs, c->loop,
	                context);
	Py_DECREF(cbargs);
	if (!h)
		return NULL;
	h->when = when;
	if (!first)
		list = Py_NewRef(c->ready);
	else if (!(list = aio_loop_attr(c->loop, S_scheduled_list))) {
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
PyObject *aio_caller(PyObject *mod, PyObject *args)
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


int aio_callers_init(void)
{
	PyObject *hq = PyImport_ImportModule("heapq");

	heappush = hq ? PyObject_GetAttrString(hq, "heappush") : NULL;
	Py_XDECREF(hq);
	if (!heappush || PyType_Ready(&CallerType) < 0)
		return -1;
	S_scheduled_list = PyUnicode_InternFromString("_scheduled");
	S_context = PyUnicode_InternFromString("context");
	S_append = PyUnicode_InternFromString("append");
	if (!S_scheduled_list || !S_context || !S_append)
		return -1;
	return 0;
}
