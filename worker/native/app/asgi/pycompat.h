/* The few CPython functions whose name differs between the versions we
 * build on (3.11 and 3.13: README "Python versions tested").
 *
 * 3.13 moved two private functions this extension used out of the public
 * headers: the build went on with implicit declarations (a warning, int
 * assumed), which setup.py now makes an error. Each has a public
 * replacement: 3.13's own public function where it has one, else the same
 * steps through the stable API.
 */
#ifndef SOCKHERD_PYCOMPAT_H
#define SOCKHERD_PYCOMPAT_H

#include <Python.h>

/* 1 if the str u equals the NUL-terminated ASCII s, else 0; never raises
 * (u must be a str). */
static inline int sh_str_is(PyObject *u, const char *s)
{
#if PY_VERSION_HEX >= 0x030D0000
	return PyUnicode_EqualToUTF8(u, s);
#else
	return _PyUnicode_EqualToASCIIString(u, s);
#endif
}

/* Raise StopIteration(value): the end of an iterator's __next__ with a
 * value (an await's result). The instance is made first, so a tuple or an
 * exception given as value stays the one value (PyErr_SetObject would
 * unpack a tuple into arguments), as _PyGen_SetStopIterationValue does. */
static inline void sh_stop_iteration(PyObject *value)
{
	PyObject *e = PyObject_CallOneArg(PyExc_StopIteration, value);
	if (e) {
		PyErr_SetObject(PyExc_StopIteration, e);
		Py_DECREF(e);
	}
}

#endif
