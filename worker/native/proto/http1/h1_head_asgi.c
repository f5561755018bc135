/* The HTTP/1 codec's response heads from ASGI's shapes: an int status and
 * [name, value] pairs of bytes checked as h1_head.c checks WSGI's (names
 * are tokens, values carry no CTL, Content-Length one run of digits) and
 * serialised the same way (head_from_asgi: asgi_call.c, and asgi_ws_send.c
 * for a denial response), and a trailer section's fields checked and
 * serialised (h1_trailer_block: asgi_ext.c), and websocket.accept's
 * fields the same way (h1_accept_block: asgi_ws_send.c, its 101).
 * h1_response.c puts the results on the wire.
 *
 * May call: nothing of the engine (CPython only).
 */
#include <stdint.h>
#include <string.h>

#include "h1.h"

/* ---- the head from ASGI's shapes -------------------------------------------------------------- */

static const char *reason_of(int code)
{
	switch (code) {
	case 100: return "Continue";
	case 101: return "Switching Protocols";
	case 200: return "OK";
	case 201: return "Created";
	case 202: return "Accepted";
	case 203: return "Non-Authoritative Information";
	case 204: return "No Content";
	case 205: return "Reset Content";
	case 206: return "Partial Content";
	case 301: return "Moved Permanently";
	case 302: return "Found";
	case 303: return "See Other";
	case 304: return "Not Modified";
	case 307: return "Temporary Redirect";
	case 308: return "Permanent Redirect";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 406: return "Not Acceptable";
	case 408: return "Request Timeout";
	case 409: return "Conflict";
	case 410: return "Gone";
	case 411: return "Length Required";
	case 412: return "Precondition Failed";
	case 413: return "Content Too Large";
	case 415: return "Unsupported Media Type";
	case 416: return "Range Not Satisfiable";
	case 422: return "Unprocessable Content";
	case 425: return "Too Early";
	case 426: return "Upgrade Required";
	case 428: return "Precondition Required";
	case 429: return "Too Many Requests";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 501: return "Not Implemented";
	case 502: return "Bad Gateway";
	case 503: return "Service Unavailable";
	case 504: return "Gateway Timeout";
	default: return "";                        /* an empty reason is valid (RFC 9112 4) */
	}
}

static int bytes_lower_is(const char *s, Py_ssize_t n, const char *want)
{
	if (n != (Py_ssize_t)strlen(want))
		return 0;
	for (Py_ssize_t i = 0; i < n; i++)
		if ((s[i] >= 'A' && s[i] <= 'Z' ? s[i] + 32 : s[i]) != want[i])
			return 0;
	return 1;
}

/* Whether the name s[0 .. n) is want (n its length, at least 4; want in
 * lower case, letters and '-' only) whatever the case, compared a word
 * at a time: s is a checked token (tchar), so s's byte | 0x20 is want's
 * only if it is that letter in either case or that '-' (0x0d, the other
 * byte that gives '-', is no tchar). */
static inline int name_is(const char *s, Py_ssize_t n, const char *want)
{
	if (n >= 8) {
		const uint64_t low = 0x2020202020202020ULL;
		uint64_t x, y;

		for (Py_ssize_t i = 0; i + 8 <= n; i += 8) {
			memcpy(&x, s + i, 8);
			memcpy(&y, want + i, 8);
			if ((x | low) != y)
				return 0;
		}
		memcpy(&x, s + n - 8, 8);           /* the last word, overlapping */
		memcpy(&y, want + n - 8, 8);
		return (x | low) == y;
	}
	uint32_t x, y, z, t;

	memcpy(&x, s, 4);
	memcpy(&y, want, 4);
	memcpy(&z, s + n - 4, 4);
	memcpy(&t, want + n - 4, 4);
	return (x | 0x20202020U) == y && (z | 0x20202020U) == t;
}

/* The fields of an app's head we act on, told by their name's length
 * first: one comparison per field at most, a word at a time (five
 * byte-wise ones, each with its strlen, cost a FastAPI head ~0.4k
 * instructions; callgrind). s: a checked token. */
enum { F_OTHER, F_LENGTH, F_CONNECTION, F_TE, F_DATE, F_SERVER };

static inline int field_kind(const char *s, Py_ssize_t n)
{
	switch (n) {
	case 4: return name_is(s, n, "date") ? F_DATE : F_OTHER;
	case 6: return name_is(s, n, "server") ? F_SERVER : F_OTHER;
	case 10: return name_is(s, n, "connection") ? F_CONNECTION : F_OTHER;
	case 14: return name_is(s, n, "content-length") ? F_LENGTH : F_OTHER;
	case 17: return name_is(s, n, "transfer-encoding") ? F_TE : F_OTHER;
	default: return F_OTHER;
	}
}

/* RFC 9110 5.6.2 tchar, the set h1.h's is_tchar tests, as a table:
 * is_tchar's strchr for each '-' of a name cost a FastAPI head ~0.1k
 * instructions. tests/worker/test_asgi_head_fields.py sends every byte
 * in a name and in a value (each place in a word). */
static const unsigned char TCHAR[256] = {
	['0' ... '9'] = 1, ['A' ... 'Z'] = 1, ['a' ... 'z'] = 1,
	['!'] = 1, ['#'] = 1, ['$'] = 1, ['%'] = 1, ['&'] = 1, ['\''] = 1, ['*'] = 1, ['+'] = 1,
	['-'] = 1, ['.'] = 1, ['^'] = 1, ['_'] = 1, ['`'] = 1, ['|'] = 1, ['~'] = 1,
};

/* Whether s[0 .. n) holds a byte no field value may (a CTL but HTAB, or
 * DEL); eight bytes at a time where none is below 0x20 or DEL (a byte
 * loop cost ~6 instructions a byte). h1.h's h1_has_ctl: the one check of
 * every ASGI field value (websocket.accept's subprotocol too). */
int h1_has_ctl(const char *s, size_t n)
{
	const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		uint64_t x, del;

		memcpy(&x, s + i, 8);
		del = x ^ (0x7f * ones);
		/* a byte below 0x20, or one equal to DEL, flags its block: the
		 * block is then looked at byte by byte (HTAB is allowed) */
		if (((x - 0x20 * ones) & ~x & high) || ((del - ones) & ~del & high))
			break;
	}
	for (; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];

		if ((ch < 0x20 && ch != '\t') || ch == 0x7f)
			return 1;
	}
	return 0;
}

/* "name: value\r\n" at w; the end of it */
static inline char *put_field(char *w, const char *name, size_t nl, const char *value, size_t vl)
{
	memcpy(w, name, nl);
	w += nl;
	*w++ = ':';
	*w++ = ' ';
	memcpy(w, value, vl);
	w += vl;
	*w++ = '\r';
	*w++ = '\n';
	return w;
}

/* One [name, value] pair of the app's (in message `what`): borrowed name
 * and value, both bytes, the name a token, the value without CTL; 0 or -1
 * with an error naming the pair. A tuple or a list, subclasses included
 * (a namedtuple is a two-item iterable as the spec words it: refused, a
 * valid response was a 500; review, finding 5); their items are read from
 * the object itself, no method of the subclass runs. */
static int asgi_pair(const char *what, PyObject *pair, PyObject **name, PyObject **value)
{
	const char *ns, *vs;
	Py_ssize_t nl, vl;

	if (!(PyTuple_Check(pair) || PyList_Check(pair)) ||
	    PySequence_Fast_GET_SIZE(pair) != 2 ||
	    !PyBytes_Check(*name = PySequence_Fast_GET_ITEM(pair, 0)) ||
	    !PyBytes_Check(*value = PySequence_Fast_GET_ITEM(pair, 1))) {
		PyErr_Format(PyExc_TypeError, "%s: header %.200R is not a [name, value] pair of bytes",
		             what, pair);
		return -1;
	}
	ns = PyBytes_AS_STRING(*name);
	nl = PyBytes_GET_SIZE(*name);
	vs = PyBytes_AS_STRING(*value);
	vl = PyBytes_GET_SIZE(*value);
	if (!nl) {
		PyErr_Format(PyExc_ValueError, "%s: an empty header name", what);
		return -1;
	}
	for (Py_ssize_t k = 0; k < nl; k++)
		if (!TCHAR[(unsigned char)ns[k]]) {
			PyErr_Format(PyExc_ValueError, "%s: header name %R is not a token (RFC 9110 5.1)",
			             what, *name);
			return -1;
		}
	if (h1_has_ctl(vs, (size_t)vl)) {
		PyErr_Format(PyExc_ValueError, "%s: header %R: value with a control character",
		             what, *name);
		return -1;
	}
	return 0;
}

/* "HTTP/1.1 <code> <reason>\r\n" at w (code 100-599, reason NULL: its
 * length only); its length */
static size_t status_line(char *w, int code, const char *reason)
{
	size_t rl = strlen(reason);

	if (w) {
		memcpy(w, "HTTP/1.1 ", 9);
		h1_put_dec(w + 9, (unsigned long long)code);     /* three digits */
		w[12] = ' ';
		memcpy(w + 13, reason, rl);
		memcpy(w + 13 + rl, "\r\n", 2);
	}
	return 13 + rl + 2;
}

int head_from_asgi(PyObject *status, PyObject *headers, PyObject **prefix, long long *length_out,
                   int *flags_out, int *code_out)
{
	PyObject *seq = NULL, *out;
	long long length = -1;
	int close = 0, flags = 0, overflow = 0, code;
	long v;
	Py_ssize_t n, size;
	const char *reason;
	char *w;

	if (!PyLong_Check(status) || PyBool_Check(status)) {
		PyErr_Format(PyExc_TypeError, "http.response.start: status must be an int, not %.100s",
		             Py_TYPE(status)->tp_name);
		return -1;
	}
	v = PyLong_AsLongAndOverflow(status, &overflow);
	if (overflow || v < 100 || v > 599) {
		if (!PyErr_Occurred())
			PyErr_Format(PyExc_ValueError, "http.response.start: status %R is not within "
			             "100-599", status);
		return -1;
	}
	if (v < 200) {
		/* an interim response is never a request's answer: sent as one,
		 * its client waits on for the final one and takes the next
		 * pipelined response for it (review, finding 4) */
		PyErr_Format(PyExc_ValueError, "http.response.start: status %R is informational "
		             "(1xx), not a final response's", status);
		return -1;
	}
	code = (int)v;
	reason = reason_of(code);
	if (headers == Py_None)
		seq = PyTuple_New(0);
	else
		seq = PySequence_Fast(headers, "http.response.start: headers must be an iterable of "
		                      "[name, value] pairs of bytes");
	if (!seq)
		return -1;
	n = PySequence_Fast_GET_SIZE(seq);
	size = (Py_ssize_t)status_line(NULL, code, reason);
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *name, *value;
		const char *ns, *vs;
		Py_ssize_t nl, vl;

		if (asgi_pair("http.response.start", PySequence_Fast_GET_ITEM(seq, i), &name, &value) < 0)
			goto fail;
		ns = PyBytes_AS_STRING(name);
		nl = PyBytes_GET_SIZE(name);
		vs = PyBytes_AS_STRING(value);
		vl = PyBytes_GET_SIZE(value);
		switch (field_kind(ns, nl)) {
		case F_LENGTH: {
			long long cl = 0;

			if (length >= 0 || !vl || vl > 18)
				goto bad_length;
			for (Py_ssize_t k = 0; k < vl; k++) {
				if (vs[k] < '0' || vs[k] > '9')
					goto bad_length;
				cl = cl * 10 + (vs[k] - '0');
			}
			length = cl;
			if (code == 204)
				continue;
			break;
		}
		case F_CONNECTION:
			close |= bytes_lower_is(vs, vl, "close");
			continue;
		case F_TE:
			continue;
		case F_DATE:
			flags |= HEAD_APP_DATE;
			break;
		case F_SERVER:
			flags |= HEAD_APP_SERVER;
			break;
		}
		size += nl + 2 + vl + 2;
	}
	if (code == 204)                           /* a 1xx was refused above */
		length = -1;
	out = PyBytes_FromStringAndSize(NULL, size);
	if (!out)
		goto fail;
	w = PyBytes_AS_STRING(out);
	w += status_line(w, code, reason);
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *pair = PySequence_Fast_GET_ITEM(seq, i);
		PyObject *name = PySequence_Fast_GET_ITEM(pair, 0), *value = PySequence_Fast_GET_ITEM(pair, 1);
		const char *ns = PyBytes_AS_STRING(name);
		Py_ssize_t nl = PyBytes_GET_SIZE(name), vl = PyBytes_GET_SIZE(value);
		int kind = field_kind(ns, nl);

		if (kind == F_CONNECTION || kind == F_TE || (kind == F_LENGTH && code == 204))
			continue;
		w = put_field(w, ns, (size_t)nl, PyBytes_AS_STRING(value), (size_t)vl);
	}
	Py_DECREF(seq);
	*prefix = out;
	*length_out = length;
	*flags_out = flags | (close ? HEAD_CLOSE : 0);
	*code_out = code;
	return 0;
bad_length:
	PyErr_SetString(PyExc_ValueError, "http.response.start: Content-Length: one, in digits");
fail:
	Py_XDECREF(seq);
	return -1;
}

/* ---- trailers from ASGI's shapes ------------------------------------------------------------- */

/* Fields a trailer must not carry (RFC 9110 6.5.1): the message's
 * framing, routing, the connection's own, and what says how to process
 * the content; a recipient could not act on them after the body. */
static const char *const not_trailers[] = {
	"content-length", "transfer-encoding", "trailer", "te", "host", "connection", "keep-alive",
	"upgrade", "proxy-connection", "content-type", "content-encoding", "content-range",
};

/* The fields of headers checked (asgi_pair: a head's rule) and put into
 * one new bytes, "name: value\r\n" each (*block): refused, a field named
 * in refuse[] (lower case; the caller's reason in the message); left
 * out, one named skip (lower case, NULL: none), its value appended to
 * *skipped (a list the caller made). One pass over the pairs checks and
 * sizes them, the next writes them: the items are read from the tuples
 * and lists themselves and nothing between the two runs the app's code
 * (no method of theirs, no allocation of a GC object that could collect
 * and finalize), so what is written is what was checked (issue 35,
 * point 1: websocket.accept read each pair a second time through its
 * __getitem__). 0 or -1 with an error naming the field. */
static int field_block(const char *what, const char *not_seq, PyObject *headers,
                       const char *const *refuse,
                       size_t nrefuse, const char *why, const char *skip, PyObject *skipped,
                       PyObject **block)
{
	PyObject *seq, *out;
	Py_ssize_t n, size = 0;
	char *w;

	seq = headers == Py_None ? PyTuple_New(0)
	      : PySequence_Fast(headers, not_seq);
	if (!seq)
		return -1;
	n = PySequence_Fast_GET_SIZE(seq);
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *name, *value;

		if (asgi_pair(what, PySequence_Fast_GET_ITEM(seq, i), &name, &value) < 0)
			goto fail;
		for (size_t k = 0; k < nrefuse; k++)
			if (bytes_lower_is(PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name), refuse[k])) {
				PyErr_Format(PyExc_ValueError, "%s: %R is not a field %s", what, name, why);
				goto fail;
			}
		if (skip && bytes_lower_is(PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name), skip))
			continue;
		size += PyBytes_GET_SIZE(name) + 2 + PyBytes_GET_SIZE(value) + 2;
	}
	out = PyBytes_FromStringAndSize(NULL, size);
	if (!out)
		goto fail;
	w = PyBytes_AS_STRING(out);
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *pair = PySequence_Fast_GET_ITEM(seq, i);
		PyObject *name = PySequence_Fast_GET_ITEM(pair, 0), *value = PySequence_Fast_GET_ITEM(pair, 1);

		if (skip && bytes_lower_is(PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name), skip)) {
			/* a list's append allocates no GC object: no collection here */
			if (PyList_Append(skipped, value) < 0) {
				Py_DECREF(out);
				goto fail;
			}
			continue;
		}
		w = put_field(w, PyBytes_AS_STRING(name), (size_t)PyBytes_GET_SIZE(name),
		              PyBytes_AS_STRING(value), (size_t)PyBytes_GET_SIZE(value));
	}
	Py_DECREF(seq);
	*block = out;
	return 0;
fail:
	Py_DECREF(seq);
	return -1;
}

int h1_trailer_block(PyObject *headers, PyObject **block)
{
	return field_block("http.response.trailers", "http.response.trailers: headers must be an "
	                   "iterable of [name, value] pairs of bytes", headers, not_trailers,
	                   sizeof(not_trailers) / sizeof(not_trailers[0]),
	                   "a trailer may carry (RFC 9110 6.5.1)", NULL, NULL, block);
}

int h1_accept_block(PyObject *headers, const char *skip, PyObject *skipped, PyObject **block)
{
	return field_block("websocket.accept", "websocket.accept: headers must be an iterable of "
	                   "[name, value] pairs of bytes", headers, NULL, 0, NULL, skip, skipped, block);
}
