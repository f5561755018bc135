/* One request's response: start_response, write() and the framing, and
 * respond(), which runs the app and frames what it returns (PEP 3333).
 *
 * The rules (each has a test in tests/worker/test_wsgi.py or
 * test_response_*.py):
 *  - a body given whole (a list or tuple of bytes, an iterable of one
 *    item, an iterator exhausted after its first) gets a Content-Length,
 *    and its head and body go out in one write; any other block goes out
 *    as it comes (PEP 3333: the server must not delay any block): an
 *    event stream's first event does not wait for its second;
 *  - the app's Date and Server fields win: ours are left out;
 *  - a 1xx is not a final status: start_response refuses it (a 500);
 *  - a length the app did not give and cannot be known: chunked on
 *    HTTP/1.1, else the connection closes after the body;
 *  - never more bytes than announced (the rest is cut and the connection
 *    closes), and fewer than announced closes it too;
 *  - HEAD, 204 and 304 send no body, whatever the app gives;
 *  - start_response's exc_info: the status may change until body bytes
 *    were given; after that the app's exception is raised again; one that
 *    is not an exception triple is a TypeError (check_exc_info);
 *  - an exception of the app, any BaseException: 500 if nothing was sent,
 *    else the connection closes; logged with the request line, the loop
 *    thread serves on (tests/worker/test_app_containment.py).
 * Pending output past HIGH_WATER makes the app's write() wait (bounded by
 * body_timeout) for the client to read; a body the app returned goes out
 * from the loop instead (parked on its connection, see "running the app"):
 * a client that does not read never costs more than a bounded buffer, nor
 * holds a loop thread.
 */
#include <errno.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/uio.h>
#include <time.h>

#include "http.h"

/* ---- the Date line, formatted once a second per thread ----------------------- */

static _Thread_local time_t date_sec = -1;
static _Thread_local char date_line[48];
static _Thread_local size_t date_len;

/* A new second: the line again (once a second per thread, off the hot path). */
static __attribute__((noinline)) void date_format(time_t t)
{
	static const char days[] = "SunMonTueWedThuFriSat";
	static const char months[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
	struct tm tm;

	gmtime_r(&t, &tm);
	/* by hand: strftime's %a and %b follow the locale */
	date_len = (size_t)snprintf(date_line, sizeof(date_line),
	                            "Date: %.3s, %02d %.3s %04d %02d:%02d:%02d GMT\r\n",
	                            days + 3 * tm.tm_wday, tm.tm_mday, months + 3 * tm.tm_mon,
	                            tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
	date_sec = t;
}

/* static inline for emit_head (the hot path: an exported function is
 * called through the PLT under -fPIC); http_date for hconn.c's refusals */
static inline void date_now(const char **s, size_t *n)
{
	time_t t = time(NULL);

	if (t != date_sec)
		date_format(t);
	*s = date_line;
	*n = date_len;
}

void http_date(const char **s, size_t *n)
{
	date_now(s, n);
}

/* ---- framing --------------------------------------------------------------------------- */

static int emit(Respond *r, const char *s, size_t n)
{
	return hconn_send(r->conn, s, n, 0);
}

/* The head: the app's status line and fields, Date, Server, and the
 * framing we choose; known is the body's length if known, else -1. */
static int emit_head(Respond *r, long long known)
{
	Server *s = r->conn->srv;
	const char *d;
	size_t dn;
	char line[64];

	if (emit(r, PyBytes_AS_STRING(r->prefix), (size_t)PyBytes_GET_SIZE(r->prefix)) < 0)
		return -1;
	date_now(&d, &dn);
	if ((!r->app_date && emit(r, d, dn) < 0) ||
	    (!r->app_server &&
	     emit(r, PyBytes_AS_STRING(s->server_line), (size_t)PyBytes_GET_SIZE(s->server_line)) < 0))
		return -1;
	if (r->bodiless || (r->head_only && known == 0))
		/* nothing to count: no body goes out; a HEAD answered with no
		 * body at all (werkzeug gives () for HEAD) says nothing of the
		 * GET's length, which may be a stream: no Content-Length: 0 */
		known = -1;
	if (r->length < 0 && known >= 0) {
		r->length = known;
		if (emit(r, line, (size_t)snprintf(line, sizeof(line), "Content-Length: %lld\r\n",
		                                   known)) < 0)
			return -1;
	}
	if (r->length < 0 && !r->head_only && !r->bodiless) {
		if (r->http11) {
			r->chunked = 1;
			if (emit(r, "Transfer-Encoding: chunked\r\n", 28) < 0)
				return -1;
		}
		else
			r->keep = 0;                     /* HTTP/1.0, length unknown: close ends it */
	}
	if (s->draining)
		/* decided now, not when the request came: one already in the app
		 * when the drain began was answered keep-alive, and its client's
		 * next request raced the drain's idle close (review) */
		r->keep = 0;
	if (!r->keep) {
		if (emit(r, "Connection: close\r\n", 19) < 0)
			return -1;
	}
	else if (!r->http11 && emit(r, "Connection: keep-alive\r\n", 24) < 0)
		return -1;
	return emit(r, "\r\n", 2);
}

/* Body bytes after the head; `now`: try the socket at once (a streaming
 * app: the client sees each chunk as it comes); `wait`: past HIGH_WATER,
 * wait here for the client to read (write(), the slow path), else the
 * caller parks the body (respond, iterate). */
static int send_body(Respond *r, const char *data, size_t n, int now, int wait)
{
	HttpConn *c = r->conn;
	char line[24];

	if (c->closed) {
		PyErr_SetString(ClientGone, "the client went away");
		return -1;
	}
	if (r->head_only || r->bodiless || !n)
		return now ? hconn_flush(c) : 0;         /* the head, at least, goes now */
	if (r->length >= 0 && (r->sent >= (unsigned long long)r->length ||
	                       n > (unsigned long long)r->length - r->sent)) {
		/* never past what we announced; sent may be past it already (it
		 * is writable from Python, for sendfile: an app that set it on its
		 * start_response made this a huge n, or wrapped sent + n, a read
		 * far past data, and the worker died of SIGSEGV: review) */
		n = r->sent >= (unsigned long long)r->length
		    ? 0 : (size_t)((unsigned long long)r->length - r->sent);
		r->keep = 0;
		if (!n)
			return now ? hconn_flush(c) : 0;
	}
	r->sent += n;
	if (r->chunked) {
		if (hconn_send(c, line, (size_t)snprintf(line, sizeof(line), "%zx\r\n", n), 0) < 0 ||
		    hconn_send(c, data, n, 0) < 0 || hconn_send(c, "\r\n", 2, now) < 0)
			return -1;
	}
	else if (hconn_send(c, data, n, now) < 0)
		return -1;
	if (wait && hconn_pending(c) > HIGH_WATER)
		return hconn_flush_wait(c, c->srv->body_timeout, LOW_WATER);
	return 0;
}

static int flush_first(Respond *r, long long known, int wait)
{
	PyObject *first = r->first;
	int rc;

	if (r->headers_sent)
		return 0;
	r->headers_sent = 1;
	r->first = NULL;
	rc = emit_head(r, known);
	if (rc == 0 && first)
		rc = send_body(r, PyBytes_AS_STRING(first), (size_t)PyBytes_GET_SIZE(first), 0, wait);
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
 * as send_body's. */
static int write_chunk(Respond *r, PyObject *data, int now, int hold, int wait)
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
		rc = send_body(r, b.buf, (size_t)b.len, now, wait);
	PyBuffer_Release(&b);
	return rc;
}

static int finish(Respond *r, int wait)
{
	if (!r->status) {
		PyErr_SetString(PyExc_AssertionError, "the app returned without calling start_response");
		return -1;
	}
	if (!r->headers_sent && flush_first(r, r->first ? PyBytes_GET_SIZE(r->first) : 0, wait) < 0)
		return -1;
	if (r->chunked && hconn_send(r->conn, "0\r\n\r\n", 5, 0) < 0)
		return -1;
	if (r->length >= 0 && r->sent < (unsigned long long)r->length && !r->head_only &&
	    !r->bodiless)
		r->keep = 0;                         /* the app sent less than it announced */
	return 0;
}

/* ---- the type ------------------------------------------------------------------------------- */

static Respond *respond_new(HttpConn *c, int http11, int keep, int head_only)
{
	Respond *r = PyObject_New(Respond, &RespondType);

	if (!r)
		return NULL;
	r->conn = (HttpConn *)Py_NewRef(c);
	r->http11 = http11;
	r->keep = keep;
	r->head_only = head_only;
	r->bodiless = r->headers_sent = r->chunked = r->started = r->finished = 0;
	r->app_date = r->app_server = 0;
	r->length = -1;
	r->code = 0;
	r->sent = 0;
	r->status = r->prefix = r->first = NULL;
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
	Py_XDECREF(r->prefix);
	Py_XDECREF(r->first);
	Py_XDECREF(r->env);
	Py_XDECREF(r->result);
	Py_XDECREF(r->it);
	Py_XDECREF(r->tail);
	PyObject_Free(r);
}

/* The last head serialised by this thread, by identity: an app that gives
 * the same status and the same header tuples (code constants, as most
 * do) gets the checked prefix again without the checks. The references
 * held keep the identities from being reused. Per thread: no lock. */
#define HEAD_CACHE_MAX 16
static _Thread_local struct {
	PyObject *status, *prefix, *items[HEAD_CACHE_MAX];
	Py_ssize_t n;
	long long length;
	int flags, code;
} hc;

static int head_cached(PyObject *status, PyObject *headers, PyObject **prefix, long long *length,
                       int *flags, int *code)
{
	PyObject **items;
	Py_ssize_t n;

	if (!PyList_CheckExact(headers) && !PyTuple_CheckExact(headers))
		return head_from(status, headers, prefix, length, flags, code);
	n = PySequence_Fast_GET_SIZE(headers);
	items = PySequence_Fast_ITEMS(headers);
	if (hc.prefix && hc.status == status && hc.n == n &&
	    (!n || !memcmp(hc.items, items, (size_t)n * sizeof(*items)))) {
		*prefix = Py_NewRef(hc.prefix);
		*length = hc.length;
		*flags = hc.flags;
		*code = hc.code;
		return 0;
	}
	if (head_from(status, headers, prefix, length, flags, code) < 0)
		return -1;
	if (n > HEAD_CACHE_MAX || !PyUnicode_CheckExact(status))
		return 0;
	for (Py_ssize_t i = 0; i < n; i++)
		if (!PyTuple_CheckExact(items[i]))          /* an immutable pair only */
			return 0;
	Py_XDECREF(hc.status);
	Py_XDECREF(hc.prefix);
	for (Py_ssize_t i = 0; i < hc.n; i++)
		Py_DECREF(hc.items[i]);
	hc.status = Py_NewRef(status);
	hc.prefix = Py_NewRef(*prefix);
	for (Py_ssize_t i = 0; i < n; i++)
		hc.items[i] = Py_NewRef(items[i]);
	hc.n = n;
	hc.length = *length;
	hc.flags = *flags;
	hc.code = *code;
	return 0;
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
static PyObject *Respond_call(Respond *r, PyObject *args, PyObject *kw)
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
	Py_XSETREF(r->prefix, prefix);
	Py_XSETREF(r->status, Py_NewRef(status));
	if (flags & HEAD_CLOSE)
		r->keep = 0;
	r->app_date = (flags & HEAD_APP_DATE) != 0;
	r->app_server = (flags & HEAD_APP_SERVER) != 0;
	r->bodiless = code == 204 || code == 304;
	r->code = code;
	r->length = length;
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
	if (emit_head(r, count) < 0)
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
	return r->length < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(r->length);
}

static PyObject *get_sent(Respond *r, void *c)
{
	(void)c;
	return PyLong_FromUnsignedLongLong(r->sent);
}

static int set_sent(Respond *r, PyObject *v, void *c)
{
	unsigned long long n = v ? PyLong_AsUnsignedLongLong(v) : (unsigned long long)-1;

	(void)c;
	if (n == (unsigned long long)-1 && (!v || PyErr_Occurred()))
		return -1;
	r->sent = n;
	return 0;
}

#define FLAG(name)                                                                      \
	static PyObject *get_##name(Respond *r, void *c) { (void)c; return PyBool_FromLong(r->name); }
FLAG(keep)
FLAG(head_only)
FLAG(bodiless)
FLAG(headers_sent)
FLAG(started)

static int set_keep(Respond *r, PyObject *v, void *c)
{
	int t = v ? PyObject_IsTrue(v) : -1;

	(void)c;
	if (t < 0)
		return -1;
	r->keep = (unsigned)t;
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

/* ---- running the app -------------------------------------------------------------------------- */

/* A body past HIGH_WATER never waits for its client on the loop thread
 * (issue 21: a client that did not read a 10 MB answer held the thread,
 * and every other connection of it, for body_timeout): the connection
 * keeps it (c->parked) and the loop sends the rest on its POLLOUT events,
 * whichever loop thread handles them, before serving its next request.
 * A list of bytes stays in the app's objects (the tail, sent by writev
 * straight from them); an iterator is resumed when the output drains below
 * LOW_WATER, so a connection holds at most HIGH_WATER plus one block. */

#define TAIL_IOV 64

static int iterate(Respond *r, int can_park);

/* Sends what the kernel takes of the pending output and the tail after
 * it, in order. 0 when all of it went out (or the announced length was
 * reached: the rest is cut and the connection closes), RESPOND_PARKED
 * when the kernel is full, -1 with ClientGone (closed: reset, EPIPE). */
static int push_tail(Respond *r)
{
	HttpConn *c = r->conn;
	PyObject *t = r->tail;
	Py_ssize_t n = PyTuple_GET_SIZE(t);

	for (;;) {
		struct iovec iov[TAIL_IOV];
		int k = 0;
		size_t out = hconn_pending(c), asked = out, took, body;
		/* emit_head set a length: the list's total, or the app's own */
		unsigned long long room = r->sent < (unsigned long long)r->length
		                          ? (unsigned long long)r->length - r->sent : 0;
		ssize_t w;

		if (c->closed) {
			PyErr_SetString(ClientGone, "the client went away");
			return -1;
		}
		if (out) {
			iov[k].iov_base = c->out + c->ostart;
			iov[k++].iov_len = out;
		}
		for (Py_ssize_t i = r->tail_i; i < n && k < TAIL_IOV && room; i++) {
			PyObject *b = PyTuple_GET_ITEM(t, i);
			size_t off = i == r->tail_i ? r->tail_off : 0;
			size_t len = (size_t)PyBytes_GET_SIZE(b) - off;

			if (len > room)
				len = (size_t)room;
			if (!len)
				continue;
			iov[k].iov_base = PyBytes_AS_STRING(b) + off;
			iov[k++].iov_len = len;
			room -= len;
			asked += len;
		}
		if (!k)
			break;
		w = writev(c->fd, iov, k);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return RESPOND_PARKED;
			hconn_fail(c);
			PyErr_SetString(ClientGone, "the client went away");
			return -1;
		}
		c->wrote += (unsigned long long)w;
		took = (size_t)w < out ? (size_t)w : out;
		if (took)
			hconn_taken(c, took);
		body = (size_t)w - took;
		r->sent += body;
		while (body) {
			size_t left = (size_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(t, r->tail_i)) - r->tail_off;

			if (body < left) {
				r->tail_off += body;
				body = 0;
			}
			else {
				body -= left;
				r->tail_i++;
				r->tail_off = 0;
			}
		}
		if ((size_t)w < asked)
			return RESPOND_PARKED;            /* the kernel is full: its POLLOUT resumes */
	}
	for (Py_ssize_t i = r->tail_i; i < n; i++)
		if ((size_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(t, i)) > (i == r->tail_i ? r->tail_off : 0)) {
			r->keep = 0;                     /* past the app's Content-Length: cut */
			break;
		}
	Py_CLEAR(r->tail);
	return 0;
}

size_t respond_owed(const Respond *r)
{
	size_t owed = r->file_fd >= 0 ? (size_t)r->file_left : 0;

	if (r->tail)
		for (Py_ssize_t i = r->tail_i; i < PyTuple_GET_SIZE(r->tail); i++)
			owed += (size_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(r->tail, i)) -
			        (i == r->tail_i ? r->tail_off : 0);
	return owed ? owed : 1;
}

/* A list or tuple of bytes, nothing given yet: its length is known, so
 * it gets a Content-Length, and goes out without holding a chunk; past
 * HIGH_WATER (can_park), as the tail. 0, RESPOND_PARKED or -1. */
static int body_sequence(Respond *r, PyObject *seq, int can_park)
{
	HttpConn *c = r->conn;
	Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
	PyObject **items = PySequence_Fast_ITEMS(seq);
	long long total = 0;

	if (!r->status || r->headers_sent || r->first)
		goto one_by_one;
	for (Py_ssize_t i = 0; i < n; i++) {
		if (!PyBytes_CheckExact(items[i]))
			goto one_by_one;
		total += PyBytes_GET_SIZE(items[i]);
	}
	if (total)
		r->started = 1;
	r->headers_sent = 1;
	if (emit_head(r, total) < 0)
		return -1;
	if (can_park && total && !r->head_only && !r->bodiless &&
	    hconn_pending(c) + (unsigned long long)total > HIGH_WATER) {
		/* a tuple of the same objects (no byte copied): the app's other
		 * threads may change its list while the loop sends it */
		r->tail = PySequence_Tuple(seq);
		if (!r->tail)
			return -1;
		return push_tail(r);
	}
	/* each item held while it is sent: a blocked writer lets the GIL go,
	 * and the app's other threads could change its list meanwhile */
	for (Py_ssize_t i = 0; i < n && i < PySequence_Fast_GET_SIZE(seq); i++) {
		PyObject *item = Py_NewRef(PySequence_Fast_ITEMS(seq)[i]);
		int rc = PyBytes_Check(item)
		         ? send_body(r, PyBytes_AS_STRING(item), (size_t)PyBytes_GET_SIZE(item), 0,
		                     !can_park)
		         : 0;
		Py_DECREF(item);
		if (rc < 0)
			return -1;
	}
	return 0;
one_by_one:
	/* all here: each block is held for one write, not flushed one by one */
	r->all_here = 1;
	r->it = PyObject_GetIter(seq);
	return r->it ? iterate(r, can_park) : -1;
}

/* The body's iterator, block by block, from where it is (a parked one's
 * resumption too). can_park: before taking a block, output past
 * HIGH_WATER parks it (RESPOND_PARKED); else a block past it waits for
 * the client (send_body). 0 when exhausted, -1 on error (the app's
 * included: next() is its code). */
static int iterate(Respond *r, int can_park)
{
	HttpConn *c = r->conn;
	PyObject *item;

	for (;;) {
		int rc = 0, whole = 0;

		if (can_park && hconn_pending(c) > HIGH_WATER)
			return RESPOND_PARKED;
		if (!(item = PyIter_Next(r->it)))
			break;
		if (r->all_here) {
			if (!PyBytes_Check(item) || PyBytes_GET_SIZE(item))
				rc = write_chunk(r, item, 0, 1, !can_park);
			Py_DECREF(item);
			if (rc < 0)
				return -1;
			continue;
		}
		if (!r->headers_sent && !r->first) {
			Py_ssize_t left = r->items == 1 ? 0 : PyObject_LengthHint(r->it, -1);

			if (left < 0 && PyErr_Occurred())
				rc = -1;
			whole = left == 0;
		}
		if (rc == 0 && (!PyBytes_Check(item) || PyBytes_GET_SIZE(item)))
			rc = write_chunk(r, item, !whole, whole, !can_park);
		Py_DECREF(item);
		if (rc < 0)
			return -1;
	}
	if (PyErr_Occurred())
		return -1;
	Py_CLEAR(r->it);
	return 0;
}

/* Any other iterable: each block goes out as the app gives it, but for a
 * body given whole: an iterable of one item (its len()), or an iterator
 * that says it is exhausted after its first block (a list's, Django's
 * response): that block is held for a Content-Length and one write. The
 * hints are the app's code: an exception there is the app's. */
static int body_iterable(Respond *r, PyObject *result, int can_park)
{
	r->items = PyObject_LengthHint(result, -1);
	if (r->items < 0 && PyErr_Occurred())
		return -1;
	r->it = PyObject_GetIter(result);
	return r->it ? iterate(r, can_park) : -1;
}

/* Sends what the kernel takes of the pending output, then of the file
 * span, by sendfile(2). 0 when all of it went out (a file that shrank
 * under us ends it short: the connection closes), RESPOND_PARKED when the
 * kernel is full, -1 with ClientGone (closed). */
static int push_file(Respond *r)
{
	HttpConn *c = r->conn;

	for (;;) {
		ssize_t n;

		if (c->closed) {
			PyErr_SetString(ClientGone, "the client went away");
			return -1;
		}
		if (hconn_pending(c)) {
			hconn_flush(c);                      /* the head first, in order */
			if (c->closed)
				continue;
			if (hconn_pending(c))
				return RESPOND_PARKED;
		}
		if (!r->file_left)
			break;
		n = sendfile(c->fd, r->file_fd, &r->file_off,
		             r->file_left > (1u << 30) ? (size_t)1 << 30 : (size_t)r->file_left);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return RESPOND_PARKED;
			hconn_fail(c);
			continue;
		}
		if (n == 0) {
			r->keep = 0;                         /* the file shrank: fewer bytes than announced */
			break;
		}
		c->wrote += (unsigned long long)n;
		r->sent += (unsigned long long)n;
		r->file_left -= (unsigned long long)n;
	}
	r->file_fd = -1;                             /* the app's: closed by its close() */
	return 0;
}

/* The app returned a FileWrapper of a regular file: sendfile. can_park:
 * wsgi.py's sendfile_response sends the head and says which span of the
 * file goes out; the loop sends it (push_file), parked while the client
 * does not read (the FileWrapper, kept as the result, holds the file
 * open). Else sendfile_response sends it all, waiting for the socket as
 * it needs. 1 if it did, RESPOND_PARKED, 0 if the result is to be
 * iterated, -1 on error. */
static int body_file(Respond *r, PyObject *result, int can_park)
{
	Server *s = r->conn->srv;
	PyObject *fd, *done;
	long ffd;
	long long off;
	unsigned long long count;
	int rc;

	if (!s->file_wrapper || !PyObject_TypeCheck(result, (PyTypeObject *)s->file_wrapper) ||
	    r->first || r->headers_sent)
		return 0;
	fd = PyObject_CallMethod(result, "regular_fd", NULL);
	if (!fd)
		return -1;
	ffd = PyLong_AsLong(fd);
	Py_DECREF(fd);
	if (ffd == -1 && PyErr_Occurred())
		return -1;
	if (ffd < 0)
		return 0;
	done = PyObject_CallFunction(s->sendfile, "OOOlO", r->conn, r, result, ffd,
	                             can_park ? Py_True : Py_False);
	if (!done)
		return -1;
	if (done == Py_None) {
		Py_DECREF(done);
		return 1;
	}
	if (!PyArg_ParseTuple(done, "LK", &off, &count)) {
		Py_DECREF(done);
		return -1;
	}
	Py_DECREF(done);
	r->file_fd = (int)ffd;
	r->file_off = (off_t)off;
	r->file_left = count;
	rc = push_file(r);
	return rc == 0 ? 1 : rc;
}

void report_exc(Server *s, PyObject *env, const char *what)
{
	/* the exception as the handled one while report() runs: it logs
	 * with exc_info=True, as log.exception would in an except block */
	PyObject *t, *v, *tb;
	PyErr_Fetch(&t, &v, &tb);
	PyErr_NormalizeException(&t, &v, &tb);
	if (tb && v)
		PyException_SetTraceback(v, tb);
	PyObject *prev = PyErr_GetHandledException();
	PyErr_SetHandledException(v);
	Py_XDECREF(t);
	Py_XDECREF(tb);
	PyErr_Clear();
	{
		PyObject *rc = PyObject_CallFunction(s->report, "Os", env ? env : Py_None, what);
		if (!rc)
			PyErr_WriteUnraisable(s->report);
		Py_XDECREF(rc);
	}
	PyErr_SetHandledException(prev);
	Py_XDECREF(prev);
	Py_XDECREF(v);
}

static void close_result(Server *s, PyObject *env, PyObject *result)
{
	PyObject *close, *rc;

	if (!result || PyList_CheckExact(result) || PyTuple_CheckExact(result) ||
	    PyBytes_CheckExact(result))
		return;
	close = PyObject_GetAttrString(result, "close");
	if (!close) {
		if (PyErr_ExceptionMatches(PyExc_AttributeError))
			PyErr_Clear();
		else
			report_exc(s, env, "close() of the app's response");
		return;
	}
	rc = PyObject_CallNoArgs(close);
	Py_DECREF(close);
	if (!rc)
		report_exc(s, env, "close() of the app's response");
	Py_XDECREF(rc);
}

static void access_log(Server *s, PyObject *env, Respond *r, double started)
{
	PyObject *rc = PyObject_CallFunction(s->access, "OOKd", env, r->status ? r->status : Py_None,
	                                     r->sent, started);

	if (!rc)
		PyErr_WriteUnraisable(s->access);
	Py_XDECREF(rc);
}

static int internal_error(HttpConn *c, PyObject *env, Respond **rp, int http11, int head_only)
{
	static const char body[] = "Internal Server Error\n";
	Respond *r = respond_new(c, http11, 0, head_only);
	PyObject *status, *headers, *w, *chunk;
	int rc = -1;

	if (!r)
		return -1;
	(*rp)->finished = 1;                       /* the app's own: over */
	Py_SETREF(*rp, r);
	status = PyUnicode_FromString("500 Internal Server Error");
	headers = Py_BuildValue("[(ss)(ss)]", "Content-Type", "text/plain", "Content-Length", "22");
	chunk = PyBytes_FromStringAndSize(body, (Py_ssize_t)sizeof(body) - 1);
	if (status && headers && chunk) {
		PyObject *args = PyTuple_Pack(2, status, headers);
		w = args ? Respond_call(r, args, NULL) : NULL;
		Py_XDECREF(args);
		if (w) {
			Py_DECREF(w);
			if (write_chunk(r, chunk, 0, 1, 1) == 0 && finish(r, 1) == 0)
				rc = 0;
		}
	}
	Py_XDECREF(status);
	Py_XDECREF(headers);
	Py_XDECREF(chunk);
	(void)env;
	return rc;
}

/* The end of a response (the app's iterable done, or failed, or its
 * client gone): the app's errors answered or logged, close() of its
 * iterable (once: PEP 3333), the access log, the counts. rc < 0: with the
 * error set. Takes r's reference; returns whether the connection may
 * serve on (as respond()). */
static int respond_end(HttpConn *c, Respond *r, int rc)
{
	Server *s = c->srv;
	PyObject *env = r->env, *result = r->result;     /* ours from here */
	double started = r->since;
	int http11 = r->http11, head_only = r->head_only, out;
	int count = 1;          /* 1: as r->code at the end; 0: no response; -1: counted */

	r->env = r->result = NULL;
	r->parked = 0;
	r->file_fd = -1;
	Py_CLEAR(r->it);
	Py_CLEAR(r->tail);
	if (rc < 0) {
		if (PyErr_ExceptionMatches(ClientGone)) {
			/* gone, or not reading: closed already (hconn_flush_wait), what
			 * is buffered goes nowhere. Still open: a request body that did
			 * not come; the answers owed before it (pipelined) still go
			 * out, then the connection closes (keep = 0 below; the send
			 * timer bounds the wait) */
			PyErr_Clear();
			if (!r->headers_sent)
				count = 0;                  /* no response at all: "other" */
		}
		else if (PyErr_ExceptionMatches(BadBody)) {
			PyObject *t, *v, *tb;
			int status = 400;
			const char *reason = "bad request body";

			PyErr_Fetch(&t, &v, &tb);
			PyErr_NormalizeException(&t, &v, &tb);
			PyObject *a = v ? PyObject_GetAttrString(v, "args") : NULL;
			if (a && PyTuple_Check(a) && PyTuple_GET_SIZE(a) == 2) {
				status = (int)PyLong_AsLong(PyTuple_GET_ITEM(a, 0));
				if (PyUnicode_Check(PyTuple_GET_ITEM(a, 1)))
					reason = PyUnicode_AsUTF8(PyTuple_GET_ITEM(a, 1));
				/* a BadBody the app raised itself may say anything: a
				 * refusal is a 4xx (it wrote "HTTP/1.1 -5 Error") */
				if (PyErr_Occurred() || !reason || status < 400 || status > 499) {
					PyErr_Clear();
					status = 400;
					reason = "bad request body";
				}
			}
			if (!r->headers_sent) {
				hconn_refuse(c, status, reason);    /* the app let it through: ours to say */
				count = -1;                         /* counted by the refusal */
			}
			Py_XDECREF(a);
			Py_XDECREF(t);
			Py_XDECREF(v);
			Py_XDECREF(tb);
		}
		else {
			/* any other exception is the app's error, a BaseException
			 * (SystemExit, KeyboardInterrupt, GeneratorExit, its own)
			 * too: raised on, it ended the loop thread and left its
			 * connection open with no timer (issue 18 §1); a loop thread
			 * never ends while its worker serves (DESIGN §5) */
			report_exc(s, env, "app");
			if (!r->headers_sent && !c->closed && internal_error(c, env, &r, http11, head_only) < 0)
				report_exc(s, env, "the 500 response");
		}
		r->keep = 0;
	}
	r->finished = 1;
	close_result(s, env, result);
	Py_XDECREF(result);
	if (s->access != Py_None)
		access_log(s, env, r, started);
	out = r->keep;
	if (count >= 0)
		srv_count(s, count ? r->code : 0);
	if (s->on_retire && s->requests >= s->retire_at) {
		/* max_requests: the worker asks to be replaced, once (>=: a
		 * limit set after that many requests, or passed by refusals,
		 * still fires at the next one) */
		PyObject *fn = s->on_retire, *ret;

		s->on_retire = NULL;
		ret = PyObject_CallNoArgs(fn);
		if (!ret)
			PyErr_WriteUnraisable(fn);
		Py_XDECREF(ret);
		Py_DECREF(fn);
	}
	Py_DECREF(r);
	Py_DECREF(env);
	return out;
}

int respond(HttpConn *c, PyObject *env, int can_park)
{
	Server *s = c->srv;
	struct hp_parser *hp = &c->parser->hp;
	int http11 = hp->ll.http_minor == 1, head_only = hp->ll.method == HTTP_HEAD;
	int keep = hp_keep_alive(hp) && !s->draining;       /* draining: Connection: close */
	PyObject *result;
	Respond *r = respond_new(c, http11, keep, head_only);
	int rc = -1;

	if (!r)
		return -1;
	r->since = s->access != Py_None ? mono_now() : 0.0;
	r->env = Py_NewRef(env);
	Py_XSETREF(c->response, (PyObject *)Py_NewRef(r));
	result = PyObject_CallFunctionObjArgs(s->app, env, (PyObject *)r, NULL);
	if (result) {
		r->result = result;
		if ((rc = body_file(r, result, can_park)) == 0) {
			if (PyList_CheckExact(result) || PyTuple_CheckExact(result))
				rc = body_sequence(r, result, can_park);
			else
				rc = body_iterable(r, result, can_park);
		}
		if (rc == RESPOND_PARKED) {
			/* the rest goes out from the loop: the connection holds r */
			r->parked = 1;
			c->parked = r;
			return RESPOND_PARKED;
		}
		if (rc >= 0)
			rc = finish(r, !can_park);
	}
	return respond_end(c, r, rc);
}

int respond_resume(HttpConn *c)
{
	Respond *r = c->parked;
	int rc;

	r->parked = 0;
	if (r->tail)
		rc = push_tail(r);
	else if (r->file_fd >= 0)
		rc = push_file(r);
	else if (hconn_pending(c) >= LOW_WATER)
		rc = RESPOND_PARKED;
	else
		rc = iterate(r, 1);                  /* the app's code again, contained below */
	if (rc == RESPOND_PARKED) {
		r->parked = 1;
		return RESPOND_PARKED;
	}
	c->parked = NULL;                        /* its reference is r's now */
	if (rc >= 0)
		rc = finish(r, 0);
	return respond_end(c, r, rc);
}

void respond_abandon(Respond *r)
{
	PyObject *t, *v, *tb;

	/* called from a close, maybe with an error of the closer's pending */
	PyErr_Fetch(&t, &v, &tb);
	r->parked = 0;
	PyErr_SetString(ClientGone, "the client went away");
	(void)respond_end(r->conn, r, -1);
	PyErr_Restore(t, v, tb);
}
