/* One ASGI call (asgi.h: AsgiCall): the receive and send the app is
 * given, and the awaitables they return.
 *
 * Neither suspends unless it must: receive with body bytes here, and send
 * while the output is below HIGH_WATER, return an awaitable that is done
 * at once (AsgiReady: its __await__ ends at the first step), so a hello
 * or JSON app runs start to end in one step of its task. receive waits
 * (an asyncio future of the owner loop) for body bytes still to come or,
 * the body read, for the client's end; send waits while the output is
 * past HIGH_WATER, until it drains below LOW_WATER (asgi_resume): nothing
 * is buffered without bound.
 *
 * The messages are checked here, each error naming the message: they are
 * the app's errors (raised into it; asgi_app.c answers and logs them).
 *
 * May call: asgi_end.c (the response's end), asgi_scope.c (messages), the
 * codec (h1_head.c's head, h1_response.c's framing, h1_conn.c's input room, refusals), the
 * connection layer (conn_io.c).
 */
#include <string.h>

#include "asgi.h"
#include "pycompat.h"


/* the message keys send() reads, interned once: a C string key made a str
 * and hashed at every lookup cost a hello 4.4k of its 55k instructions
 * (callgrind, bench/http_callgrind.py --app asgi-hello) */
static PyObject *M_TYPE, *M_STATUS, *M_HEADERS, *M_BODY, *M_MORE_BODY, *M_RECEIVE, *M_SEND,
	*M_CREATE_TASK;

int asgi_call_make(void)
{
	struct { PyObject **at; const char *s; } keys[] = {
		{&M_TYPE, "type"}, {&M_STATUS, "status"}, {&M_HEADERS, "headers"}, {&M_BODY, "body"},
		{&M_MORE_BODY, "more_body"}, {&M_RECEIVE, "receive"}, {&M_SEND, "send"},
		{&M_CREATE_TASK, "create_task"},
	};

	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (!(*keys[i].at = PyUnicode_InternFromString(keys[i].s)))
			return -1;
	return 0;
}

static int asgi_call_methods(PyObject *call, PyObject **receive, PyObject **send);

/* ---- an awaitable done at once -------------------------------------------------------------- */

typedef struct {
	PyObject_HEAD
	PyObject *value;
} AsgiReady;

static AsgiReady ready_none = {PyObject_HEAD_INIT(&AsgiReadyType) NULL};

PyObject *asgi_ready(PyObject *value)
{
	AsgiReady *r;

	if (value == Py_None)
		return Py_NewRef((PyObject *)&ready_none);   /* stateless: one will do */
	r = PyObject_New(AsgiReady, &AsgiReadyType);
	if (r)
		r->value = Py_NewRef(value);
	return (PyObject *)r;
}

static void Ready_dealloc(AsgiReady *r)
{
	Py_XDECREF(r->value);
	PyObject_Free(r);
}

static PyObject *Ready_await(PyObject *self)
{
	return Py_NewRef(self);
}

/* the first step ends the await with the value (StopIteration) */
static PyObject *Ready_next(AsgiReady *r)
{
	if (r->value)
		sh_stop_iteration(r->value);
	return NULL;
}

static PyAsyncMethods ready_async = {.am_await = Ready_await};

PyTypeObject AsgiReadyType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "sockherd.worker._http.AsgiReady",
	.tp_doc = "An awaitable done at once (receive / send that need not wait).",
	.tp_basicsize = sizeof(AsgiReady),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_dealloc = (destructor)Ready_dealloc,
	.tp_as_async = &ready_async,
	.tp_iter = Ready_await,
	.tp_iternext = (iternextfunc)Ready_next,
};

/* ---- futures ---------------------------------------------------------------------------------- */

static PyObject *new_future(AsgiCall *call)
{
	return PyObject_CallMethod(call->aio, "create_future", NULL);
}

/* ---- the call ---------------------------------------------------------------------------------- */

AsgiCall *asgi_call_new(struct conn *c, PyObject *scope)
{
	Server *s = c->srv;
	struct hp_parser *hp = c->parser->hp;
	AsgiCall *call = PyObject_GC_New(AsgiCall, &AsgiCallType);

	if (!call)
		return NULL;
	memset((char *)call + sizeof(PyObject), 0, sizeof(AsgiCall) - sizeof(PyObject));
	call->srv = (Server *)Py_NewRef(s);
	call->conn = (struct conn *)Py_NewRef(c);
	call->scope = Py_NewRef(scope);
	call->aio = Py_XNewRef(s->thr[c->pos].aio);
	call->f.http11 = hp->ll.http_minor == 1;
	call->f.keep = hp_keep_alive(hp) && !s->draining;
	call->f.head_only = hp->ll.method == HTTP_HEAD;
	call->f.length = -1;
	call->since = mono_now();          /* the access log's and the histogram's start */
	asgi_ext_call(call);                       /* what the scope advertised; no file yet */
	PyObject_GC_Track(call);
	if (!call->aio) {
		Py_DECREF(call);
		PyErr_SetString(PyExc_RuntimeError, "ASGI: the loop thread has no asyncio loop "
		                "(Server.set_aio)");
		return NULL;
	}
	return call;
}

/* The app of a new call started: the Server's runner (s->slow, asgi.py
 * run_call) called with the app, scope, the call's receive and send and
 * done (done_def bound to the call), its coroutine made a task of aio,
 * the owner loop thread's asyncio loop. The connection holds the call
 * from here (c->call: a close drops it). RESPOND_PARKED: the app's body
 * runs in the loop's ready pass right after this turn, the requests
 * behind it wait. -1 with an error: nothing runs, the coroutine is
 * closed (no "never awaited" warning) and c no longer holds the call.
 * The caller's reference to call stays its own either way. */
int asgi_start_task(struct conn *c, PyObject *call, PyObject *scope, PyObject *aio,
                    PyMethodDef *done_def)
{
	Server *s = c->srv;
	PyObject *receive, *send, *done, *coro = NULL, *task = NULL;
	PyObject *args[5];
	int rc = -1;

	c->call = Py_NewRef(call);
	send = done = NULL;
	if (asgi_call_methods(call, &receive, &send) == 0)
		done = done_def ? PyCFunction_New(done_def, call) : Py_NewRef(call);
	if (done) {
		args[0] = s->app;
		args[1] = scope;
		args[2] = receive;
		args[3] = send;
		args[4] = done;
		coro = PyObject_Vectorcall(s->slow, args, 5, NULL);
		/* the loop's create_task: worker/aio_native/tasks.c's while the loop
		 * is not debugging (a task factory the app set is honoured, the
		 * name and context are asyncio's) */
		task = coro ? PyObject_CallMethodOneArg(aio, M_CREATE_TASK, coro) : NULL;
		rc = task ? RESPOND_PARKED : -1;
	}
	if (rc < 0) {
		if (coro) {
			/* the error (a task factory's, issue 35 point 12) kept
			 * across the close, which runs code and would otherwise
			 * wipe it: the log said `NoneType: None`; the close's own
			 * error, if any, is the lesser one and dropped */
			PyObject *t, *v, *tb, *r;

			PyErr_Fetch(&t, &v, &tb);
			r = PyObject_CallMethod(coro, "close", NULL);
			if (r)
				Py_DECREF(r);
			else
				PyErr_Clear();
			if (t)
				PyErr_Restore(t, v, tb);
			else            /* (never: a NULL from create_task sets one) */
				PyErr_SetString(PyExc_SystemError, "create_task failed with no error set");
		}
		if (c->call == call) {
			c->call = NULL;
			Py_DECREF(call);
		}
	}
	Py_XDECREF(receive);
	Py_XDECREF(send);
	Py_XDECREF(done);
	Py_XDECREF(coro);
	Py_XDECREF(task);
	return rc;
}

static int Call_traverse(AsgiCall *call, visitproc visit, void *arg)
{
	Py_VISIT(call->scope);
	Py_VISIT(call->aio);
	Py_VISIT(call->rx);
	Py_VISIT(call->tx);
	return 0;
}

static int Call_clear(AsgiCall *call)
{
	Py_CLEAR(call->scope);
	Py_CLEAR(call->aio);
	Py_CLEAR(call->rx);
	Py_CLEAR(call->tx);
	return 0;
}

static void Call_dealloc(AsgiCall *call)
{
	PyObject_GC_UnTrack(call);
	Call_clear(call);
	asgi_file_close(call);
	Py_CLEAR(call->conn);
	Py_CLEAR(call->f.prefix);
	Py_CLEAR(call->srv);
	PyObject_GC_Del(call);
}

/* The call's connection for a receive or a send: NULL if detached;
 * RuntimeError from a thread that is not its owner loop thread (its
 * output and fd are that thread's alone). */
static int owner_thread(AsgiCall *call, const char *what)
{
	struct conn *c = call->conn;

	if (c && srv_current(c->srv) != c->pos) {
		PyErr_Format(PyExc_RuntimeError, "ASGI %s from a thread that is not the connection's "
		             "loop thread (use loop.call_soon_threadsafe)", what);
		return -1;
	}
	return 0;
}

/* ---- receive ----------------------------------------------------------------------------------- */

static PyObject *receive(AsgiCall *call)
{
	struct conn *c = call->conn;
	Parser *p;
	PyObject *msg;

	if (owner_thread(call, "receive()") < 0)
		return NULL;
	if (call->gone || call->ended || !c || c->closed || (call->body_done && c->peer_eof))
		goto disconnect;
	p = c->parser;
	if (!call->body_done) {
		msg = asgi_take_body(call);
		if (msg) {
			PyObject *r = asgi_ready(msg);
			Py_DECREF(msg);
			return r;
		}
		if (PyErr_Occurred())
			return NULL;
		if (p->hp->state == HP_ERROR) {
			/* the client's error (framing, past the limit): its 400 / 413
			 * if nothing was said yet, else the connection ends (logged
			 * either way); the app reads a disconnect */
			asgi_body_error(call);
			goto disconnect;
		}
		if (c->peer_eof)
			goto disconnect;                   /* the end of input mid-body */
	}
	if (asgi_waiting(&call->rx)) {
		PyErr_SetString(PyExc_RuntimeError, "ASGI receive() called while another receive() of "
		                "the same request waits");
		return NULL;
	}
	if (!call->body_done && p->expect_continue) {
		/* it waits for our word before it sends the body: asked for now */
		p->expect_continue = 0;
		if (!call->head_sent && call->f.http11 &&
		    conn_send(c, "HTTP/1.1 100 Continue\r\n\r\n", 25, 1) < 0)
			return NULL;
	}
	call->rx = new_future(call);
	if (call->rx && !call->body_done)
		h1_body_wait(c, 1);                    /* the client's time runs (body_timeout) */
	return Py_XNewRef(call->rx);
disconnect:
	msg = asgi_disconnect();
	if (msg) {
		PyObject *r = asgi_ready(msg);
		Py_DECREF(msg);
		return r;
	}
	return NULL;
}

/* ---- send -------------------------------------------------------------------------------------- */

/* The bytes of one http.response.body (view; more: more_body), framed
 * into c's output: the head first if it is still held, the end of the
 * response if it is the last. */
static PyObject *body_bytes(AsgiCall *call, struct conn *c, Py_buffer *view, int more)
{
	if (!call->head_sent) {
		/* the whole body in this message: its length is known (but
		 * trailers follow a chunked one) */
		if (h1_head(c, &call->f, more || call->trailers ? -1 : (long long)view->len) < 0)
			return NULL;
		call->head_sent = 1;
	}
	if (view->len && h1_send_body(c, &call->f, view->buf, (size_t)view->len, 0, 0) < 0)
		return NULL;
	if (!more && call->trailers)
		return asgi_ext_body_end(call) < 0 ? NULL : asgi_ready(Py_None);
	if (!more) {
		if (h1_end_body(c, &call->f) < 0)
			return NULL;
		asgi_end(call, call->f.keep);          /* sends what is owed */
		return asgi_ready(Py_None);
	}
	conn_flush(c);                            /* streaming: each part as it comes */
	if (c->closed || call->gone) {
		PyErr_SetString(ClientDisconnected, "the client went away");
		return NULL;
	}
	if (conn_pending(c) > HIGH_WATER) {
		/* past the high water mark: the app waits until the client
		 * takes it below the low one (asgi_resume) */
		call->tx = new_future(call);
		return Py_XNewRef(call->tx);
	}
	return asgi_ready(Py_None);
}

/* msg[key], a new reference (NULL if absent): the app's message may run
 * its code while we use what we took out of it (a key's __eq__ in the
 * next lookup, more_body's __bool__) and that code may empty it; a
 * borrowed value would then be read after its free (review, finding 1) */
static PyObject *field(PyObject *msg, PyObject *key)
{
	/* a lookup's error is an absent key, as PyDict_GetItem has it (no
	 * exception is pending here: PyDict_GetItem's saving and restoring
	 * of one cost ~100 instructions a lookup, four lookups a response) */
	PyObject *v = PyDict_GetItemWithError(msg, key);

	if (!v)
		PyErr_Clear();
	return Py_XNewRef(v);
}

static PyObject *start(AsgiCall *call, PyObject *msg)
{
	PyObject *status, *headers, *prefix;
	long long length;
	int flags, code, rc;

	if (call->started) {
		PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R): http.response.start sent twice",
		             msg);
		return NULL;
	}
	status = field(msg, M_STATUS);
	if (!status) {
		PyErr_Format(PyExc_ValueError, "ASGI send(%.200R): http.response.start without a "
		             "status", msg);
		return NULL;
	}
	headers = field(msg, M_HEADERS);
	rc = head_from_asgi(status, headers ? headers : Py_None, &prefix, &length, &flags, &code);
	Py_DECREF(status);
	Py_XDECREF(headers);
	if (rc < 0)
		return NULL;
	if (asgi_ext_start(call, msg, length) < 0) {     /* its `trailers` (asgi_ext.c) */
		Py_DECREF(prefix);
		return NULL;
	}
	Py_XSETREF(call->f.prefix, prefix);
	call->f.length = length;
	call->f.code = code;
	call->f.app_date = !!(flags & HEAD_APP_DATE);
	call->f.app_server = !!(flags & HEAD_APP_SERVER);
	call->f.bodiless = code == 204 || code == 304 || code < 200;
	if (flags & HEAD_CLOSE)
		call->f.keep = 0;
	call->started = 1;
	return asgi_ready(Py_None);
}

static PyObject *body(AsgiCall *call, PyObject *msg)
{
	struct conn *c = call->conn;
	PyObject *data, *more_obj, *r = NULL;
	Py_buffer view = {0};
	int more;

	if (!call->started || call->body_end) {
		PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R): http.response.body %s", msg,
		             call->started ? "after the body ended" : "before http.response.start");
		return NULL;
	}
	data = field(msg, M_BODY);
	if (data && !PyBytes_Check(data) && !PyByteArray_Check(data) && !PyMemoryView_Check(data)) {
		PyErr_Format(PyExc_TypeError, "ASGI send(): http.response.body's body must be bytes, "
		             "not %.100s", Py_TYPE(data)->tp_name);
		Py_DECREF(data);
		return NULL;
	}
	more_obj = field(msg, M_MORE_BODY);
	more = more_obj ? PyObject_IsTrue(more_obj) : 0;
	Py_XDECREF(more_obj);
	if (more < 0 || (data && PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0))
		goto out;
	r = body_bytes(call, c, &view, more);
	PyBuffer_Release(&view);
out:
	Py_XDECREF(data);
	return r;
}

PyObject *asgi_send_type(PyObject *msg)
{
	PyObject *type;

	if (!PyDict_Check(msg)) {
		PyErr_Format(PyExc_TypeError, "ASGI send() takes a message dict, not %.100s",
		             Py_TYPE(msg)->tp_name);
		return NULL;
	}
	type = PyDict_GetItemWithError(msg, M_TYPE);      /* an error: no type, as below */
	if (!type)
		PyErr_Clear();
	if (!type || !PyUnicode_Check(type)) {
		PyErr_Format(PyExc_ValueError, "ASGI send(%.200R): a message needs a 'type' str", msg);
		return NULL;
	}
	return type;
}

/* An extension's send (asgi_ext.c: 0 done, 1 it waits, -1) as an awaitable */
static PyObject *waited(AsgiCall *call, int rc)
{
	if (rc < 0)
		return NULL;
	if (!rc)
		return asgi_ready(Py_None);
	call->tx = new_future(call);
	return Py_XNewRef(call->tx);
}

static PyObject *send(AsgiCall *call, PyObject *msg)
{
	PyObject *type = asgi_send_type(msg);

	if (!type)
		return NULL;
	if (call->gone || (call->conn && call->conn->closed)) {
		PyErr_SetString(ClientDisconnected, "the client went away");
		return NULL;
	}
	if (call->ended) {
		PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R) after the response ended", msg);
		return NULL;
	}
	if (owner_thread(call, "send()") < 0)
		return NULL;
	if (asgi_waiting(&call->tx)) {
		PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R) while another send() of the same "
		             "request waits", msg);
		return NULL;
	}
	if (sh_str_is(type, "http.response.start"))
		return start(call, msg);
	if (sh_str_is(type, "http.response.body"))
		return body(call, msg);
	if (sh_str_is(type, "http.response.pathsend"))
		return waited(call, asgi_pathsend(call, msg));
	if (sh_str_is(type, "http.response.trailers"))
		return waited(call, asgi_trailers(call, msg));
	PyErr_Format(PyExc_ValueError, "ASGI send(%.200R): not a message of an http scope "
	             "(http.response.start, http.response.body, http.response.pathsend, "
	             "http.response.trailers)", msg);
	return NULL;
}

/* receive and send hold the connection while they run: a close in
 * there (a failed write, a refusal) drops the call's reference to it */
static PyObject *Call_receive(AsgiCall *call, PyObject *noarg)
{
	struct conn *c = (struct conn *)Py_XNewRef(call->conn);
	PyObject *r = receive(call);

	(void)noarg;
	Py_XDECREF(c);
	return r;
}

/* A send() from the app's code that a send() runs (more_body's
 * __bool__, a key's __eq__) is refused: it could end the response, and
 * the outer one then wrote its bytes after that end, into the next
 * response of the connection (issue 35, point 5) */
static PyObject *Call_send(AsgiCall *call, PyObject *msg)
{
	struct conn *c;
	PyObject *r;

	if (call->sending) {
		PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R) while a send() of the same request "
		             "is in progress (called from the code that send() runs)", msg);
		return NULL;
	}
	c = (struct conn *)Py_XNewRef(call->conn);
	call->sending = 1;
	r = send(call, msg);
	call->sending = 0;
	Py_XDECREF(c);
	return r;
}

static PyMethodDef Call_methods[] = {
	{"receive", (PyCFunction)Call_receive, METH_NOARGS,
	 "receive() -> awaitable of the next message (http.request, http.disconnect)."},
	{"send", (PyCFunction)Call_send, METH_O, "send(message) -> awaitable."},
	{NULL},
};

/* call.receive and call.send, the bound methods the app is given (an
 * HTTP call's or a WebSocket call's). An HTTP call's are made from their
 * definitions as getattr makes them (the same kind of object) without
 * its lookup through the type: about 300 instructions each a request. */
static int asgi_call_methods(PyObject *call, PyObject **receive, PyObject **send)
{
	if (Py_IS_TYPE(call, &AsgiCallType)) {
		*receive = PyCFunction_New(&Call_methods[0], call);
		*send = *receive ? PyCFunction_New(&Call_methods[1], call) : NULL;
	}
	else {
		*receive = PyObject_GetAttr(call, M_RECEIVE);
		*send = *receive ? PyObject_GetAttr(call, M_SEND) : NULL;
	}
	return *send ? 0 : -1;
}

static PyObject *get_scope(AsgiCall *call, void *x)
{
	(void)x;
	return Py_NewRef(call->scope ? call->scope : Py_None);
}

static PyObject *get_status(AsgiCall *call, void *x)
{
	(void)x;
	return PyLong_FromLong(call->f.code);
}

static PyGetSetDef Call_getset[] = {
	{"scope", (getter)get_scope, NULL, "the request's scope", NULL},
	{"status", (getter)get_status, NULL, "the response's status, 0 before start", NULL},
	{NULL},
};

PyTypeObject AsgiCallType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "sockherd.worker._http.AsgiCall",
	.tp_doc = "One ASGI request's receive and send (asgi_call.c).",
	.tp_basicsize = sizeof(AsgiCall),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
	.tp_dealloc = (destructor)Call_dealloc,
	.tp_traverse = (traverseproc)Call_traverse,
	.tp_clear = (inquiry)Call_clear,
	.tp_methods = Call_methods,
	.tp_getset = Call_getset,
};
