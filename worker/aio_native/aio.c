/* sockherd.worker._aio, the module: its functions (handles.c, callers.c,
 * runner.c, tasks.c) and types, each file's constants made at import.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "aio.h"

static PyMethodDef module_methods[] = {
	{"call_soon", (PyCFunction)(void (*)(void))aio_call_soon, METH_FASTCALL,
	 "call_soon(ready, loop, callback, args, context) -> Handle, appended to ready"},
	{"caller", (PyCFunction)aio_caller, METH_VARARGS,
	 "caller(loop, kind, base): loop's call_soon (0), call_at (1) or call_later (2) in C"},
	{"runner", (PyCFunction)aio_runner, METH_VARARGS,
	 "runner(loop, selector, base, every, after, busy=None, me=0): loop's _run_once in C"},
	{"run_ready", (PyCFunction)(void (*)(void))aio_run_ready, METH_FASTCALL,
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

	if (aio_handles_init() < 0 || aio_callers_init() < 0 || aio_runner_init() < 0 ||
	    aio_tasks_init() < 0)
		return NULL;
	m = PyModule_Create(&module);
	if (!m)
		return NULL;
	if (PyModule_AddObjectRef(m, "Handle", (PyObject *)&aio_HandleType) < 0 ||
	    PyModule_AddObjectRef(m, "TimerHandle", (PyObject *)&aio_TimerHandleType) < 0) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
