/* sockherd.worker._aio's parts, across its files, bottom up: tasks.c
 * (create_task, create_future, get_debug), handles.c (the handles, the
 * module's call_soon, the ready pass), callers.c (call_soon / call_at /
 * call_later bound to a loop, the loop's attributes, the clock), runner.c
 * (the iteration) and aio.c (the module). Each file's *_init makes its
 * constants at import: 0, or -1 with an exception. Every function here
 * runs under the GIL, on the loop thread of the objects it is given. */
#ifndef SOCKHERD_AIO_H
#define SOCKHERD_AIO_H

#include <Python.h>

/* tasks.c: task_maker(loop, base), future_maker(loop, base) and not_debugging() (the module's
 * functions), and its constants (module init: 0 or -1) */
PyObject *aio_task_maker(PyObject *mod, PyObject *args);
PyObject *aio_future_maker(PyObject *mod, PyObject *args);
PyObject *aio_not_debugging(PyObject *mod, PyObject *noarg);
int aio_tasks_init(void);

/* handles.c: asyncio's Handle and TimerHandle (runner.c reads a timer's
 * fields without a getattr) */

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

extern PyTypeObject aio_HandleType, aio_TimerHandleType;
/* a new handle (context None: a copy of the current one), or NULL */
Handle *aio_handle_make(PyTypeObject *type, PyObject *callback, PyObject *args,
                        PyObject *loop, PyObject *context);
/* the ready pass of one iteration: todo handles popped and run; None or NULL */
PyObject *aio_ready_pass(PyObject *popleft, Py_ssize_t todo);
PyObject *aio_call_soon(PyObject *mod, PyObject *const *a, Py_ssize_t n);
PyObject *aio_run_ready(PyObject *mod, PyObject *const *a, Py_ssize_t n);
int aio_handles_init(void);

/* callers.c: caller(loop, kind, base) (the module's function); loop.<name>
 * read from the instance dict first (a new reference, or NULL), its truth
 * (0/1, -1); time.monotonic's clock */
PyObject *aio_caller(PyObject *mod, PyObject *args);
PyObject *aio_loop_attr(PyObject *loop, PyObject *name);
int aio_loop_flag(PyObject *loop, PyObject *name);
double aio_mono(void);
int aio_callers_init(void);

/* runner.c: runner(loop, selector, base, every, after, busy=None, me=0) (the module's
 * function) */
PyObject *aio_runner(PyObject *mod, PyObject *args);
int aio_runner_init(void);

#endif /* SOCKHERD_AIO_H */
