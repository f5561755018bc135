/* The HTTP/1 codec's parser object: RequestParser wraps one connection's
 * hp_parser (httpparse.c: llhttp in strict mode plus our own checks), its
 * buffered input and its decoded body. The engine's request loop
 * (h1_conn.c) drives it in C; wsgi.py's slow path feeds it and reads the
 * body through its Python methods. A C-API extension, not cffi: cffi
 * cannot build Python objects. Every method runs with the GIL held and
 * returns at once (no blocking call in here: releasing the GIL would cost
 * more than it saves). What a parsed head becomes (a WSGI environ) is the
 * adapter's (wsgi_environ.c, which adds next_request to the type).
 *
 * Use from one thread at a time (the connection's owner), like the parser.
 *
 * May call: httpparse.c, buf_reserve (conn_io.c).
 */
#include <string.h>

#include "h1.h"

/* a request refused (h1.h): made by the module's init (httpmodule.c) */
PyObject *HttpError;

/* parser_release's: the state an upgraded connection's parser shows
 * (a finished request that was an upgrade), read-only by design: what
 * would write to it (parser_head, parser_finish, a re-init) checks first */
static struct hp_parser released = {.state = HP_DONE, .upgrade = 1, .length = -1};

PyObject *parser_refusal(Parser *self)
{
	PyObject *args = Py_BuildValue("(is)", self->hp->status,
	                               self->hp->reason ? self->hp->reason : "bad request");
	if (args) {
		PyErr_SetObject(HttpError, args);
		Py_DECREF(args);
	}
	return NULL;
}

/* ---- the type ------------------------------------------------------------------- */

static int Parser_init(Parser *self, PyObject *args, PyObject *kw)
{
	static char *names[] = {"max_line", "max_field_size", "max_headers", "max_body",
	                        "script_name", NULL};
	/* gunicorn's defaults: limit_request_line, _field_size, _fields */
	unsigned int max_line = 4094, max_field_size = 8190, max_headers = 100;
	unsigned long long max_body = 0;
	PyObject *script_name = NULL;
	struct hp_limits lim;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|IIIKU", names, &max_line, &max_field_size,
	                                 &max_headers, &max_body, &script_name))
		return -1;
	if (!max_line || !max_field_size || !max_headers) {
		PyErr_SetString(PyExc_ValueError, "limits must be positive");
		return -1;
	}
	lim.line = max_line;
	lim.field_size = max_field_size;
	lim.fields = max_headers;
	lim.body = max_body;
	if (self->hp == &released && !(self->hp = PyMem_Calloc(1, sizeof(*self->hp)))) {
		self->hp = &released;
		PyErr_NoMemory();
		return -1;
	}
	hp_free(self->hp);
	hp_init(self->hp, &lim);
	Py_XSETREF(self->script_name, script_name ? Py_NewRef(script_name) : PyUnicode_New(0, 0));
	return self->script_name ? 0 : -1;
}

Parser *parser_new(const struct hp_limits *lim, PyObject *script_name)
{
	Parser *p = PyObject_New(Parser, &ParserType);

	if (!p)
		return NULL;
	memset((char *)p + sizeof(PyObject), 0, sizeof(Parser) - sizeof(PyObject));
	p->hp = PyMem_Calloc(1, sizeof(*p->hp));
	if (!p->hp || hp_init(p->hp, lim) < 0) {
		p->script_name = NULL;
		Py_DECREF(p);
		PyErr_NoMemory();
		return NULL;
	}
	p->script_name = Py_NewRef(script_name);
	return p;
}

void parser_release(Parser *p)
{
	if (p->hp == &released)
		return;
	hp_free(p->hp);
	PyMem_Free(p->hp);
	p->hp = &released;
}

/* RequestParser() from Python: its state zeroed, as it was inline */
static PyObject *Parser_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	Parser *p = (Parser *)PyType_GenericNew(type, args, kw);

	if (p && !(p->hp = PyMem_Calloc(1, sizeof(*p->hp)))) {
		Py_DECREF(p);
		return PyErr_NoMemory();
	}
	return (PyObject *)p;
}

static void Parser_dealloc(Parser *self)
{
	if (self->hp && self->hp != &released) {
		hp_free(self->hp);
		PyMem_Free(self->hp);
	}
	PyMem_Free(self->pending);
	PyMem_Free(self->body);
	Py_XDECREF(self->script_name);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(feed_doc, "feed(data): bytes received from the client, parsed on demand.");

static PyObject *Parser_feed(Parser *self, PyObject *arg)
{
	Py_buffer b;

	if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
		return NULL;
	if (!b.len) {
		PyBuffer_Release(&b);
		Py_RETURN_NONE;
	}
	if (buf_reserve(&self->pending, &self->start, &self->len, &self->cap, (size_t)b.len) < 0) {
		PyBuffer_Release(&b);
		return NULL;
	}
	memcpy(self->pending + self->len, b.buf, (size_t)b.len);
	self->len += (size_t)b.len;
	PyBuffer_Release(&b);
	Py_RETURN_NONE;
}

/* The head part of next_request (the adapter builds its request from
 * what this parsed: wsgi_environ.c). */
int parser_head(Parser *self)
{
	struct hp_parser *hp = self->hp;

	if (hp == &released)
		return 0;                              /* upgraded: no head will come */

	if (hp->state == HP_ERROR) {
		parser_refusal(self);
		return -1;
	}
	if (hp->state != HP_HEAD) {
		PyErr_SetString(PyExc_RuntimeError, "the previous request is not finished");
		return -1;
	}
	self->start += hp_head(hp, self->pending + self->start, self->len - self->start);
	if (hp->state == HP_ERROR) {
		parser_refusal(self);
		return -1;
	}
	if (hp->state == HP_HEAD || !hp->head)
		return 0;                /* (no head: llhttp's upgrade stop, not a request) */
	return 1;
}

int parser_pump_body(Parser *self)
{
	struct hp_parser *hp = self->hp;

	if (hp->state == HP_BODY && self->start < self->len) {
		size_t in = self->len - self->start, out = 0, used;

		if (buf_reserve(&self->body, &self->bstart, &self->blen, &self->bcap, in) < 0)
			return -1;
		used = hp_body(hp, self->pending + self->start, in, self->body + self->blen, &out);
		self->start += used;
		self->blen += out;
	}
	return 0;
}

PyDoc_STRVAR(read_body_doc,
"read_body(size=-1) -> bytes\n\n"
"Up to size bytes of the current request's body (chunked framing removed)\n"
"from what was fed; b'' when none is buffered now (see body_done).");

static PyObject *Parser_read_body(Parser *self, PyObject *const *args, Py_ssize_t nargs)
{
	struct hp_parser *hp = self->hp;
	Py_ssize_t size = -1;
	size_t avail, n;
	PyObject *r;

	if (nargs > 1 || (nargs == 1 && (size = PyLong_AsSsize_t(args[0])) == -1 && PyErr_Occurred()))
		return NULL;
	if (!self->script_name) {
		PyErr_SetString(PyExc_RuntimeError, "RequestParser.__init__ was not called");
		return NULL;
	}
	if (parser_pump_body(self) < 0)
		return NULL;
	avail = self->blen - self->bstart;
	if (!avail && hp->state == HP_ERROR)
		return parser_refusal(self);
	n = size < 0 || (size_t)size > avail ? avail : (size_t)size;
	if (!n)
		return PyBytes_FromStringAndSize(NULL, 0);
	r = PyBytes_FromStringAndSize(self->body + self->bstart, (Py_ssize_t)n);
	if (r)
		self->bstart += n;
	return r;
}

PyDoc_STRVAR(finish_doc,
"finish() -> bool\n\n"
"Ends the current request, whose body must have been read whole. True if\n"
"another request may follow on the connection (keep-alive), False if it\n"
"must close.");

int parser_finish(Parser *self)
{
	if (self->hp == &released)
		return 0;                              /* upgraded: no request follows */
	if (self->hp->state != HP_DONE || self->bstart != self->blen)
		return 0;
	self->bstart = self->blen = 0;
	/* an idle kept-alive connection holds no buffer: the next request
	 * allocates again (bench: memory per idle connection) */
	if (self->start == self->len) {
		PyMem_Free(self->pending);
		self->pending = NULL;
		self->start = self->len = self->cap = 0;
	}
	PyMem_Free(self->body);
	self->body = NULL;
	self->bcap = 0;
	int next = hp_next(self->hp) == 0;
	if (self->start == self->len)
		hp_trim(self->hp);
	return next;
}

static PyObject *Parser_finish(Parser *self, PyObject *noarg)
{
	(void)noarg;
	if (!self->script_name)
		Py_RETURN_FALSE;
	return PyBool_FromLong(parser_finish(self));
}

int parser_head_started(const Parser *self)
{
	return self->hp->state == HP_HEAD && (self->hp->started || self->len > self->start);
}

static PyObject *get_state(Parser *self, void *c)
{
	static const char *names[] = {"head", "body", "done", "error"};
	(void)c;
	return PyUnicode_InternFromString(names[self->hp->state]);
}

static PyObject *get_keep_alive(Parser *self, void *c)
{
	(void)c;
	return PyBool_FromLong(hp_keep_alive(self->hp));
}

static PyObject *get_chunked(Parser *self, void *c)
{
	(void)c;
	return PyBool_FromLong(hp_chunked(self->hp));
}

static PyObject *get_content_length(Parser *self, void *c)
{
	(void)c;
	return hp_content_length(self->hp) < 0 ? Py_NewRef(Py_None)
	                                         : PyLong_FromLongLong(hp_content_length(self->hp));
}

static PyObject *get_body_done(Parser *self, void *c)
{
	(void)c;
	return PyBool_FromLong(self->hp->state == HP_DONE && self->bstart == self->blen);
}

static PyObject *get_expect_continue(Parser *self, void *c)
{
	(void)c;
	return PyBool_FromLong(self->expect_continue);
}

static PyObject *get_head_started(Parser *self, void *c)
{
	(void)c;
	return PyBool_FromLong(parser_head_started(self));
}

static PyObject *get_error(Parser *self, void *c)
{
	(void)c;
	if (self->hp->state != HP_ERROR)
		Py_RETURN_NONE;
	return Py_BuildValue("(is)", self->hp->status,
	                     self->hp->reason ? self->hp->reason : "bad request");
}

static PyObject *get_pending(Parser *self, void *c)
{
	(void)c;
	return PyLong_FromSize_t(self->len - self->start);
}

/* the parser's own methods: the adapter's next_request follows them in
 * the type (httpmodule.c) */
PyMethodDef parser_methods[] = {
	{"feed", (PyCFunction)Parser_feed, METH_O, feed_doc},
	{"read_body", (PyCFunction)(void (*)(void))Parser_read_body, METH_FASTCALL, read_body_doc},
	{"finish", (PyCFunction)Parser_finish, METH_NOARGS, finish_doc},
	{NULL},
};

static PyGetSetDef Parser_getset[] = {
	{"state", (getter)get_state, NULL, "head, body, done or error", NULL},
	{"keep_alive", (getter)get_keep_alive, NULL, "the request allows another after it", NULL},
	{"chunked", (getter)get_chunked, NULL, "the body is chunked", NULL},
	{"content_length", (getter)get_content_length, NULL, "Content-Length or None", NULL},
	{"body_done", (getter)get_body_done, NULL, "the whole body was read", NULL},
	{"expect_continue", (getter)get_expect_continue, NULL, "Expect: 100-continue", NULL},
	{"pending", (getter)get_pending, NULL, "bytes fed and not parsed yet", NULL},
	{"error", (getter)get_error, NULL, "(status, reason) once refused, else None", NULL},
	{"head_started", (getter)get_head_started, NULL,
	 "part of the next request head arrived (not the whole)", NULL},
	{NULL},
};

PyTypeObject ParserType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "sockherd.worker._http.RequestParser",
	.tp_doc = "One connection's HTTP/1.1 request parser (strict; see httpparse.h).",
	.tp_basicsize = sizeof(Parser),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_new = Parser_new,
	.tp_init = (initproc)Parser_init,
	.tp_dealloc = (destructor)Parser_dealloc,
	/* .tp_methods: parser_methods and the adapter's, joined (httpmodule.c) */
	.tp_getset = Parser_getset,
};
