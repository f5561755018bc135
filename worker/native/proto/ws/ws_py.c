/* The frame codec's Python face (ws_frame.c): WsParser, fed bytes, gives
 * the events ws_parse finds, and ws_frame() serialises a server frame.
 * The engine does not use them (asgi_ws.c calls the codec directly): the
 * tests do, the fuzz oracle compares them with a Python model
 * (tests/ws/wsmodel.py), and bench/ws_frame_bench.py measures them
 * against maintained codecs.
 *
 * May call: ws_frame.c.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "ws.h"

typedef struct {
	PyObject_HEAD
	struct ws_parser p;
} WsParser;

static int WsParser_init(WsParser *self, PyObject *args, PyObject *kw)
{
	static char *names[] = {"max_size", "deflate", "client_no_context_takeover", NULL};
	unsigned long long max_size = 16u << 20;
	int deflate = 0, reset = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|K$pp:WsParser", names, &max_size, &deflate,
	                                 &reset))
		return -1;
	if (deflate && !max_size) {
		PyErr_SetString(PyExc_ValueError, "WsParser(): deflate needs a message bound "
		                "(max_size 0 is none: a compressed message would inflate without one)");
		return -1;
	}
	ws_free(&self->p);
	ws_init(&self->p, max_size);
	if (deflate && ws_pmd_attach(&self->p, &(struct ws_pmd){.on = 1, .client_no_takeover =
	                                                        (uint8_t)reset}) < 0) {
		PyErr_NoMemory();
		return -1;
	}
	return 0;
}

static void WsParser_dealloc(WsParser *self)
{
	ws_free(&self->p);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

/* one event as a tuple: ("text", str), ("binary", bytes), ("ping" |
 * "pong", bytes), ("close", code, reason), ("fail", code, reason) */
static PyObject *event(struct ws_parser *p, int ev)
{
	switch (ev) {
	case WS_TEXT:
		return Py_BuildValue("(sN)", "text",
		                     PyUnicode_DecodeUTF8(p->msg ? p->msg : "", (Py_ssize_t)p->msg_len, "strict"));
	case WS_BINARY:
		return Py_BuildValue("(sy#)", "binary", p->msg ? p->msg : "", (Py_ssize_t)p->msg_len);
	case WS_PING:
	case WS_PONG:
		return Py_BuildValue("(sy#)", ev == WS_PING ? "ping" : "pong", ws_ctl(p),
		                     (Py_ssize_t)p->ctl_len);
	case WS_CLOSE:
		return Py_BuildValue("(sis#)", "close", p->close_code,
		                     p->ctl_len > 2 ? (const char *)ws_ctl(p) + 2 : "",
		                     (Py_ssize_t)(p->ctl_len > 2 ? p->ctl_len - 2 : 0));
	default:
		return Py_BuildValue("(sis)", "fail", p->fail_code, p->fail_reason);
	}
}

static PyObject *WsParser_feed(WsParser *self, PyObject *arg)
{
	Py_buffer view;
	PyObject *out;
	size_t at = 0;

	if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
		return NULL;
	out = PyList_New(0);
	while (out) {
		size_t used;
		int ev = ws_parse(&self->p, (const uint8_t *)view.buf + at, (size_t)view.len - at,
		                  &used);
		PyObject *e;

		at += used;
		if (ev < 0) {
			Py_CLEAR(out);
			PyErr_NoMemory();
			break;
		}
		if (ev == WS_MORE)
			break;
		e = event(&self->p, ev);
		if (!e || PyList_Append(out, e) < 0)
			Py_CLEAR(out);
		Py_XDECREF(e);
		if (ev == WS_FAIL)
			break;
	}
	PyBuffer_Release(&view);
	return out;
}

static PyMethodDef WsParser_methods[] = {
	{"feed", (PyCFunction)WsParser_feed, METH_O,
	 "feed(bytes) -> [events]: ('text', str), ('binary', bytes), ('ping' | 'pong', bytes),\n"
	 "('close', code, reason), ('fail', close code, why); nothing after a fail."},
	{NULL},
};

PyTypeObject WsParserType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "sockherd.worker._http.WsParser",
	.tp_doc = "WsParser(max_size=16 MiB, *, deflate=False, client_no_context_takeover=False): "
	          "the native RFC 6455 client-frame parser (ws_frame.c), permessage-deflate "
	          "negotiated if deflate (ws_deflate.c).",
	.tp_basicsize = sizeof(WsParser),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)WsParser_init,
	.tp_dealloc = (destructor)WsParser_dealloc,
	.tp_methods = WsParser_methods,
};

static PyObject *py_ws_frame(PyObject *mod, PyObject *args)
{
	int opcode;
	Py_buffer view;
	uint8_t head[10];
	size_t n;
	PyObject *r;

	(void)mod;
	if (!PyArg_ParseTuple(args, "iy*:ws_frame", &opcode, &view))
		return NULL;
	n = ws_frame_head(head, opcode, (uint64_t)view.len);
	r = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n + view.len);
	if (r) {
		memcpy(PyBytes_AS_STRING(r), head, n);
		memcpy(PyBytes_AS_STRING(r) + n, view.buf, (size_t)view.len);
	}
	PyBuffer_Release(&view);
	return r;
}

/* The answer to Sec-WebSocket-Extensions values (one per header field, in
 * order): the first offer taken, None if none. */
static PyObject *py_ws_pmd_negotiate(PyObject *mod, PyObject *values)
{
	PyObject *seq = PySequence_Fast(values, "ws_pmd_negotiate(values): a list of str");
	struct ws_pmd pmd = {0};
	char out[WS_PMD_ANSWER_MAX];

	(void)mod;
	if (!seq)
		return NULL;
	for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq) && !pmd.on; i++) {
		Py_ssize_t n;
		const char *v = PyUnicode_Check(PySequence_Fast_GET_ITEM(seq, i)) ?
		                PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(seq, i), &n) : NULL;

		if (!v) {
			if (!PyErr_Occurred())
				PyErr_SetString(PyExc_TypeError, "ws_pmd_negotiate(values): a list of str");
			Py_DECREF(seq);
			return NULL;
		}
		ws_pmd_offers(v, (size_t)n, &pmd);
	}
	Py_DECREF(seq);
	if (!pmd.on)
		Py_RETURN_NONE;
	return PyUnicode_FromStringAndSize(out, (Py_ssize_t)ws_pmd_answer(&pmd, out));
}

PyMethodDef ws_module_methods[] = {
	{"ws_pmd_negotiate", py_ws_pmd_negotiate, METH_O,
	 "ws_pmd_negotiate([Sec-WebSocket-Extensions values]) -> the answer's value, or None."},
	{"ws_frame", py_ws_frame, METH_VARARGS,
	 "ws_frame(opcode, payload) -> bytes: a server frame (FIN set, unmasked)."},
	{NULL},
};
