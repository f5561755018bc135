/* A loop's create_task, create_future and get_debug in C (sockherd.worker._aio, with
 * handles.c): set on a ThreadEventLoop instance while it is open and not
 * debugging (worker/aio.py _fast), as its call_soon is.
 *
 * Why: every ASGI request starts a task (asgi_app.c calls the loop's
 * create_task), and asyncio's create_task is a Python frame that calls
 * another (_check_closed) and then Task(coro, loop=, name=, context=)
 * with a kwargs dict; the Task's Future part then calls the loop's
 * get_debug(), one more Python frame. Measured by callgrind (bench/
 * http_callgrind.py --app asgi-hello): about 3k instructions per request
 * of a raw ASGI hello's 52k.
 *
 * What asyncio's create_task does that is kept (Python 3.11
 * base_events.py): with a task factory set (loop.set_task_factory), the
 * call goes to asyncio's own create_task, which calls the factory and
 * names the task; without one, asyncio.tasks.Task (read at each call, as
 * asyncio does: a Task replaced there is used) is made with the loop and
 * the name and context given (Task makes the "Task-N" name and copies the
 * current context itself). What is not done here needs no doing while this
 * is set: the closed check (close() takes it away) and the debug mode's
 * source traceback (set_debug(True) takes it away).
 *
 * create_future: asyncio's is a Python frame, `futures.Future(loop=self)`,
 * called for every wait of asyncio.Queue, Event, Lock, gather and the
 * ASGI receive()/send() that must wait (uvloop's is C): here the same
 * Future, asyncio.futures.Future read at each call as asyncio does,
 * made with loop= and no Python frame. Arguments asyncio's would refuse
 * go to asyncio's, which says why (bench/asgi_loop.py micro, Queue
 * ping-pong: 0.87 of uvloop's instructions before).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

#include "aio.h"

static PyObject *S_task_factory, *S_Task, *S_Future, *S_loop, *S_name, *S_context_kw, *EMPTY,
                *tasks_dict, *futures_dict;

typedef struct {
	PyObject_HEAD
	PyObject *loop, *base;                 /* base: asyncio's BaseEventLoop.create_task */
	/* {"loop": loop}, made once: a call with keywords from C builds this
	 * dict per call otherwise (the type has no vectorcall) */
	PyObject *kw;
	vectorcallfunc vectorcall;
} Maker;

static PyTypeObject MakerType;

/* asyncio's create_task(loop, *args, **kw): with a factory, or arguments
 * ours does not take (its errors are asyncio's) */
static PyObject *maker_base(Maker *m, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
	Py_ssize_t n = PyVectorcall_NARGS(nargsf);
	Py_ssize_t all = n + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
	PyObject *stack[8], *r;

	if (all + 1 > (Py_ssize_t)(sizeof(stack) / sizeof(stack[0])))
		return PyErr_Format(PyExc_TypeError, "create_task() takes a coroutine, name and context");
	stack[0] = m->loop;
	for (Py_ssize_t i = 0; i < all; i++)
		stack[i + 1] = args[i];
	r = PyObject_Vectorcall(m->base, stack, (size_t)n + 1, kwnames);
	return r;
}

/* create_task(coro, *, name=None, context=None) */
static PyObject *maker_call(Maker *m, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
	Py_ssize_t n = PyVectorcall_NARGS(nargsf), nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
	PyObject *factory, *task_type, *stack[4], *kw, *r;

	if (n != 1 || nkw > 2)
		return maker_base(m, args, nargsf, kwnames);
	for (Py_ssize_t i = 0; i < nkw; i++) {
		PyObject *k = PyTuple_GET_ITEM(kwnames, i);

		if (PyUnicode_Compare(k, S_name) != 0 && PyUnicode_Compare(k, S_context_kw) != 0)
			return maker_base(m, args, nargsf, kwnames);
	}
	/* set_task_factory may have been called since: asyncio reads it per call */
	if (!(factory = PyObject_GetAttr(m->loop, S_task_factory)))
		return NULL;
	Py_DECREF(factory);
	if (factory != Py_None)
		return maker_base(m, args, nargsf, kwnames);
	if (!(task_type = PyDict_GetItemWithError(tasks_dict, S_Task))) {
		if (!PyErr_Occurred())
			PyErr_SetString(PyExc_RuntimeError, "asyncio.tasks.Task is gone");
		return NULL;
	}
	Py_INCREF(task_type);
	if (!nkw) {
		/* Task(coro, loop=loop) */
		PyObject *one = PyTuple_Pack(1, args[0]);

		r = one ? PyObject_Call(task_type, one, m->kw) : NULL;
		Py_XDECREF(one);
		Py_DECREF(task_type);
		return r;
	}
	/* Task(coro, loop=loop, name=..., context=... as given) */
	stack[0] = args[0];
	stack[1] = m->loop;
	for (Py_ssize_t i = 0; i < nkw; i++)
		stack[i + 2] = args[1 + i];
	kw = PyTuple_New(nkw + 1);
	if (!kw) {
		Py_DECREF(task_type);
		return NULL;
	}
	PyTuple_SET_ITEM(kw, 0, Py_NewRef(S_loop));
	for (Py_ssize_t i = 0; i < nkw; i++)
		PyTuple_SET_ITEM(kw, i + 1, Py_NewRef(PyTuple_GET_ITEM(kwnames, i)));
	r = PyObject_Vectorcall(task_type, stack, 1, kw);
	Py_DECREF(kw);
	Py_DECREF(task_type);
	return r;
}

/* task_maker(loop, base): loop's create_task in C */
PyObject *aio_task_maker(PyObject *mod, PyObject *args)
{
	PyObject *loop, *base;
	Maker *m;

	(void)mod;
	if (!PyArg_ParseTuple(args, "OO:task_maker", &loop, &base))
		return NULL;
	m = PyObject_GC_New(Maker, &MakerType);
	if (!m)
		return NULL;
	m->loop = Py_NewRef(loop);
	m->base = Py_NewRef(base);
	m->vectorcall = (vectorcallfunc)maker_call;
	m->kw = PyDict_New();
	PyObject_GC_Track(m);
	if (!m->kw || PyDict_SetItem(m->kw, S_loop, loop) < 0) {
		Py_DECREF(m);
		return NULL;
	}
	return (PyObject *)m;
}

/* create_future(): asyncio.futures.Future(loop=loop) */
static PyObject *future_call(Maker *m, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
	PyObject *future_type, *r;

	if (PyVectorcall_NARGS(nargsf) || kwnames)
		return maker_base(m, args, nargsf, kwnames);     /* asyncio's TypeError */
	if (!(future_type = PyDict_GetItemWithError(futures_dict, S_Future))) {
		if (!PyErr_Occurred())
			PyErr_SetString(PyExc_RuntimeError, "asyncio.futures.Future is gone");
		return NULL;
	}
	Py_INCREF(future_type);
	r = PyObject_Call(future_type, EMPTY, m->kw);
	Py_DECREF(future_type);
	return r;
}

/* future_maker(loop, base): loop's create_future in C (base: asyncio's) */
PyObject *aio_future_maker(PyObject *mod, PyObject *args)
{
	Maker *m = (Maker *)aio_task_maker(mod, args);

	if (m)
		m->vectorcall = (vectorcallfunc)future_call;
	return (PyObject *)m;
}

/* not_debugging(): False, a loop's get_debug while this module's parts
 * are set on it (never in debug mode): asyncio's Future calls it at every
 * Future and Task it makes */
PyObject *aio_not_debugging(PyObject *mod, PyObject *noarg)
{
	(void)mod;
	(void)noarg;
	Py_RETURN_FALSE;
}

static int Maker_traverse(Maker *m, visitproc visit, void *arg)
{
	Py_VISIT(m->loop);
	Py_VISIT(m->base);
	Py_VISIT(m->kw);
	return 0;
}

static int Maker_clear(Maker *m)
{
	Py_CLEAR(m->loop);
	Py_CLEAR(m->base);
	Py_CLEAR(m->kw);
	return 0;
}

static void Maker_dealloc(Maker *m)
{
	PyObject_GC_UnTrack(m);
	Maker_clear(m);
	Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyObject *Maker_repr(Maker *m)
{
	return PyUnicode_FromFormat("<sockherd %s of %R>", m->vectorcall == (vectorcallfunc)future_call
	                            ? "create_future" : "create_task", m->loop);
}

static PyTypeObject MakerType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "sockherd.worker._aio.TaskMaker",
	.tp_basicsize = sizeof(Maker),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
	.tp_doc = "A loop's create_task or create_future, in C.",
	.tp_vectorcall_offset = offsetof(Maker, vectorcall),
	.tp_call = PyVectorcall_Call,
	.tp_dealloc = (destructor)Maker_dealloc,
	.tp_traverse = (traverseproc)Maker_traverse,
	.tp_clear = (inquiry)Maker_clear,
	.tp_repr = (reprfunc)Maker_repr,
};

int aio_tasks_init(void)
{
	PyObject *tasks;

	if (PyType_Ready(&MakerType) < 0)
		return -1;
	S_task_factory = PyUnicode_InternFromString("_task_factory");
	S_Task = PyUnicode_InternFromString("Task");
	S_Future = PyUnicode_InternFromString("Future");
	S_loop = PyUnicode_InternFromString("loop");
	S_name = PyUnicode_InternFromString("name");
	S_context_kw = PyUnicode_InternFromString("context");
	if (!S_task_factory || !S_Task || !S_Future || !S_loop || !S_name || !S_context_kw)
		return -1;
	EMPTY = PyTuple_New(0);
	if (!EMPTY || !(tasks = PyImport_ImportModule("asyncio.tasks")))
		return -1;
	tasks_dict = Py_NewRef(PyModule_GetDict(tasks));
	Py_DECREF(tasks);
	if (!(tasks = PyImport_ImportModule("asyncio.futures")))
		return -1;
	futures_dict = Py_NewRef(PyModule_GetDict(tasks));
	Py_DECREF(tasks);
	return 0;
}
