/* The ASGI adapter's scope (HTTP, spec 2.4): a head the codec parsed
 * (struct Parser, h1.h) made a scope dict in C, from the Server's base
 * (type, asgi, scheme, root_path, and the lifespan state, copied per
 * request):
 *
 *   http_version "1.1" | "1.0", method, path (percent-decoded, UTF-8,
 *   undecodable bytes replaced, as uvicorn), raw_path (the target's path
 *   as sent, without the query), query_string (bytes after '?'), headers
 *   (a list of (name lower-cased, value) bytes pairs in order, trailing
 *   whitespace of a value dropped), client (host, port) or None, server
 *   (host, port) or (unix path, None).
 *
 * path is the whole path the client asked for: root_path is not taken
 * off it (the spec's reading since asgiref 3.7: an app strips it itself,
 * as Starlette and Django do).
 *
 * May call: the codec's parser state (httpparse.h).
 */
#include <string.h>

#include "asgi.h"

static PyObject *K_TYPE, *K_ASGI, *K_HTTP_VERSION, *K_METHOD, *K_PATH, *K_RAW_PATH, *K_QUERY,
                *K_HEADERS, *K_CLIENT, *K_SERVER, *K_STATE, *V_11, *V_10, *K_BODY, *K_MORE,
                *V_REQUEST, *V_DISCONNECT, *V_EMPTY_BYTES, *K_EXTENSIONS, *K_PROXY,
                *K_SCHEME, *V_HTTPS;
static PyObject *method_names[64];
static int make_common(void);

int asgi_make_keys(void)
{
	struct { PyObject **at; const char *s; } keys[] = {
		{&K_TYPE, "type"}, {&K_ASGI, "asgi"}, {&K_HTTP_VERSION, "http_version"},
		{&K_METHOD, "method"}, {&K_PATH, "path"}, {&K_RAW_PATH, "raw_path"},
		{&K_QUERY, "query_string"}, {&K_HEADERS, "headers"}, {&K_CLIENT, "client"},
		{&K_SERVER, "server"}, {&K_STATE, "state"}, {&V_11, "1.1"}, {&V_10, "1.0"},
		{&K_BODY, "body"}, {&K_MORE, "more_body"}, {&V_REQUEST, "http.request"},
		{&V_DISCONNECT, "http.disconnect"}, {&K_EXTENSIONS, "extensions"}, {&K_PROXY, "proxy"},
		{&K_SCHEME, "scheme"}, {&V_HTTPS, "https"},
	};

	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (!(*keys[i].at = PyUnicode_InternFromString(keys[i].s)))
			return -1;
	V_EMPTY_BYTES = PyBytes_FromStringAndSize(NULL, 0);
	return V_EMPTY_BYTES ? make_common() : -1;
}

/* ---- messages (asgi_call.c's, built with the same keys) ---- */

PyObject *asgi_disconnect(void)
{
	PyObject *d = PyDict_New();

	if (d && PyDict_SetItem(d, K_TYPE, V_DISCONNECT) < 0)
		Py_CLEAR(d);
	return d;
}

/* {"type": "http.request", "body": body, "more_body": more}; takes body */
static PyObject *request_message(PyObject *body, int more)
{
	PyObject *d = body ? PyDict_New() : NULL;

	if (d && (PyDict_SetItem(d, K_TYPE, V_REQUEST) < 0 || PyDict_SetItem(d, K_BODY, body) < 0 ||
	          PyDict_SetItem(d, K_MORE, more ? Py_True : Py_False) < 0))
		Py_CLEAR(d);
	Py_XDECREF(body);
	return d;
}

PyObject *asgi_take_body(AsgiCall *call)
{
	struct conn *c = call->conn;
	Parser *p = c->parser;
	size_t avail;
	PyObject *body;

	if (parser_pump_body(p) < 0)
		return NULL;
	avail = p->blen - p->bstart;
	if (!avail && p->hp->state != HP_DONE)
		return NULL;                           /* HP_BODY: wait; HP_ERROR: the caller's */
	body = avail ? PyBytes_FromStringAndSize(p->body + p->bstart, (Py_ssize_t)avail)
	             : Py_NewRef(V_EMPTY_BYTES);
	if (!body)
		return NULL;
	p->bstart = p->blen;
	if (p->hp->state == HP_DONE)
		call->body_done = 1;
	h1_input_room(c);                          /* taken: reading may go on */
	return request_message(body, !call->body_done);
}

/* ---- the scope ---- */

/* s percent-decoded, then UTF-8 (bad sequences replaced, as uvicorn) */
static PyObject *unquote_utf8(const char *s, size_t n)
{
	char stack[512], *out = n <= sizeof(stack) ? stack : PyMem_Malloc(n);
	PyObject *r;

	if (!out)
		return PyErr_NoMemory();
	r = PyUnicode_DecodeUTF8(out, (Py_ssize_t)hp_unquote(s, n, out), "replace");
	if (out != stack)
		PyMem_Free(out);
	return r;
}

static int set_new(PyObject *d, PyObject *key, PyObject *v)
{
	int rc = v ? PyDict_SetItem(d, key, v) : -1;

	Py_XDECREF(v);
	return rc;
}

static PyObject *method_name(unsigned m)
{
	PyObject **slot = m < 64 ? &method_names[m] : NULL, *v;

	if (slot && *slot)
		return Py_NewRef(*slot);
	v = PyUnicode_InternFromString(llhttp_method_name((llhttp_method_t)m));
	if (v && slot)
		*slot = Py_NewRef(v);
	return v;
}

/* Header names (lower-cased) and values that most requests carry, as
 * bytes made once and shared by every scope's headers (bytes are
 * immutable: sharing shows nowhere): a pair then allocates only its tuple
 * and its uncommon parts. Kept mostly for the memory a long-lived scope
 * holds (an idle WebSocket's: issue 23, ~40 bytes a shared object). */
static const char *const common_names[] = {
	"host", "user-agent", "accept", "accept-encoding", "accept-language", "connection",
	"upgrade", "content-type", "content-length", "cookie", "origin", "referer",
	"cache-control", "pragma", "authorization", "transfer-encoding", "expect",
	"if-none-match", "if-modified-since", "x-forwarded-for", "x-forwarded-proto",
	"x-real-ip", "sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
	"sec-websocket-protocol", "sec-fetch-mode", "sec-fetch-site", "sec-fetch-dest",
};
static const char *const common_values[] = {
	"13", "websocket", "Upgrade", "upgrade", "keep-alive", "close", "*/*", "gzip, deflate",
	"gzip, deflate, br", "no-cache", "permessage-deflate; client_max_window_bits",
};
#define NNAMES (sizeof(common_names) / sizeof(common_names[0]))
#define NVALUES (sizeof(common_values) / sizeof(common_values[0]))
static PyObject *name_bytes[NNAMES], *value_bytes[NVALUES];
static unsigned char name_len[NNAMES], value_len[NVALUES];
/* Whole (name, value) pairs shared too (tuples of bytes are immutable as
 * well): a pair of a common name and a common value, made at its first
 * use; and per common name the last pair seen with another value (a
 * site's clients mostly send the same Host, Origin, User-Agent...), kept
 * if its value is at most PAIR_KEEP bytes. A WebSocket's handshake
 * (Host, Upgrade, Connection, Sec-WebSocket-Version) then holds one tuple
 * of its own, Sec-WebSocket-Key's: ~110 bytes less per pair shared
 * (issue 23). Never kept: the key (random per connection by RFC 6455 4.1:
 * keeping it gains nothing) and the credentials (cookie, authorization:
 * not held past their request). GIL-protected, as every scope's making. */
#define PAIR_KEEP 64
static PyObject *common_pairs[NNAMES][NVALUES], *last_pair[NNAMES];
static unsigned char keep_last[NNAMES];

static int make_common(void)
{
	for (size_t i = 0; i < NNAMES; i++) {
		name_len[i] = (unsigned char)strlen(common_names[i]);
		if (!(name_bytes[i] = PyBytes_FromStringAndSize(common_names[i], name_len[i])))
			return -1;
		keep_last[i] = strcmp(common_names[i], "sec-websocket-key") &&
		               strcmp(common_names[i], "cookie") &&
		               strcmp(common_names[i], "authorization");
	}
	for (size_t i = 0; i < NVALUES; i++) {
		value_len[i] = (unsigned char)strlen(common_values[i]);
		if (!(value_bytes[i] = PyBytes_FromStringAndSize(common_values[i], value_len[i])))
			return -1;
	}
	return 0;
}

/* the index of s[0 .. n) among the n_all strings of names, or -1 */
static int common_index(const char *const *names, const unsigned char *lens, size_t n_all,
                        const char *s, size_t n)
{
	for (size_t i = 0; i < n_all; i++)
		if (lens[i] == n && !memcmp(names[i], s, n))
			return (int)i;
	return -1;
}

/* s[0 .. n) as bytes: the shared object at index i of objs if i >= 0 */
static PyObject *bytes_at(PyObject **objs, int i, const char *s, size_t n)
{
	return i >= 0 ? Py_NewRef(objs[i]) : PyBytes_FromStringAndSize(s, (Py_ssize_t)n);
}

/* The (name, value) pair of a header: low[0 .. nl) its lower-cased name,
 * val[0 .. vl) its value; a shared tuple when there is one (above). */
static PyObject *header_pair(const char *low, size_t nl, const char *val, size_t vl)
{
	int ni = common_index(common_names, name_len, NNAMES, low, nl);
	int vi = common_index(common_values, value_len, NVALUES, val, vl);
	PyObject *pair, *k, *v, **slot = NULL;

	if (ni >= 0 && vi >= 0) {
		slot = &common_pairs[ni][vi];
		if (*slot)
			return Py_NewRef(*slot);
	}
	else if (ni >= 0 && keep_last[ni] && vl <= PAIR_KEEP) {
		slot = &last_pair[ni];
		if (*slot) {
			PyObject *old = PyTuple_GET_ITEM(*slot, 1);

			if ((size_t)PyBytes_GET_SIZE(old) == vl && !memcmp(PyBytes_AS_STRING(old), val, vl))
				return Py_NewRef(*slot);
		}
	}
	if (!(pair = PyTuple_New(2)))
		return NULL;
	k = bytes_at(name_bytes, ni, low, nl);
	v = k ? bytes_at(value_bytes, vi, val, vl) : NULL;
	PyTuple_SET_ITEM(pair, 0, k);
	PyTuple_SET_ITEM(pair, 1, v);
	if (!v) {
		Py_DECREF(pair);
		return NULL;
	}
	if (slot)
		Py_XSETREF(*slot, Py_NewRef(pair));
	return pair;
}

/* the headers, lower-cased names; sets p->expect_continue as the
 * environ does (the codec's hold and the call's receive answer it) */
static PyObject *headers_of(Parser *p)
{
	struct hp_parser *hp = p->hp;
	PyObject *list = PyList_New((Py_ssize_t)hp->nfields);
	char stack[256];

	if (!list)
		return NULL;
	p->expect_continue = 0;
	for (uint32_t i = 0; i < hp->nfields; i++) {
		const struct hp_field *f = &hp->fields[i];
		const char *name = hp->head + f->name, *val = hp->head + f->value;
		size_t nl = f->name_len, vl = f->value_len;
		char *low = nl <= sizeof(stack) ? stack : PyMem_Malloc(nl);
		PyObject *pair;

		if (!low) {
			Py_DECREF(list);
			return PyErr_NoMemory();
		}
		while (vl && (val[vl - 1] == ' ' || val[vl - 1] == '\t'))
			vl--;                              /* trailing OWS is not the value */
		for (size_t k = 0; k < nl; k++)
			low[k] = name[k] >= 'A' && name[k] <= 'Z' ? (char)(name[k] + 32) : name[k];
		if (nl == 6 && !memcmp(low, "expect", 6) && vl == 12 && !strncasecmp(val, "100-continue", 12))
			p->expect_continue = 1;
		pair = header_pair(low, nl, val, vl);
		if (low != stack)
			PyMem_Free(low);
		if (!pair) {
			Py_DECREF(list);
			return NULL;
		}
		PyList_SET_ITEM(list, (Py_ssize_t)i, pair);
	}
	return list;
}

/* Room in a request's scope beyond the base's keys: ours (http_version,
 * method, raw_path, query_string, path, headers, client, server,
 * extensions, and a trusted proxy's and TLS's) and a framework's
 * (Starlette and FastAPI add 9: app, router, endpoint, route,
 * path_params, their exception handlers and exit stacks). */
#define SCOPE_KEYS 12
#define APP_KEYS 10

/* The base scope as the Server keeps it for ASGI (server.c, when its
 * interface is set): a new dict with base's items (its order) and room
 * for the whole scope. Why: a request's scope is a copy of it, and a
 * dict's copy keeps its size (CPython copies the table whole when it
 * has no holes). A copy of the plain base (5 keys, 8 slots) grew twice
 * while this file added the request's keys (16, then 32 slots: every key
 * rehashed each time) and once more when the app added its own (64):
 * about 3k instructions of a FastAPI request (callgrind). The template is
 * never changed after (asgi_build_scope replaces keys in each copy only).
 * Its cost: an http scope's table is 1,168 bytes (64 slots) while the
 * request runs, ~500 more than a grown one's. */
PyObject *asgi_scope_base(PyObject *base)
{
	PyObject *d = _PyDict_NewPresized(PyDict_GET_SIZE(base) + SCOPE_KEYS + APP_KEYS), *k, *v;
	Py_ssize_t pos = 0;

	while (d && PyDict_Next(base, &pos, &k, &v))
		if (PyDict_SetItem(d, k, v) < 0)
			Py_CLEAR(d);
	return d;
}

PyObject *asgi_build_scope(struct conn *c)
{
	Server *s = c->srv;
	Parser *p = c->parser;
	struct hp_parser *hp = p->hp;
	const char *target = hp->head, *path = target;
	size_t tlen = hp->url_len, plen, qlen = 0;
	const char *query = NULL;
	uint32_t host = 0, host_len = 0, path_off = 0;
	/* an http scope: a copy of the sized base (asgi_scope_base); a
	 * WebSocket handshake's: of the plain one, sized as it grows (its
	 * scope lives as long as the connection: an idle WebSocket's memory,
	 * tests/ws/test_ws_idle_memory.py) */
	int ws = hp->ll.method == HTTP_GET && hp_has_token(hp, "upgrade", "websocket");
	PyObject *scope = PyDict_Copy(ws || !s->scope_base ? s->base : s->scope_base), *v;

	if (!scope)
		return NULL;
	/* the asgi dict and the state: each request its own copy (an app
	 * that writes to them must not reach the next request) */
	v = PyDict_GetItemWithError(scope, K_ASGI);
	if (v && set_new(scope, K_ASGI, PyDict_Copy(v)) < 0)
		goto fail;
	if (!v && PyErr_Occurred())
		goto fail;
	v = PyDict_GetItemWithError(scope, K_STATE);
	if (v && set_new(scope, K_STATE, PyDict_Copy(v)) < 0)
		goto fail;
	if (PyErr_Occurred())
		goto fail;
	if (PyDict_SetItem(scope, K_HTTP_VERSION, hp->ll.http_minor ? V_11 : V_10) < 0 ||
	    set_new(scope, K_METHOD, method_name(hp->ll.method)) < 0)
		goto fail;
	if (hp_absolute(hp, &host, &host_len, &path_off))
		path = target + path_off;             /* a proxy's absolute-form: its path */
	plen = tlen - (size_t)(path - target);
	{
		const char *hash = memchr(path, '#', plen), *q;

		if (hash)
			plen = (size_t)(hash - path);
		q = memchr(path, '?', plen);
		if (q) {
			query = q + 1;
			qlen = plen - (size_t)(query - path);
			plen = (size_t)(q - path);
		}
	}
	if (set_new(scope, K_RAW_PATH, PyBytes_FromStringAndSize(path, (Py_ssize_t)plen)) < 0 ||
	    set_new(scope, K_QUERY, query ? PyBytes_FromStringAndSize(query, (Py_ssize_t)qlen)
	                                  : Py_NewRef(V_EMPTY_BYTES)) < 0 ||
	    set_new(scope, K_PATH, plen ? unquote_utf8(path, plen)
	                                : PyUnicode_FromStringAndSize("/", 1)) < 0 ||
	    set_new(scope, K_HEADERS, headers_of(p)) < 0)
		goto fail;
	/* addresses: (host, port) tuples for TCP; a unix socket has no
	 * client address and its path as the server's */
	if (PyTuple_Check(conn_peer(c)) && PyTuple_Check(c->local)) {
		if (PyDict_SetItem(scope, K_CLIENT, conn_peer(c)) < 0 ||
		    PyDict_SetItem(scope, K_SERVER, c->local) < 0)
			goto fail;
	}
	else if (PyDict_SetItem(scope, K_CLIENT, Py_None) < 0 ||
	         set_new(scope, K_SERVER, Py_BuildValue("(OO)", c->local, Py_None)) < 0)
		goto fail;
	/* the base says http: a TLS session's connection says https (a plain
	 * listener may serve beside TLS ones), before a trusted proxy's word */
	if (c->ssl && PyDict_SetItem(scope, K_SCHEME, V_HTTPS) < 0)
		goto fail;
	if (c->trusted && fwd_scope(c, scope) < 0)     /* a trusted proxy's fields (forwarded.h) */
		goto fail;
	/* the extensions: a PROXY protocol header's dict (conn_proxy.c), the
	 * "proxy" one, a copy per request (the ssl dict inside is shared);
	 * TLS's "tls" one (asgi_tls.c) */
	if (c->proxy || c->ssl) {
		PyObject *ext = PyDict_New();

		if (set_new(scope, K_EXTENSIONS, Py_XNewRef(ext)) < 0 ||
		    (c->proxy && set_new(ext, K_PROXY, PyDict_Copy(c->proxy)) < 0)) {
			Py_XDECREF(ext);
			goto fail;
		}
		if (c->ssl) {
			PyObject *tls = asgi_tls_scope(c);
			int rc = tls ? PyDict_SetItemString(ext, "tls", tls) : -1;

			Py_XDECREF(tls);
			if (rc < 0) {
				Py_DECREF(ext);
				goto fail;
			}
		}
		Py_DECREF(ext);
	}
	return scope;
fail:
	Py_DECREF(scope);
	return NULL;
}
