/* The websocket.http.response denial extension's send() (asgi_ws.h;
 * ASGI spec 2.4, "Denial Response"): the app answers a WebSocket
 * handshake with an HTTP response of its own instead of a 101 or a 403,
 * websocket.http.response.start's status and headers framed as an http
 * scope's head (h1_head_asgi.c head_from_asgi), websocket.http.response.body
 * its body, the connection closed after it (never kept alive: the client
 * asked for an upgrade). Split off asgi_ws_send.c, its caller (ws_send).
 *
 * May call: asgi_ws_frames.c (ws_finish), asgi_call.c's asgi_ready, the
 * HTTP/1 codec's head and framing (h1_head_asgi.c, h1_response.c), the
 * connection layer (conn.h).
 */
#include "asgi_ws.h"

/* the message keys of send() and of the denial (asgi_ws.h), interned by
 * asgi_ws_send.c's ws_send_make_keys */
PyObject *K_SUBPROTOCOL, *K_HEADERS, *K_BODY, *K_MORE_BODY, *K_STATUS;

/* websocket.http.response.start: the denial response's head, framed.
 * status and headers held (the headers' lookup, their __iter__: the
 * app's code). */
PyObject *ws_deny_start(WsCall *call, PyObject *msg)
{
	PyObject *status, *headers = NULL, *prefix;
	long long length;
	int flags, code, rc;

	if (call->state != ST_WAIT) {
		PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R): websocket.http.response.start "
		             "after the WebSocket was accepted or answered", msg);
		return NULL;
	}
	if (!(status = ws_field(msg, K_STATUS))) {
		if (!PyErr_Occurred())
			PyErr_Format(PyExc_ValueError, "ASGI send(%.200R): without a status", msg);
		return NULL;
	}
	if (!(headers = ws_field(msg, K_HEADERS)) && PyErr_Occurred()) {
		Py_DECREF(status);
		return NULL;
	}
	rc = head_from_asgi(status, headers ? headers : Py_None, &prefix, &length, &flags, &code);
	Py_DECREF(status);
	Py_XDECREF(headers);
	if (rc < 0)
		return NULL;
	/* the app's code ran (the headers' __iter__): the WebSocket as it is now */
	if (call->state != ST_WAIT) {
		Py_DECREF(prefix);
		PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R): websocket.http.response.start "
		             "after the WebSocket was answered", msg);
		return NULL;
	}
	/* the framing's own allocation: only a denial needs one */
	if (!call->f && !(call->f = PyMem_Malloc(sizeof(*call->f)))) {
		Py_DECREF(prefix);
		return PyErr_NoMemory();
	}
	*call->f = (struct h1_frame){.http11 = 1, .keep = 0, .length = length, .code = code,
	                             .prefix = prefix, .app_date = !!(flags & HEAD_APP_DATE),
	                             .app_server = !!(flags & HEAD_APP_SERVER),
	                             .bodiless = code == 204 || code == 304 || code < 200};
	call->state = ST_DENY;
	return asgi_ready(Py_None);
}

/* websocket.http.response.body: the denial's body. body and more_body
 * held: more_body's __bool__ is the app's code, which may empty the
 * message; the freed body's buffer went out (issue 35, point 2). */
PyObject *ws_deny_body(WsCall *call, PyObject *msg)
{
	struct conn *c = call->conn;
	PyObject *data = ws_field(msg, K_BODY), *more_o = NULL, *r = NULL;
	Py_buffer view = {0};
	int more = 0;

	if (!data && PyErr_Occurred())
		return NULL;
	if (!(more_o = ws_field(msg, K_MORE_BODY)) && PyErr_Occurred())
		goto out;
	if (more_o && (more = PyObject_IsTrue(more_o)) < 0)
		goto out;
	/* after more_body's __bool__: the call as that code left it */
	if (call->state != ST_DENY) {
		PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R): websocket.http.response.body "
		             "without websocket.http.response.start", msg);
		goto out;
	}
	if (call->conn != c || c->closed) {
		PyErr_SetString(ClientDisconnected, "the client went away");
		goto out;
	}
	if (data && PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
		goto out;
	if (!call->head_sent) {
		if (h1_head(c, call->f, more ? -1 : (long long)view.len) < 0)
			goto out;
		call->head_sent = 1;
	}
	if (view.len && h1_send_body(c, call->f, view.buf, (size_t)view.len, 0, 0) < 0)
		goto out;
	if (!more) {
		if (h1_end_body(c, call->f) < 0)
			goto out;
		srv_count(c->srv, call->f->code);
		ws_finish(call, 1006, "", 0);
		conn_close_soft(c);
	}
	conn_flush(c);
	r = asgi_ready(Py_None);
out:
	PyBuffer_Release(&view);
	Py_XDECREF(data);
	Py_XDECREF(more_o);
	return r;
}
