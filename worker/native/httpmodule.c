/* sockherd.worker._http: the HTTP/1.1 request path in native code.
 *
 * RequestParser wraps one connection's hp_parser (httpparse.c: llhttp in
 * strict mode plus our own checks) and builds each request's WSGI environ
 * in C, from a per-server base dict: one call per request head instead of a
 * Python call per field (DEVELOPERS.md: the per-event Python work is the
 * cost to remove). A C-API extension, not cffi: cffi cannot build Python
 * objects. Every method runs with the GIL held and returns at once (no
 * blocking call in here: releasing the GIL would cost more than it saves).
 *
 * Use from one thread at a time (the connection's owner), like the parser.
 */
#include <string.h>

#include "http.h"

PyObject *HttpError, *ClientGone, *BadBody;

/* ---- buffers ------------------------------------------------------------------ */

int buf_reserve(char **buf, size_t *start, size_t *len, size_t *cap, size_t more)
{
	if (*start && *start == *len)
		*start = *len = 0;
	if (*len + more <= *cap)
		return 0;
	if (*start) {                        /* slide what is left to the front */
		memmove(*buf, *buf + *start, *len - *start);
		*len -= *start;
		*start = 0;
		if (*len + more <= *cap)
			return 0;
	}
	size_t ncap = *cap ? *cap : 4096;
	while (ncap < *len + more)
		ncap *= 2;
	char *nbuf = PyMem_Realloc(*buf, ncap);
	if (!nbuf) {
		PyErr_NoMemory();
		return -1;
	}
	*buf = nbuf;
	*cap = ncap;
	return 0;
}

PyObject *parser_refusal(Parser *self)
{
	PyObject *args = Py_BuildValue("(is)", self->hp.status,
	                               self->hp.reason ? self->hp.reason : "bad request");
	if (args) {
		PyErr_SetObject(HttpError, args);
		Py_DECREF(args);
	}
	return NULL;
}

/* ---- environ -------------------------------------------------------------------- */

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c |= 0x20;
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* Percent-decodes s into a latin-1 str (PEP 3333: bytes as code points
 * 0-255); an invalid escape stays as it is. */
static PyObject *unquote_latin1(const char *s, size_t n)
{
	char stack[512], *out = n <= sizeof(stack) ? stack : PyMem_Malloc(n);
	size_t k = 0;
	PyObject *r;

	if (!out)
		return PyErr_NoMemory();
	for (size_t i = 0; i < n; i++) {
		int hi, lo;

		if (s[i] == '%' && i + 2 < n &&
		    (hi = hexval((unsigned char)s[i + 1])) >= 0 &&
		    (lo = hexval((unsigned char)s[i + 2])) >= 0) {
			out[k++] = (char)(hi << 4 | lo);
			i += 2;
		}
		else
			out[k++] = s[i];
	}
	r = PyUnicode_DecodeLatin1(out, (Py_ssize_t)k, NULL);
	if (out != stack)
		PyMem_Free(out);
	return r;
}

/* The environ's keys as interned str made once (module init): a key
 * made from a C string per request costs a decode, an intern lookup and a
 * hash each time (measured: the largest Python cost of a 7-header
 * request). Shared with hconn.c (http.h). */
PyObject *K_SERVER_NAME, *K_SERVER_PORT, *K_REMOTE_ADDR, *K_REMOTE_PORT, *K_WSGI_INPUT;
static PyObject *K_REQUEST_METHOD, *K_RAW_URI, *K_REQUEST_URI, *K_QUERY_STRING, *K_PATH_INFO,
                *K_SERVER_PROTOCOL, *V_HTTP11, *V_HTTP10, *K_EMPTY, *K_HTTP_HOST,
                *K_SCRIPT_NAME;
static PyObject *method_names[64];

static int make_keys(void)
{
	struct { PyObject **at; const char *s; } keys[] = {
		{&K_SERVER_NAME, "SERVER_NAME"}, {&K_SERVER_PORT, "SERVER_PORT"},
		{&K_REMOTE_ADDR, "REMOTE_ADDR"}, {&K_REMOTE_PORT, "REMOTE_PORT"},
		{&K_WSGI_INPUT, "wsgi.input"}, {&K_REQUEST_METHOD, "REQUEST_METHOD"},
		{&K_RAW_URI, "RAW_URI"}, {&K_REQUEST_URI, "REQUEST_URI"},
		{&K_QUERY_STRING, "QUERY_STRING"}, {&K_PATH_INFO, "PATH_INFO"},
		{&K_SERVER_PROTOCOL, "SERVER_PROTOCOL"}, {&V_HTTP11, "HTTP/1.1"},
		{&V_HTTP10, "HTTP/1.0"}, {&K_EMPTY, ""}, {&K_HTTP_HOST, "HTTP_HOST"},
		{&K_SCRIPT_NAME, "SCRIPT_NAME"},
	};

	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (!(*keys[i].at = PyUnicode_InternFromString(keys[i].s)))
			return -1;
	return 0;
}

/* A header's environ key (HTTP_..., CONTENT_TYPE, CONTENT_LENGTH) from a
 * direct-mapped cache by the key's hash: a browser sends the same dozen
 * names in every request. New reference. The GIL guards the cache. */
#define KEY_CACHE 256
static PyObject *key_cache[KEY_CACHE];

static PyObject *field_key_obj(const char *key, size_t n)
{
	uint32_t h = 2166136261u;
	PyObject **slot, *k;

	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)key[i]) * 16777619u;
	slot = &key_cache[h % KEY_CACHE];
	k = *slot;
	if (k && (size_t)PyUnicode_GET_LENGTH(k) == n && !memcmp(PyUnicode_1BYTE_DATA(k), key, n))
		return Py_NewRef(k);
	k = PyUnicode_FromStringAndSize(key, (Py_ssize_t)n);    /* ASCII: field_key's */
	if (!k)
		return NULL;
	PyUnicode_InternInPlace(&k);
	Py_XSETREF(*slot, Py_NewRef(k));
	return k;
}

static int set_str(PyObject *env, PyObject *key, const char *s, size_t n)
{
	PyObject *v = n ? PyUnicode_DecodeLatin1(s, (Py_ssize_t)n, NULL) : Py_NewRef(K_EMPTY);
	int rc;

	if (!v)
		return -1;
	rc = PyDict_SetItem(env, key, v);
	Py_DECREF(v);
	return rc;
}

/* The environ key of a field name: CONTENT_TYPE, CONTENT_LENGTH, or
 * HTTP_ + the name upper-cased with '-' as '_'. 0 for a name with '_' in
 * it: dropped, as gunicorn does, so that it cannot pose as a '-' name. */
static size_t field_key(const char *name, size_t n, char *key, size_t cap)
{
	static const char prefix[] = "HTTP_";
	size_t k = 0;

	if (memchr(name, '_', n))
		return 0;
	if ((n == 12 && !strncasecmp(name, "content-type", 12)) ||
	    (n == 14 && !strncasecmp(name, "content-length", 14)))
		k = 0;
	else {
		memcpy(key, prefix, 5);
		k = 5;
	}
	if (k + n >= cap)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];

		key[k++] = c == '-' ? '_' : (c >= 'a' && c <= 'z' ? (char)(c - 32) : c);
	}
	key[k] = 0;
	return k;
}

/* RFC 9112 3.2.2: an absolute-form target's authority replaces Host:
 * HTTP_HOST is the authority, SERVER_NAME its host, SERVER_PORT its port
 * or the scheme's. -1 with an exception, or 0. */
static int set_authority(PyObject *env, const char *a, size_t len, const char *target)
{
	const char *colon = NULL;
	const char *port;
	size_t plen;

	for (size_t i = len; i-- > 0 && a[i] != ']';)
		if (a[i] == ':') {
			colon = a + i;
			break;
		}
	if (set_str(env, K_HTTP_HOST, a, len) < 0 ||
	    set_str(env, K_SERVER_NAME, a, colon ? (size_t)(colon - a) : len) < 0)
		return -1;
	if (colon && a + len > colon + 1) {
		port = colon + 1;
		plen = len - (size_t)(port - a);
	}
	else if (!strncasecmp(target, "https:", 6)) {
		port = "443";
		plen = 3;
	}
	else {
		port = "80";
		plen = 2;
	}
	return set_str(env, K_SERVER_PORT, port, plen);
}

static PyObject *build_environ(Parser *self, PyObject *base)
{
	struct hp_parser *hp = &self->hp;
	const char *target = hp->head;
	size_t tlen = hp->url_len, plen, qoff = 0, qlen = 0;
	const char *path = target;
	uint32_t host = 0, host_len = 0, path_off = 0;
	int absolute;
	PyObject *env, *v;
	char keybuf[256];

	env = PyDict_Copy(base);
	if (!env)
		return NULL;
	{
		unsigned m = hp->ll.method;
		PyObject **name = m < 64 ? &method_names[m] : NULL;

		if (name && *name)
			v = Py_NewRef(*name);
		else {
			v = PyUnicode_InternFromString(llhttp_method_name((llhttp_method_t)m));
			if (v && name)
				*name = Py_NewRef(v);
		}
	}
	if (!v || PyDict_SetItem(env, K_REQUEST_METHOD, v) < 0)
		goto fail_v;
	Py_DECREF(v);
	v = PyUnicode_DecodeLatin1(target, (Py_ssize_t)tlen, NULL);
	if (!v || PyDict_SetItem(env, K_RAW_URI, v) < 0 || PyDict_SetItem(env, K_REQUEST_URI, v) < 0)
		goto fail_v;
	Py_DECREF(v);
	/* absolute-form (a proxy's request): the path (maybe empty) follows
	 * the authority, which is the request's host (below) */
	absolute = hp_absolute(hp, &host, &host_len, &path_off);
	if (absolute)
		path = target + path_off;
	plen = tlen - (size_t)(path - target);
	{
		const char *hash = memchr(path, '#', plen);
		const char *q = memchr(path, '?', plen);

		if (hash)
			plen = (size_t)(hash - path);
		if (q && q < path + plen) {
			qoff = (size_t)(q - path) + 1;
			qlen = plen - qoff;
			plen = (size_t)(q - path);
		}
	}
	if (set_str(env, K_QUERY_STRING, path + qoff, qoff ? qlen : 0) < 0)
		goto fail;
	{
		PyObject *decoded = unquote_latin1(path, plen);
		Py_ssize_t sn = PyUnicode_GET_LENGTH(self->script_name);

		if (!decoded)
			goto fail;
		/* "*" (OPTIONS, the server as a whole) and an absolute-form
		 * target's empty path: an OPTIONS on the application root,
		 * PATH_INFO empty (PEP 3333); for another method the empty path
		 * is "/" (RFC 9112 3.2.1, 3.2.4); REQUEST_URI keeps the target */
		if ((tlen == 1 && *target == '*') || (absolute && !plen)) {
			Py_SETREF(decoded, hp->ll.method == HTTP_OPTIONS ? Py_NewRef(K_EMPTY)
			                   : PyUnicode_FromStringAndSize("/", 1));
			if (!decoded)
				goto fail;
		}
		/* SCRIPT_NAME (root path) is in base; PATH_INFO is what follows it */
		if (sn && PyUnicode_Tailmatch(decoded, self->script_name, 0, sn, -1) == 1 &&
		    (PyUnicode_GET_LENGTH(decoded) == sn || PyUnicode_READ_CHAR(decoded, sn) == '/')) {
			PyObject *rest = PyUnicode_Substring(decoded, sn, PyUnicode_GET_LENGTH(decoded));
			Py_DECREF(decoded);
			if (!rest)
				goto fail;
			decoded = rest;
		}
		else if (sn && PyDict_SetItem(env, K_SCRIPT_NAME, K_EMPTY) < 0) {
			/* a path outside the root is the app's whole path: SCRIPT_NAME
			 * + PATH_INFO must rebuild what the client asked for */
			Py_DECREF(decoded);
			goto fail;
		}
		if (PyDict_SetItem(env, K_PATH_INFO, decoded) < 0) {
			Py_DECREF(decoded);
			goto fail;
		}
		Py_DECREF(decoded);
	}
	if (PyDict_SetItem(env, K_SERVER_PROTOCOL, hp->ll.http_minor ? V_HTTP11 : V_HTTP10) < 0)
		goto fail;
	self->expect_continue = 0;
	for (uint32_t i = 0; i < hp->nfields; i++) {
		const struct hp_field *f = &hp->fields[i];
		const char *val = hp->head + f->value;
		size_t vlen = f->value_len, klen;
		PyObject *old, *value, *key;
		int rc;

		while (vlen && (val[vlen - 1] == ' ' || val[vlen - 1] == '\t'))
			vlen--;                              /* trailing OWS is not the value */
		klen = field_key(hp->head + f->name, f->name_len, keybuf, sizeof(keybuf));
		if (!klen)
			continue;
		if (klen == 11 && !memcmp(keybuf, "HTTP_EXPECT", 11) &&
		    vlen == 12 && !strncasecmp(val, "100-continue", 12))
			self->expect_continue = 1;
		value = PyUnicode_DecodeLatin1(val, (Py_ssize_t)vlen, NULL);
		if (!value)
			goto fail;
		key = field_key_obj(keybuf, klen);
		if (!key) {
			Py_DECREF(value);
			goto fail;
		}
		/* base holds no HTTP_ or CONTENT_ key: one already here is this
		 * request's own */
		old = PyDict_GetItemWithError(env, key);     /* borrowed */
		if (old && PyUnicode_Check(old)) {
			/* a repeated field: one value, comma-joined (RFC 9110 5.3),
			 * but Cookie's with "; " (RFC 6265 5.4, RFC 9113 8.2.3):
			 * cookie parsers split on ';' only */
			PyObject *joined = PyUnicode_FromFormat(klen == 11 && !memcmp(keybuf, "HTTP_COOKIE", 11)
			                                        ? "%U; %U" : "%U,%U",
			                                        old, value);
			Py_DECREF(value);
			if (!joined) {
				Py_DECREF(key);
				goto fail;
			}
			value = joined;
		}
		rc = PyErr_Occurred() ? -1 : PyDict_SetItem(env, key, value);
		Py_DECREF(key);
		Py_DECREF(value);
		if (rc < 0)
			goto fail;
	}
	if (absolute && set_authority(env, target + host, host_len, target) < 0)
		goto fail;
	return env;
fail_v:
	Py_XDECREF(v);
fail:
	Py_DECREF(env);
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
	hp_free(&self->hp);
	hp_init(&self->hp, &lim);
	Py_XSETREF(self->script_name, script_name ? Py_NewRef(script_name) : PyUnicode_New(0, 0));
	return self->script_name ? 0 : -1;
}

Parser *parser_new(const struct hp_limits *lim, PyObject *script_name)
{
	Parser *p = PyObject_New(Parser, &ParserType);

	if (!p)
		return NULL;
	memset((char *)p + sizeof(PyObject), 0, sizeof(Parser) - sizeof(PyObject));
	if (hp_init(&p->hp, lim) < 0) {
		p->script_name = NULL;
		Py_DECREF(p);
		PyErr_NoMemory();
		return NULL;
	}
	p->script_name = Py_NewRef(script_name);
	return p;
}

static void Parser_dealloc(Parser *self)
{
	hp_free(&self->hp);
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

PyDoc_STRVAR(next_request_doc,
"next_request(base) -> environ or None\n\n"
"Parses buffered bytes up to the end of the next request head and returns its\n"
"WSGI environ (a copy of base with the request's keys), or None if more bytes\n"
"are needed. Raises HttpError(status, reason) for a request to refuse (the\n"
"connection must then close).");

PyObject *parser_next(Parser *self, PyObject *base, int *none)
{
	struct hp_parser *hp = &self->hp;

	*none = 0;
	if (hp->state == HP_ERROR)
		return parser_refusal(self);
	if (hp->state != HP_HEAD) {
		PyErr_SetString(PyExc_RuntimeError, "the previous request is not finished");
		return NULL;
	}
	self->start += hp_head(hp, self->pending + self->start, self->len - self->start);
	if (hp->state == HP_ERROR)
		return parser_refusal(self);
	if (hp->state == HP_HEAD || !hp->head) {
		*none = 1;               /* (no head: llhttp's upgrade stop, not a request) */
		return NULL;
	}
	return build_environ(self, base);
}

static PyObject *Parser_next_request(Parser *self, PyObject *base)
{
	PyObject *env;
	int none;

	if (!PyDict_Check(base)) {
		PyErr_SetString(PyExc_TypeError, "base must be a dict");
		return NULL;
	}
	if (!self->script_name) {
		PyErr_SetString(PyExc_RuntimeError, "RequestParser.__init__ was not called");
		return NULL;
	}
	env = parser_next(self, base, &none);
	if (!env && none)
		Py_RETURN_NONE;
	return env;
}

int parser_pump_body(Parser *self)
{
	struct hp_parser *hp = &self->hp;

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
	struct hp_parser *hp = &self->hp;
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
	if (self->hp.state != HP_DONE || self->bstart != self->blen)
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
	int next = hp_next(&self->hp) == 0;
	if (self->start == self->len)
		hp_trim(&self->hp);
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
	return self->hp.state == HP_HEAD && (self->hp.started || self->len > self->start);
}

static PyObject *get_state(Parser *self, void *c)
{
	static const char *names[] = {"head", "body", "done", "error"};
	(void)c;
	return PyUnicode_InternFromString(names[self->hp.state]);
}

static PyObject *get_keep_alive(Parser *self, void *c)
{
	(void)c;
	return PyBool_FromLong(hp_keep_alive(&self->hp));
}

static PyObject *get_chunked(Parser *self, void *c)
{
	(void)c;
	return PyBool_FromLong(hp_chunked(&self->hp));
}

static PyObject *get_content_length(Parser *self, void *c)
{
	(void)c;
	return hp_content_length(&self->hp) < 0 ? Py_NewRef(Py_None)
	                                         : PyLong_FromLongLong(hp_content_length(&self->hp));
}

static PyObject *get_body_done(Parser *self, void *c)
{
	(void)c;
	return PyBool_FromLong(self->hp.state == HP_DONE && self->bstart == self->blen);
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
	if (self->hp.state != HP_ERROR)
		Py_RETURN_NONE;
	return Py_BuildValue("(is)", self->hp.status,
	                     self->hp.reason ? self->hp.reason : "bad request");
}

static PyObject *get_pending(Parser *self, void *c)
{
	(void)c;
	return PyLong_FromSize_t(self->len - self->start);
}

static PyMethodDef Parser_methods[] = {
	{"feed", (PyCFunction)Parser_feed, METH_O, feed_doc},
	{"next_request", (PyCFunction)Parser_next_request, METH_O, next_request_doc},
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
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)Parser_init,
	.tp_dealloc = (destructor)Parser_dealloc,
	.tp_methods = Parser_methods,
	.tp_getset = Parser_getset,
};

/* ---- the response head ------------------------------------------------------------- */

/* RFC 9110 5.6.2 tchar */
static int is_tchar(unsigned int c)
{
	static const char extra[] = "!#$%&'*+-.^_`|~";

	return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') ||
	       (c && c < 128 && strchr(extra, (int)c));
}

/* A field value (or reason phrase) we may send: latin-1, no CTL but HTAB. */
static int value_ok(PyObject *s)
{
	Py_ssize_t n = PyUnicode_GET_LENGTH(s);
	int kind = PyUnicode_KIND(s);
	const void *data = PyUnicode_DATA(s);

	if (kind != PyUnicode_1BYTE_KIND)
		return 0;                                  /* beyond latin-1 */
	for (Py_ssize_t i = 0; i < n; i++) {
		Py_UCS4 c = PyUnicode_READ(kind, data, i);
		if ((c < 0x20 && c != '\t') || c == 0x7f)
			return 0;
	}
	return 1;
}

static int lower_is(PyObject *name, const char *want)
{
	Py_ssize_t n = PyUnicode_GET_LENGTH(name);

	if (n != (Py_ssize_t)strlen(want))
		return 0;
	for (Py_ssize_t i = 0; i < n; i++) {
		Py_UCS4 c = PyUnicode_READ_CHAR(name, i);
		if ((c >= 'A' && c <= 'Z' ? c + 32 : c) != (Py_UCS4)want[i])
			return 0;
	}
	return 1;
}

PyDoc_STRVAR(response_head_doc,
"response_head(status, headers) -> (prefix, content_length, close)\n\n"
"Checks a WSGI start_response's status and headers and serialises them:\n"
"prefix is b'HTTP/1.1 <status>\\r\\n' and one 'name: value\\r\\n' per header,\n"
"without the hop-by-hop Connection and Transfer-Encoding (the server's to\n"
"set; close is True if the app asked for Connection: close) and without\n"
"Content-Length on 1xx and 204; content_length is the app's, or -1.\n"
"Raises TypeError or ValueError (status not like '200 OK', a name not a\n"
"token, a value with a control character or beyond latin-1, a\n"
"Content-Length not one number in digits).");

int head_from(PyObject *status, PyObject *headers, PyObject **prefix, long long *length_out,
              int *flags_out, int *code_out)
{
	PyObject *seq = NULL, *out = NULL;
	long long length = -1;
	int close = 0, flags = 0, code;
	Py_ssize_t n, size;
	char *w;

	if (!PyUnicode_Check(status) || PyUnicode_GET_LENGTH(status) < 4 || !value_ok(status) ||
	    PyUnicode_READ_CHAR(status, 3) != ' ' ||
	    PyUnicode_READ_CHAR(status, 0) < '1' || PyUnicode_READ_CHAR(status, 0) > '5' ||
	    PyUnicode_READ_CHAR(status, 1) < '0' || PyUnicode_READ_CHAR(status, 1) > '9' ||
	    PyUnicode_READ_CHAR(status, 2) < '0' || PyUnicode_READ_CHAR(status, 2) > '9')
	{
		PyErr_Format(PyExc_ValueError, "bad status %R: expected like '200 OK', "
		             "printable latin-1, no CR or LF", status);
		return -1;
	}
	code = (int)(PyUnicode_READ_CHAR(status, 0) - '0') * 100 +
	       (int)(PyUnicode_READ_CHAR(status, 1) - '0') * 10 + (int)(PyUnicode_READ_CHAR(status, 2) - '0');
	seq = PySequence_Fast(headers, "headers must be a list of (name, value) tuples");
	if (!seq)
		return -1;
	n = PySequence_Fast_GET_SIZE(seq);
	/* first pass: check, and size the result */
	size = 9 + PyUnicode_GET_LENGTH(status) + 2;
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *pair = PySequence_Fast_GET_ITEM(seq, i), *name, *value;

		if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
		    !PyUnicode_Check(name = PyTuple_GET_ITEM(pair, 0)) ||
		    !PyUnicode_Check(value = PyTuple_GET_ITEM(pair, 1))) {
			PyErr_Format(PyExc_TypeError, "header %R: a (name, value) tuple of str", pair);
			goto fail;
		}
		Py_ssize_t nl = PyUnicode_GET_LENGTH(name);
		if (!nl) {
			PyErr_SetString(PyExc_ValueError, "an empty header name");
			goto fail;
		}
		for (Py_ssize_t k = 0; k < nl; k++)
			if (!is_tchar(PyUnicode_READ_CHAR(name, k))) {
				PyErr_Format(PyExc_ValueError, "header name %R is not a token (RFC 9110 5.1)",
				             name);
				goto fail;
			}
		if (!value_ok(value)) {
			PyErr_Format(PyExc_ValueError, "header %R: value with a control character or "
			             "outside latin-1", name);
			goto fail;
		}
		if (lower_is(name, "content-length")) {
			Py_ssize_t vl = PyUnicode_GET_LENGTH(value);
			long long v = 0;

			if (length >= 0 || !vl || vl > 18)
				goto bad_length;
			for (Py_ssize_t k = 0; k < vl; k++) {
				Py_UCS4 c = PyUnicode_READ_CHAR(value, k);
				if (c < '0' || c > '9')
					goto bad_length;
				v = v * 10 + (long long)(c - '0');
			}
			length = v;
			if ((code >= 100 && code < 200) || code == 204)
				continue;                  /* 1xx, 204: no Content-Length (RFC 9110 8.6) */
		}
		else if (lower_is(name, "connection")) {
			close |= PyUnicode_GET_LENGTH(value) == 5 && lower_is(value, "close");
			continue;
		}
		else if (lower_is(name, "transfer-encoding"))
			continue;
		else if (lower_is(name, "date"))
			flags |= HEAD_APP_DATE;            /* the app's wins: ours is left out */
		else if (lower_is(name, "server"))
			flags |= HEAD_APP_SERVER;
		size += nl + 2 + PyUnicode_GET_LENGTH(value) + 2;
	}
	if ((code >= 100 && code < 200) || code == 204)
		length = -1;
	/* second pass: write */
	out = PyBytes_FromStringAndSize(NULL, size);
	if (!out)
		goto fail;
	w = PyBytes_AS_STRING(out);
	memcpy(w, "HTTP/1.1 ", 9);
	w += 9;
	for (Py_ssize_t k = 0; k < PyUnicode_GET_LENGTH(status); k++)
		*w++ = (char)PyUnicode_READ_CHAR(status, k);
	*w++ = '\r';
	*w++ = '\n';
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *pair = PySequence_Fast_GET_ITEM(seq, i);
		PyObject *name = PyTuple_GET_ITEM(pair, 0), *value = PyTuple_GET_ITEM(pair, 1);

		if (lower_is(name, "connection") || lower_is(name, "transfer-encoding") ||
		    (((code >= 100 && code < 200) || code == 204) && lower_is(name, "content-length")))
			continue;
		memcpy(w, PyUnicode_DATA(name), (size_t)PyUnicode_GET_LENGTH(name));
		w += PyUnicode_GET_LENGTH(name);
		*w++ = ':';
		*w++ = ' ';
		memcpy(w, PyUnicode_DATA(value), (size_t)PyUnicode_GET_LENGTH(value));
		w += PyUnicode_GET_LENGTH(value);
		*w++ = '\r';
		*w++ = '\n';
	}
	Py_DECREF(seq);
	*prefix = out;
	*length_out = length;
	*flags_out = flags | (close ? HEAD_CLOSE : 0);
	*code_out = code;
	return 0;
bad_length:
	PyErr_SetString(PyExc_ValueError, "Content-Length: one, in digits");
fail:
	Py_XDECREF(seq);
	return -1;
}

static PyObject *response_head(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
	PyObject *prefix;
	long long length;
	int flags, code;

	(void)mod;
	if (nargs != 2) {
		PyErr_SetString(PyExc_TypeError, "response_head(status, headers)");
		return NULL;
	}
	if (head_from(args[0], args[1], &prefix, &length, &flags, &code) < 0)
		return NULL;
	return Py_BuildValue("(NLO)", prefix, length, flags & HEAD_CLOSE ? Py_True : Py_False);
}

static PyMethodDef module_methods[] = {
	{"response_head", (PyCFunction)(void (*)(void))response_head, METH_FASTCALL,
	 response_head_doc},
	{NULL},
};

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT, "sockherd.worker._http",
	"The native HTTP/1.1 request path (llhttp, strict).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__http(void)
{
	PyObject *m;

	if (PyType_Ready(&ParserType) < 0 || PyType_Ready(&ServerType) < 0 ||
	    PyType_Ready(&HttpConnType) < 0 || PyType_Ready(&RespondType) < 0)
		return NULL;
	if (make_keys() < 0)
		return NULL;
	m = PyModule_Create(&module);
	if (!m)
		return NULL;
	HttpError = PyErr_NewExceptionWithDoc(
	    "sockherd.worker._http.HttpError",
	    "A request refused: args are (status, reason); the connection must close.",
	    PyExc_ValueError, NULL);
	ClientGone = PyErr_NewExceptionWithDoc(
	    "sockherd.worker._http.ClientGone",
	    "The client closed or reset the connection, or stopped reading or sending, while\n"
	    "the app read or wrote.", PyExc_Exception, NULL);
	BadBody = PyErr_NewExceptionWithDoc(
	    "sockherd.worker._http.BadBody",
	    "The request body's framing is invalid: args are (status, reason); the\n"
	    "connection cannot carry another request.", PyExc_Exception, NULL);
	if (!HttpError || !ClientGone || !BadBody ||
	    PyModule_AddObjectRef(m, "HttpError", HttpError) < 0 ||
	    PyModule_AddObjectRef(m, "ClientGone", ClientGone) < 0 ||
	    PyModule_AddObjectRef(m, "BadBody", BadBody) < 0 ||
	    PyModule_AddObjectRef(m, "RequestParser", (PyObject *)&ParserType) < 0 ||
	    PyModule_AddObjectRef(m, "Server", (PyObject *)&ServerType) < 0 ||
	    PyModule_AddObjectRef(m, "HttpConn", (PyObject *)&HttpConnType) < 0 ||
	    PyModule_AddObjectRef(m, "Respond", (PyObject *)&RespondType) < 0) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
