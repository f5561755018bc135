/* The HTTP/1 codec's response heads: an app's status and fields checked
 * (field names are tokens, values carry no CTL, Content-Length one run of
 * digits) and serialised into the status line and the app's fields, with
 * what the framing needs taken out (its Content-Length, Connection: close,
 * whether it gave Date or Server). Two shapes, a file each: WSGI's here (a
 * str status, (str, str) pairs: head_from, the module's response_head,
 * and head_cached, the last head kept per thread; called by
 * wsgi_respond.c) and ASGI's in h1_head_asgi.c (an int status, (bytes,
 * bytes) pairs). h1_response.c puts the result on the wire.
 *
 * May call: nothing of the engine (CPython only).
 */
#include <string.h>

#include "h1.h"

/* ---- the head: checked, serialised, cached ------------------------------------------------- */

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

int head_cached(PyObject *status, PyObject *headers, PyObject **prefix, long long *length,
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

PyMethodDef h1_module_methods[] = {
	{"response_head", (PyCFunction)(void (*)(void))response_head, METH_FASTCALL,
	 response_head_doc},
	{NULL},
};
