/* The WSGI adapter's environ: a head the codec parsed (struct Parser,
 * h1.h) made a WSGI environ in C, from a per-server base dict: one call
 * per request head instead of a Python call per field (DEVELOPERS.md: the
 * per-event Python work is the cost to remove). Also RequestParser's
 * next_request, which returns that environ to Python.
 *
 * May call: the codec's parser (h1_parser.c).
 */
#include <string.h>

#include "wsgi.h"

/* ---- environ -------------------------------------------------------------------- */

/* Percent-decodes s into a latin-1 str (PEP 3333: bytes as code points
 * 0-255); an invalid escape stays as it is. */
static PyObject *unquote_latin1(const char *s, size_t n)
{
	char stack[512], *out = n <= sizeof(stack) ? stack : PyMem_Malloc(n);
	PyObject *r;

	if (!out)
		return PyErr_NoMemory();
	r = PyUnicode_DecodeLatin1(out, (Py_ssize_t)hp_unquote(s, n, out), NULL);
	if (out != stack)
		PyMem_Free(out);
	return r;
}

/* The environ's keys as interned str made once (module init): a key
 * made from a C string per request costs a decode, an intern lookup and a
 * hash each time (measured: the largest Python cost of a 7-header
 * request). Shared with wsgi_app.c (wsgi.h). */
PyObject *K_SERVER_NAME, *K_SERVER_PORT, *K_REMOTE_ADDR, *K_REMOTE_PORT, *K_WSGI_INPUT;
static PyObject *K_REQUEST_METHOD, *K_RAW_URI, *K_REQUEST_URI, *K_QUERY_STRING, *K_PATH_INFO,
                *K_SERVER_PROTOCOL, *V_HTTP11, *V_HTTP10, *K_EMPTY, *K_HTTP_HOST,
                *K_SCRIPT_NAME;
static PyObject *method_names[64];

int make_keys(void)
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

PyObject *build_environ(Parser *self, PyObject *base)
{
	struct hp_parser *hp = self->hp;
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

/* ---- RequestParser.next_request ---------------------------------------------------------- */

PyDoc_STRVAR(next_request_doc,
"next_request(base) -> environ or None\n\n"
"Parses buffered bytes up to the end of the next request head and returns its\n"
"WSGI environ (a copy of base with the request's keys), or None if more bytes\n"
"are needed. Raises HttpError(status, reason) for a request to refuse (the\n"
"connection must then close).");

/* Parses buffered bytes up to the next head: its environ (a copy of base),
 * NULL with *none set when more bytes are needed, NULL with HttpError set. */
static PyObject *parser_next(Parser *self, PyObject *base, int *none)
{
	int rc = parser_head(self);

	*none = rc == 0;
	return rc > 0 ? build_environ(self, base) : NULL;
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

PyMethodDef wsgi_parser_methods[] = {
	{"next_request", (PyCFunction)Parser_next_request, METH_O, next_request_doc},
	{NULL},
};
