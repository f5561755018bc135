/* The ASGI websocket call's send() (asgi_ws.h): websocket.accept (the
 * 101 with its key, subprotocol and headers), websocket.send (a frame,
 * waiting past HIGH_WATER), websocket.close (a close frame, a 403 before
 * accept), the websocket.http.response denial's two (asgi_ws_deny.c); each
 * error names the message. A send() from the code a send() runs is
 * refused (ws_send).
 *
 * May call: asgi_ws_frames.c, asgi_ws_deny.c, asgi_call.c's asgi_ready, the HTTP/1
 * codec's head and framing (h1_head_asgi.c, h1_response.c), the connection
 * layer (conn.h).
 */
#include <stdlib.h>
#include <string.h>

#include "asgi_ws.h"

static PyObject *sha1, *b64;

/* ---- send --------------------------------------------------------------------------------------- */

/* the message keys send() reads beyond asgi_ws_frames.c's, interned once
 * (held by asgi_ws_deny.c, below this file, which reads them too) */

int ws_send_make_keys(void)
{
	struct { PyObject **at; const char *s; } keys[] = {
		{&K_SUBPROTOCOL, "subprotocol"}, {&K_HEADERS, "headers"}, {&K_BODY, "body"},
		{&K_MORE_BODY, "more_body"}, {&K_STATUS, "status"},
	};

	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (!(*keys[i].at = PyUnicode_InternFromString(keys[i].s)))
			return -1;
	return 0;
}

static PyObject *accept_key(WsCall *call)
{
	char in[24 + sizeof(WS_GUID) - 1];
	PyObject *h, *d, *r;

	if (!sha1) {
		PyObject *hl = PyImport_ImportModule("hashlib"), *ba = PyImport_ImportModule("binascii");

		sha1 = hl ? PyObject_GetAttrString(hl, "sha1") : NULL;
		b64 = ba ? PyObject_GetAttrString(ba, "b2a_base64") : NULL;
		Py_XDECREF(hl);
		Py_XDECREF(ba);
		if (!sha1 || !b64) {
			Py_CLEAR(sha1);
			return NULL;
		}
	}
	memcpy(in, call->key, 24);
	memcpy(in + 24, WS_GUID, sizeof(WS_GUID) - 1);
	h = PyObject_CallFunction(sha1, "y#", in, (Py_ssize_t)sizeof(in));
	d = h ? PyObject_CallMethod(h, "digest", NULL) : NULL;
	r = d ? PyObject_CallFunction(b64, "O", d) : NULL;   /* with a newline: dropped below */
	Py_XDECREF(h);
	Py_XDECREF(d);
	return r;
}

/* The 101's Sec-WebSocket-Extensions: the permessage-deflate we took. */
static int pmd_answer(struct conn *c, const struct ws_pmd *pmd)
{
	char v[WS_PMD_ANSWER_MAX];
	size_t n = ws_pmd_answer(pmd, v);

	if (conn_send(c, "Sec-WebSocket-Extensions: ", 26, 0) < 0 || conn_send(c, v, n, 0) < 0)
		return -1;
	return conn_send(c, "\r\n", 2, 0);
}

/* One message out as one frame: compressed (RSV1) when permessage-deflate
 * was negotiated and it is at least WS_DEFLATE_MIN bytes (below, deflate's
 * few bytes of framing rarely pay: RFC 7692 lets each message choose). */
#define WS_DEFLATE_MIN 64
static int message_out(WsCall *call, struct conn *c, int op, const char *s, size_t n)
{
	uint8_t *z;
	size_t zn;
	int rc;

	if (!call->wp.pmd || n < WS_DEFLATE_MIN)
		return ws_frame_out(c, op, s, n);
	if (ws_deflate_msg(call->wp.pmd, (const uint8_t *)s, n, &z, &zn) < 0) {
		PyErr_NoMemory();
		return -1;
	}
	rc = ws_frame_out(c, op | 0x40, (const char *)z, zn);
	free(z);
	return rc;
}

/* The app's Sec-WebSocket-Extensions in websocket.accept's headers, dropped
 * (h1_accept_block left it out of the 101): logged as a warning on the worker's logger, the
 * 101 goes on. Why dropped and not refused: the extensions in force are
 * the server's alone, which frames the messages (ASGI gives the app whole
 * messages: it can apply no extension, RSV1 included), so the one true
 * answer is the server's: its permessage-deflate when negotiated, none
 * otherwise. An app's copy would announce an extension nobody applies,
 * or a second permessage-deflate answer, which RFC 7692 5 and websockets'
 * client refuse (the connection fails); refusing the accept would fail a
 * WebSocket that works, for a header the app could not have made true.
 * As the ASGI spec does for Sec-WebSocket-Protocol (its subprotocol key),
 * the server's field wins. A logging failure is reported as unraisable:
 * the 101, in the output already, stands. */
static void drop_extensions(WsCall *call, PyObject *value)
{
	static PyObject *log;
	PyObject *path = call->scope ? PyDict_GetItemString(call->scope, "path") : NULL, *r = NULL;

	if (!log) {
		PyObject *logging = PyImport_ImportModule("logging");

		log = logging ? PyObject_CallMethod(logging, "getLogger", "s", "sockherd.worker") : NULL;
		Py_XDECREF(logging);
	}
	if (log)
		r = PyObject_CallMethod(log, "warning", "sOOs", "ASGI websocket.accept for %s: the "
		                        "app's Sec-WebSocket-Extensions %r dropped (the server's own "
		                        "answer stands: %s)", path ? path : Py_None, value,
		                        call->wp.pmd ? "permessage-deflate as negotiated" : "none");
	if (!r)
		PyErr_WriteUnraisable((PyObject *)call);
	Py_XDECREF(r);
}

/* websocket.accept: the 101, with the app's subprotocol and headers.
 * Each of the message's fields is read once, into what this call owns
 * (the subprotocol held, the headers checked and serialised into one
 * block, h1_accept_block), and that is what is written: a pair read
 * again to be written answered differently the second time (its
 * __getitem__), and what went out had never been checked: CR/LF, heap
 * bytes, a SIGSEGV (issue 35, point 1). */
static PyObject *do_accept(WsCall *call, PyObject *msg)
{
	struct conn *c = call->conn;
	PyObject *sub = NULL, *headers = NULL, *block = NULL, *dropped = NULL, *key = NULL, *r = NULL;
	static const char head[] = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
	                           "Connection: Upgrade\r\nSec-WebSocket-Accept: ";
	const char *date, *subs = NULL;
	Py_ssize_t subn = 0;
	size_t dn;

	if (call->state != ST_WAIT)
		goto late;
	if (!(sub = ws_field(msg, K_SUBPROTOCOL)) && PyErr_Occurred())
		goto out;
	if (!(headers = ws_field(msg, K_HEADERS)) && PyErr_Occurred())
		goto out;
	/* the Sec-WebSocket-Protocol value: a field value's check, the http
	 * scope's (control bytes reached the wire: issue 35, point 13) */
	if (sub && (!PyUnicode_Check(sub) || !(subs = PyUnicode_AsUTF8AndSize(sub, &subn)) ||
	            h1_has_ctl(subs, (size_t)subn))) {
		if (!PyErr_Occurred())
			PyErr_Format(PyExc_ValueError, "ASGI send(%.200R): subprotocol must be a str "
			             "without a control character", msg);
		goto out;
	}
	/* the app's Sec-WebSocket-Extensions: left out, logged below */
	if (!(dropped = PyList_New(0)) ||
	    h1_accept_block(headers ? headers : Py_None, "sec-websocket-extensions", dropped,
	                    &block) < 0 ||
	    !(key = accept_key(call)))
		goto out;
	/* the app's code ran in there (a lookup's __eq__, the headers'
	 * __iter__): the WebSocket as it is now */
	if (call->state != ST_WAIT)
		goto late;
	if (call->conn != c || c->closed) {
		PyErr_SetString(ClientDisconnected, "the client went away");
		goto out;
	}
	http_date(&date, &dn);
	if (conn_send(c, head, sizeof(head) - 1, 0) < 0 ||
	    conn_send(c, PyBytes_AS_STRING(key), 28, 0) < 0 ||
	    conn_send(c, "\r\n", 2, 0) < 0 || conn_send(c, date, dn, 0) < 0 ||
	    (subs && (conn_send(c, "Sec-WebSocket-Protocol: ", 24, 0) < 0 ||
	              conn_send(c, subs, (size_t)subn, 0) < 0 || conn_send(c, "\r\n", 2, 0) < 0)) ||
	    (call->wp.pmd && pmd_answer(c, &call->wp.pmd->neg) < 0) ||
	    conn_send(c, PyBytes_AS_STRING(block), (size_t)PyBytes_GET_SIZE(block), 0) < 0 ||
	    conn_send(c, "\r\n", 2, 1) < 0)
		goto out;
	srv_count(c->srv, 101);
	call->state = ST_OPEN;
	call->open_counted = 1;
	ws_open++;
	ws_ping_start(call);                       /* issue 35, point 27 (asgi_ws_ping.c) */
	/* logged once the 101 is out: the logging's code (the app's
	 * handlers) comes after the head, never inside it */
	for (Py_ssize_t i = 0; i < PyList_GET_SIZE(dropped); i++)
		drop_extensions(call, PyList_GET_ITEM(dropped, i));
	/* frames the client sent right behind its handshake */
	if (ws_pump(call) < 0)
		goto out;
	r = asgi_ready(Py_None);
	goto out;
late:
	PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R): websocket.accept after the "
	             "WebSocket was %s", msg, call->state == ST_OPEN ? "accepted" : "answered");
out:
	Py_XDECREF(sub);
	Py_XDECREF(headers);
	Py_XDECREF(block);
	Py_XDECREF(dropped);
	Py_XDECREF(key);
	return r;
}

/* websocket.send: one text or bytes message, one frame. text and bytes
 * held: the second lookup may run the app's code (a key's __eq__) that
 * empties the message (issue 35, point 2). */
static PyObject *do_send(WsCall *call, PyObject *msg)
{
	struct conn *c = call->conn;
	/* the interned keys: PyDict_GetItemString made, hashed and freed a
	 * str per lookup, ~2k instructions of a 1 KiB echo's ~35k */
	PyObject *text = ws_field(msg, K_TEXT), *data = NULL, *r = NULL;
	Py_buffer view = {0};
	const char *s;
	Py_ssize_t n;
	int rc;

	if (!text && PyErr_Occurred())
		return NULL;
	if (!(data = ws_field(msg, K_BYTES)) && PyErr_Occurred())
		goto out;
	if (call->state != ST_OPEN || call->close_sent) {
		if (call->finished && call->state != ST_WAIT) {
			PyErr_SetString(ClientDisconnected, "the WebSocket is closed");
			goto out;
		}
		PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R): websocket.send before "
		             "websocket.accept", msg);
		goto out;
	}
	if (!text == !data) {
		PyErr_Format(PyExc_ValueError, "ASGI send(%.200R): websocket.send takes one of 'text' "
		             "(str) and 'bytes'", msg);
		goto out;
	}
	if (text) {
		if (!PyUnicode_Check(text)) {
			PyErr_Format(PyExc_TypeError, "ASGI send(): websocket.send's text must be str, "
			             "not %.100s", Py_TYPE(text)->tp_name);
			goto out;
		}
		if (!(s = PyUnicode_AsUTF8AndSize(text, &n)))
			goto out;
		rc = message_out(call, c, WS_OP_TEXT, s, (size_t)n);
	}
	else {
		if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
			goto out;
		rc = message_out(call, c, WS_OP_BINARY, view.buf, (size_t)view.len);
		PyBuffer_Release(&view);
	}
	if (rc < 0)
		goto out;
	conn_flush(c);
	if (c->closed || !call->conn) {
		PyErr_SetString(ClientDisconnected, "the client went away");
		goto out;
	}
	if (conn_pending(c) > HIGH_WATER) {
		/* the app waits until the client takes it below LOW_WATER (resume) */
		call->tx = PyObject_CallMethod(call->aio, "create_future", NULL);
		r = Py_XNewRef(call->tx);
	}
	else
		r = asgi_ready(Py_None);
out:
	Py_XDECREF(text);
	Py_XDECREF(data);
	return r;
}

/* websocket.close: a close frame once accepted, a 403 before. code and
 * reason held: the second lookup may run the app's code (as do_send's). */
static PyObject *do_close(WsCall *call, PyObject *msg)
{
	PyObject *code_o = ws_field(msg, K_CODE), *reason_o = NULL, *r = NULL;
	long code = 1000;
	const char *reason = "";
	Py_ssize_t rlen = 0;

	if (!code_o && PyErr_Occurred())
		return NULL;
	if (!(reason_o = ws_field(msg, K_REASON)) && PyErr_Occurred())
		goto out;
	if (code_o) {
		code = PyLong_Check(code_o) ? PyLong_AsLong(code_o) : -1;
		if (code < 1000 || code > 4999 || code == 1005 || code == 1006 || code == 1015) {
			PyErr_Clear();
			PyErr_Format(PyExc_ValueError, "ASGI send(%.200R): websocket.close's code must be "
			             "an int a close frame may carry (1000-4999, not 1005/1006/1015)", msg);
			goto out;
		}
	}
	if (reason_o) {
		if (!PyUnicode_Check(reason_o) || !(reason = PyUnicode_AsUTF8AndSize(reason_o, &rlen)) ||
		    rlen > 123) {
			if (!PyErr_Occurred())
				PyErr_Format(PyExc_ValueError, "ASGI send(%.200R): websocket.close's reason "
				             "must be a str of at most 123 UTF-8 bytes", msg);
			goto out;
		}
	}
	if (call->state == ST_WAIT) {
		ws_finish(call, 1006, "", 0);
		ws_http_answer(call->conn, 403, "Forbidden");
	}
	else if (call->state == ST_OPEN) {
		ws_finish(call, (int)code, reason, (size_t)rlen);
		if (ws_close_out(call, (int)code, reason, (size_t)rlen) < 0)
			goto out;
	}
	else if (call->state == ST_DENY) {
		PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R): websocket.close during the "
		             "denial response", msg);
		goto out;
	}
	r = asgi_ready(Py_None);                   /* closed already: nothing more to say */
out:
	Py_XDECREF(code_o);
	Py_XDECREF(reason_o);
	return r;
}

static PyObject *send_one(WsCall *call, PyObject *msg)
{
	PyObject *type = asgi_send_type(msg), *r;
	struct conn *c;

	if (!type)
		return NULL;
	if (ws_owner_thread(call, "send()") < 0)
		return NULL;
	/* a send the app stopped awaiting (its bytes are out already) is
	 * dropped, as the http scope's is (issue 35, point 6) */
	if (asgi_waiting(&call->tx)) {
		PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R) while another send() of the same "
		             "WebSocket waits", msg);
		return NULL;
	}
	c = (struct conn *)Py_XNewRef(call->conn);
	if (!c || c->closed) {
		Py_XDECREF(c);
		if (PyUnicode_CompareWithASCIIString(type, "websocket.close") == 0)
			return asgi_ready(Py_None);        /* gone: closed all the same */
		PyErr_SetString(ClientDisconnected, "the client went away");
		return NULL;
	}
	if (PyUnicode_CompareWithASCIIString(type, "websocket.send") == 0)
		r = do_send(call, msg);
	else if (PyUnicode_CompareWithASCIIString(type, "websocket.accept") == 0)
		r = do_accept(call, msg);
	else if (PyUnicode_CompareWithASCIIString(type, "websocket.close") == 0)
		r = do_close(call, msg);
	else if (PyUnicode_CompareWithASCIIString(type, "websocket.http.response.start") == 0)
		r = ws_deny_start(call, msg);
	else if (PyUnicode_CompareWithASCIIString(type, "websocket.http.response.body") == 0)
		r = ws_deny_body(call, msg);
	else {
		PyErr_Format(PyExc_ValueError, "ASGI send(%.200R): not a message of a websocket scope "
		             "(websocket.accept, websocket.send, websocket.close, "
		             "websocket.http.response.start/body)", msg);
		r = NULL;
	}
	Py_DECREF(c);
	return r;
}

/* A send() from the app's code that a send() runs (a key's __eq__, the
 * accept's headers' __iter__, more_body's __bool__) is refused, as the
 * http scope's is (asgi_call.c Call_send): a websocket.close from inside
 * websocket.accept answered 403, then the outer accept wrote its 101
 * behind it and told the app it accepted; a denial body from inside the
 * body's more_body ended the response before the outer one's bytes. */
PyObject *ws_send(WsCall *call, PyObject *msg)
{
	PyObject *r;

	if (call->sending) {
		PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R) while a send() of the same "
		             "WebSocket is in progress (called from the code that send() runs)", msg);
		return NULL;
	}
	call->sending = 1;
	r = send_one(call, msg);
	call->sending = 0;
	return r;
}
