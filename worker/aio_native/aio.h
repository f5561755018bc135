/* sockherd.worker._aio's parts, across its files: handles.c (the module,
 * the handles, call_soon / call_at / call_later, the iteration) and
 * tasks.c (create_task, create_future, get_debug). */
#ifndef SOCKHERD_AIO_H
#define SOCKHERD_AIO_H

#include <Python.h>

/* tasks.c: task_maker(loop, base), future_maker(loop, base) and not_debugging() (the module's
 * functions), and its constants (module init: 0 or -1) */
PyObject *aio_task_maker(PyObject *mod, PyObject *args);
PyObject *aio_future_maker(PyObject *mod, PyObject *args);
PyObject *aio_not_debugging(PyObject *mod, PyObject *noarg);
int aio_tasks_init(void);

#endif /* SOCKHERD_AIO_H */
