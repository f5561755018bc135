/* The WSGI adapter's response object: start_response (call it), write()
 * and the head's timing (PEP 3333); its framing is the codec's (struct
 * h1_frame, h1_response.c), running the app and its body are wsgi_app.c's
 * and wsgi_body.c's.
 *
 * The rules (each has a test in tests/worker/test_wsgi.py or
 * test_response_*.py):
 *  - a body given whole (a list or tuple of bytes, an iterable of one
 *    item, an iterator exhausted after its first) gets a Content-Length,
 *    and its head and body go out in one write; any other block goes out
 *    as it comes (PEP 3333: the server must not delay any block): an
 *    event stream's first event does not wait for its second;
 *  - a 1xx is not a final status: start_response refuses it (a 500);
 *  - start_response's exc_info: the status may change until body bytes
 *    were given; after that the app's exception is raised again; one that
 *    is not an exception triple is a TypeError (check_exc_info).
 *
 * May call: the codec (h1_head.c, h1_response.c), the connection layer (conn_io.c).
 */
#include <string.h>

#include "wsgi.h"

/* ---- the head and the body's blocks ------------------------------------------------------ */

static int flush_first(Respond *r, long long known, int wait)
{
	PyObject *first = r->first;
	int rc;

	if (r->headers_sent)
		return 0;
	r->headers_sent = 1;
	r->first = NULL;
	rc = h1_head(r->conn, &r->f, known);
	if (rc == 0 && first)
		rc = h1_send_body(r->conn, &r->f, PyBytes_AS_STRING(first),
		                  (size_t)PyBytes_GET_SIZE(first), 0, wait);
	Py_XDECREF(first);
	return rc;
}

static int check_started(Respond *r, const char *what)
{
	if (!r->status) {
		PyErr_Format(PyExc_AssertionError, "%s before start_response", what);
		return -1;
	}
	return 0;
}

/* write(data): the app's write callable, and each chunk of its iterable;
 * `hold`: the body may be whole with this chunk (its length known at the
 * end: a Content-Length), so a first chunk waits for finish(); `wait`:
 * as h1_send_body's. */
int write_chunk(Respond *r, PyObject *data, int now, int hold, int wait)
{
	Py_buffer b;
	int rc;

	if (check_started(r, "write()") < 0)
		return -1;
	if (r->finished) {
		/* a write callable kept past its request: the connection serves
		 * another one now, or none */
		PyErr_SetString(PyExc_RuntimeError, "write() after the response ended");
		return -1;
	}
	if (r->parked) {
		/* a thread of the app's, while the loop sends the body the app
		 * returned: its bytes would land inside that body */
		PyErr_SetString(PyExc_RuntimeError, "write() while the returned body is being sent");
		return -1;
	}
	if (!PyBytes_Check(data) && !PyByteArray_Check(data) && !PyMemoryView_Check(data)) {
		PyErr_Format(PyExc_TypeError, "response body chunks must be bytes, not %s",
		             Py_TYPE(data)->tp_name);
		return -1;
	}
	if (PyObject_GetBuffer(data, &b, PyBUF_SIMPLE) < 0)
		return -1;
	if (b.len)
		r->started = 1;
	if (hold && !r->headers_sent && !r->first) {
		/* the first chunk, and the caller knows it may be the whole body */
		r->first = PyBytes_CheckExact(data) ? Py_NewRef(data)
		                                     : PyBytes_FromStringAndSize(b.buf, b.len);
		PyBuffer_Release(&b);
		return r->first ? 0 : -1;
	}
	/* the head goes out with this chunk (a held one first): the length
	 * is unknown unless the app gave it */
	rc = flush_first(r, -1, wait);
	if (rc == 0)
		rc = h1_send_body(r->conn, &r->f, b.buf, (size_t)b.len, now, wait);
	PyBuffer_Release(&b);
	return rc;
}

int finish(Respond *r, int wait)
{
	if (!r->status) {
		PyErr_SetString(PyExc_AssertionError, "the app returned without calling start_response");
		return -1;
	}
	if (!r->headers_sent && flush_first(r, r->first ? PyBytes_GET_SIZE(r->first) : 0, wait) < 0)
		return -1;
	return h1_end_body(r->conn, &r->f);
}

/* ---- the type ------------------------------------------------------------------------------- */

Respond *respond_new(struct conn *c, int http11, int keep, int head_only)
{
	Respond *r = PyObject_New(Respond, &RespondType);

	if (!r)
		return NULL;
	r->conn = (struct conn *)Py_NewRef(c);
	r->f.http11 = http11;
	r->f.keep = keep;
	r->f.head_only = head_only;
	r->f.bodiless = r->headers_sent = r->f.chunked = r->started = r->finished = 0;
	r->f.app_date = r->f.app_server = 0;
	r->f.length = -1;
	r->f.code = 0;
	r->f.sent = 0;
	r->status = r->f.prefix = r->first = r->out_headers = NULL;
	r->parked = r->all_here = 0;
	r->env = r->result = r->it = r->tail = NULL;
	r->tail_i = r->items = 0;
	r->tail_off = 0;
	r->since = 0.0;
	r->file_fd = -1;
	r->file_off = 0;
	r->file_left = 0;
	return r;
}

static void Respond_dealloc(Respond *r)
{
	Py_XDECREF(r->conn);
	Py_XDECREF(r->status);
	Py_XDECREF(r->out_headers);
	Py_XDECREF(r->f.prefix);
	Py_XDECREF(r->first);
	Py_XDECREF(r->env);
	Py_XDECREF(r->result);
	Py_XDECREF(r->it);
	Py_XDECREF(r->tail);
	PyObject_Free(r);
}

/* exc_info is a sys.exc_info() triple of an exception: (type, instance
 * of it, traceback or None); 0, or -1 with a TypeError. Checked before
 * it may be raised again: PyErr_Restore takes anything, and a restored
 * non-exception (the (None, None, None) of sys.exc_info() outside an
 * except block, a class, a string) corrupted memory and ended the loop
 * thread (issue 18 §1). The message names types only: the app's own
 * __repr__ is not called here. */
static int check_exc_info(PyObject *exc_info)
{
	PyObject *t, *v, *tb;

	if (!PyTuple_Check(exc_info) || PyTuple_GET_SIZE(exc_info) != 3) {
		PyErr_Format(PyExc_TypeError, "start_response: exc_info must be None or a "
		             "sys.exc_info() triple, not %.100s", Py_TYPE(exc_info)->tp_name);
		return -1;
	}
	t = PyTuple_GET_ITEM(exc_info, 0);
	v = PyTuple_GET_ITEM(exc_info, 1);
	tb = PyTuple_GET_ITEM(exc_info, 2);
	if (!PyExceptionClass_Check(t) || !PyExceptionInstance_Check(v) ||
	    !PyObject_TypeCheck(v, (PyTypeObject *)t) || (tb != Py_None && !PyTraceBack_Check(tb))) {
		PyErr_Format(PyExc_TypeError, "start_response: exc_info must hold an exception "
		             "(type, instance, traceback), not (%.100s, %.100s, %.100s)",
		             Py_TYPE(t)->tp_name, Py_TYPE(v)->tp_name, Py_TYPE(tb)->tp_name);
		return -1;
	}
	return 0;
}

/* start_response(status, headers, exc_info=None) -> write */
PyObject *Respond_call(Respond *r, PyObject *args, PyObject *kw)
{
	static char *names[] = {"status", "headers", "exc_info", NULL};
	PyObject *status, *headers, *exc_info = Py_None, *prefix;
	long long length;
	int flags, code;

	if (!kw && PyTuple_GET_SIZE(args) >= 2 && PyTuple_GET_SIZE(args) <= 3) {
		status = PyTuple_GET_ITEM(args, 0);            /* the usual call: no keywords */
		headers = PyTuple_GET_ITEM(args, 1);
		if (PyTuple_GET_SIZE(args) == 3)
			exc_info = PyTuple_GET_ITEM(args, 2);
	}
	else if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O:start_response", names, &status,
	                                      &headers, &exc_info))
		return NULL;
	if (exc_info != Py_None) {
		if (check_exc_info(exc_info) < 0)
			return NULL;
		/* PEP 3333: too late to change the status once body bytes were
		 * given or the head went out (even with an empty body so far) */
		if (r->started || r->headers_sent || r->finished) {
			PyObject *v = PyTuple_GET_ITEM(exc_info, 1), *tb = PyTuple_GET_ITEM(exc_info, 2);

			/* normalized: the instance's own type, checked above */
			PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(v)), Py_NewRef(v),
			              tb == Py_None ? NULL : Py_NewRef(tb));
			return NULL;
		}
	}
	else if (r->status) {
		PyErr_SetString(PyExc_AssertionError, "start_response called twice without exc_info");
		return NULL;
	}
	/* checked and serialised in C: status, token names, values without
	 * CTL, one Content-Length in digits; hop-by-hop headers dropped */
	if (head_cached(status, headers, &prefix, &length, &flags, &code) < 0)
		return NULL;
	if (code < 200) {
		/* a 1xx is interim, never the answer: sent as one, the request
		 * would stay unanswered and the next answer pair with it */
		Py_DECREF(prefix);
		PyErr_Format(PyExc_ValueError, "%R: a 1xx status is not a final response", status);
		return NULL;
	}
	Py_XSETREF(r->f.prefix, prefix);
	Py_XSETREF(r->status, Py_NewRef(status));
	if (r->conn->srv->access_headers)     /* only a format naming a response header */
		Py_XSETREF(r->out_headers, Py_NewRef(headers));
	if (flags & HEAD_CLOSE)
		r->f.keep = 0;
	r->f.app_date = (flags & HEAD_APP_DATE) != 0;
	r->f.app_server = (flags & HEAD_APP_SERVER) != 0;
	r->f.bodiless = code == 204 || code == 304;
	r->f.code = code;
	r->f.length = length;
	return PyObject_GetAttrString((PyObject *)r, "write");
}

static PyObject *Respond_write(Respond *r, PyObject *data)
{
	if (write_chunk(r, data, 1, 0, 1) < 0)
		return NULL;
	Py_RETURN_NONE;
}

PyDoc_STRVAR(send_head_doc,
"send_head(count): the head now, for a body of count bytes the caller sends\n"
"itself (sendfile); the head goes into the connection's output.");

static PyObject *Respond_send_head(Respond *r, PyObject *arg)
{
	long long count = PyLong_AsLongLong(arg);

	if (count == -1 && PyErr_Occurred())
		return NULL;
	if (check_started(r, "send_head()") < 0)
		return NULL;
	if (r->headers_sent || r->first) {
		PyErr_SetString(PyExc_RuntimeError, "the head went out already");
		return NULL;
	}
	r->headers_sent = 1;
	if (h1_head(r->conn, &r->f, count) < 0)
		return NULL;
	Py_RETURN_NONE;
}

static PyMethodDef Respond_methods[] = {
	{"write", (PyCFunction)Respond_write, METH_O, "write(data): the WSGI write callable."},
	{"send_head", (PyCFunction)Respond_send_head, METH_O, send_head_doc},
	{NULL},
};

static PyObject *get_status(Respond *r, void *c)
{
	(void)c;
	return Py_NewRef(r->status ? r->status : Py_None);
}

static PyObject *get_length(Respond *r, void *c)
{
	(void)c;
	return r->f.length < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(r->f.length);
}

static PyObject *get_sent(Respond *r, void *c)
{
	(void)c;
	return PyLong_FromUnsignedLongLong(r->f.sent);
}

static int set_sent(Respond *r, PyObject *v, void *c)
{
	unsigned long long n = v ? PyLong_AsUnsignedLongLong(v) : (unsigned long long)-1;

	(void)c;
	if (n == (unsigned long long)-1 && (!v || PyErr_Occurred()))
		return -1;
	r->f.sent = n;
	return 0;
}

#define FLAG(name, field)                                                               \
	static PyObject *get_##name(Respond *r, void *c) { (void)c; return PyBool_FromLong(field); }
FLAG(keep, r->f.keep)
FLAG(head_only, r->f.head_only)
FLAG(bodiless, r->f.bodiless)
FLAG(headers_sent, r->headers_sent)
FLAG(started, r->started)

static int set_keep(Respond *r, PyObject *v, void *c)
{
	int t = v ? PyObject_IsTrue(v) : -1;

	(void)c;
	if (t < 0)
		return -1;
	r->f.keep = (unsigned)t;
	return 0;
}

static PyObject *get_held(Respond *r, void *c)
{
	(void)c;
	return PyBool_FromLong(r->first != NULL);
}

static PyGetSetDef Respond_getset[] = {
	{"status", (getter)get_status, NULL, "the status the app gave, or None", NULL},
	{"length", (getter)get_length, NULL, "the announced Content-Length, or None", NULL},
	{"sent", (getter)get_sent, (setter)set_sent, "body bytes sent", NULL},
	{"keep", (getter)get_keep, (setter)set_keep, "the connection may serve on", NULL},
	{"head_only", (getter)get_head_only, NULL, "a HEAD request: no body goes out", NULL},
	{"bodiless", (getter)get_bodiless, NULL, "1xx, 204, 304: no body goes out", NULL},
	{"headers_sent", (getter)get_headers_sent, NULL, "the head went out", NULL},
	{"started", (getter)get_started, NULL, "body bytes were given", NULL},
	{"held", (getter)get_held, NULL, "a first chunk is held", NULL},
	{NULL},
};

PyTypeObject RespondType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "sockherd.worker._http.Respond",
	.tp_doc = "One request's start_response (call it), write() and response framing.",
	.tp_basicsize = sizeof(Respond),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_dealloc = (destructor)Respond_dealloc,
	.tp_call = (ternaryfunc)Respond_call,
	.tp_methods = Respond_methods,
	.tp_getset = Respond_getset,
};
