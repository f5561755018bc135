/* The ASGI adapter's websocket scope (ASGI spec 2.4, "WebSocket"): an
 * HTTP/1 request asking to upgrade (RFC 6455 4.2.1) is handed here
 * instead of becoming an http scope, and from then on its connection
 * carries WebSocket frames, parsed by the frame codec (ws_frame.c) from
 * the same input buffer the HTTP/1 parser filled, and framed back out.
 *
 * It rides on the HTTP/1 codec's call machinery (asgi.h, h1.h): the
 * connection holds the call (c->call) from the upgrade to its close, so
 *  - input is read and handed to input() (here: ws_input) with a bound
 *    on what waits unread (CALL_INPUT_MAX, h1_input_room): frames are
 *    parsed only while fewer than WS_QUEUE_MAX bytes of messages wait for
 *    the app's receive(), so a client that sends faster than the app
 *    receives is paused by TCP, never buffered without bound;
 *  - no header or keep-alive timer runs (h1_rearm: a call's connection is
 *    the app's); the keep-alive ping's does (asgi_ws_ping.c: a client
 *    silent for ws_ping_interval is pinged, closed 1011 if still silent
 *    ws_ping_timeout after), and the send timer: output that waits and
 *    that the client takes none of for body_timeout closes the
 *    connection, as for HTTP;
 *  - a send past HIGH_WATER waits until the output drains below LOW_WATER
 *    (resume), as an http.response.body does;
 *  - the connection's close drops the call (drop): the app's receive
 *    says websocket.disconnect (1006 unless a close code was exchanged),
 *    its send raises ClientDisconnected.
 * A connection with a call is never shared among threads nor moved
 * (asgi_app.c): each WebSocket lives on the loop thread that accepted it.
 *
 * permessage-deflate (RFC 7692, ws_deflate.c) only if the
 * ws_per_message_deflate setting is on: the client's offer is taken at
 * the upgrade, named in the 101, and from then on the codec inflates
 * what comes and send() deflates what goes; the app sees plain messages.
 *
 * The engine, not the app, answers pings (with the ping's payload) and
 * the client's close (its code echoed, then the connection closes); a
 * protocol error (ws_frame.c's list) is answered with its close code
 * (1002 / 1007 / 1009) and the app receives websocket.disconnect with it.
 *
 * Before the app runs: a handshake without a valid Sec-WebSocket-Key (or
 * without a version) is refused 400, a version other than 13 gets 426
 * with Sec-WebSocket-Version: 13. The app then decides: websocket.accept
 * (101, its subprotocol and headers), websocket.close (403), or the
 * websocket.http.response denial extension (its own HTTP response).
 *
 * The worker's drain (worker/loop.py going_away) ends each open WebSocket
 * with close 1001 at the drain's deadline (ws_going_away), never before.
 *
 * Its files (asgi_ws.h): this one (the upgrade checked and served, the
 * module's functions: the drain's going away, the settings), asgi_ws_call.c
 * (the call object: receive(), the app's end, its life, the connection's
 * side), asgi_ws_frames.c (the messages, frames out, the client's frames
 * in), asgi_ws_send.c (send()) and asgi_ws_deny.c (send()'s denial
 * response).
 *
 * May call: asgi_ws_call.c (the call's type), asgi_ws_frames.c,
 * asgi_ws_send.c, asgi_app.c's http entries (the requests that are not
 * upgrades), the frame codec (ws_frame.c), the HTTP/1 codec (h1.h), the
 * connection layer (conn.h).
 */
#include <string.h>
#include <strings.h>

#include "asgi_ws.h"

static unsigned long long max_size = 16u << 20;   /* ws_max_size (uvicorn's default) */
static int pmd_enabled;                           /* ws_per_message_deflate (off) */

/* ---- the handshake's request ------------------------------------------------------------------ */

/* The value of the first field named name (lower-case), trailing
 * whitespace off; NULL if none. */
static const char *field(const struct hp_parser *hp, const char *name, size_t *len)
{
	size_t nl = strlen(name);

	for (uint32_t i = 0; i < hp->nfields; i++) {
		const struct hp_field *f = &hp->fields[i];
		const char *v = hp->head + f->value;
		size_t vl = f->value_len;

		if (f->name_len != nl || strncasecmp(hp->head + f->name, name, nl))
			continue;
		while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
			vl--;
		*len = vl;
		return v;
	}
	return NULL;
}

/* A key is the base64 of 16 bytes: 22 characters of the alphabet, the
 * last one's low bits zero, then "==" (RFC 6455 4.1, item 7) */
static int key_ok(const char *k, size_t n)
{
	static const char b64s[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	const char *last;

	if (n != 24 || k[22] != '=' || k[23] != '=')
		return 0;
	for (int i = 0; i < 22; i++)
		if (!k[i] || !strchr(b64s, k[i]))
			return 0;
	last = strchr(b64s, k[21]);
	return ((last - b64s) & 0xF) == 0;
}

/* permessage-deflate (ws_deflate.c): the first offer we take, over the
 * Sec-WebSocket-Extensions fields in order; pmd.on 0 if none (or off). */
static void negotiate(const struct hp_parser *hp, struct ws_pmd *pmd)
{
	for (uint32_t i = 0; pmd_enabled && i < hp->nfields && !pmd->on; i++) {
		const struct hp_field *f = &hp->fields[i];

		if (f->name_len == 24 && !strncasecmp(hp->head + f->name, "sec-websocket-extensions", 24))
			ws_pmd_offers(hp->head + f->value, f->value_len, pmd);
	}
}

/* ---- the codec's entry: an upgrade served (the connection's side: asgi_ws_call.c) --------------- */

/* Whether this request asks for a WebSocket (RFC 6455 4.2.1: GET,
 * Upgrade: websocket, Connection: upgrade): other upgrades stay HTTP. */
static int wants_websocket(const struct hp_parser *hp)
{
	return hp->ll.method == HTTP_GET && hp->ll.http_minor == 1 &&
	       hp_has_token(hp, "upgrade", "websocket") && hp_has_token(hp, "connection", "upgrade");
}

/* The websocket scope from the http one the codec's request built:
 * type and scheme, no method, the subprotocols asked for, the denial
 * extension. */
static int make_scope(PyObject *scope, const struct hp_parser *hp)
{
	PyObject *subs = PyList_New(0), *v;
	int rc = -1;

	if (!subs)
		return -1;
	for (uint32_t i = 0; i < hp->nfields; i++) {
		const struct hp_field *f = &hp->fields[i];
		const char *s = hp->head + f->value, *end = s + f->value_len, *item;
		size_t len;

		if (f->name_len != 22 || strncasecmp(hp->head + f->name, "sec-websocket-protocol", 22))
			continue;
		while (hp_list_next(&s, end, &item, &len)) {
			if (!len)
				continue;
			v = PyUnicode_DecodeLatin1(item, (Py_ssize_t)len, NULL);
			if (!v || PyList_Append(subs, v) < 0) {
				Py_XDECREF(v);
				goto out;
			}
			Py_DECREF(v);
		}
	}
	/* wss over TLS (the http scope's https: the connection's, or a
	 * trusted proxy's) */
	v = PyDict_GetItemString(scope, "scheme");            /* borrowed */
	if (PyDict_SetItemString(scope, "subprotocols", subs) < 0 ||
	    PyDict_SetItemString(scope, "type", V_WEBSOCKET) < 0)
		goto out;
	if (v && PyUnicode_Check(v) && PyUnicode_CompareWithASCIIString(v, "https") == 0)
		v = PyUnicode_FromString("wss");
	else
		v = Py_NewRef(V_WS);
	if (!v || PyDict_SetItemString(scope, "scheme", v) < 0) {
		Py_XDECREF(v);
		goto out;
	}
	Py_DECREF(v);
	if (PyDict_DelItemString(scope, "method") < 0)
		PyErr_Clear();
	/* the connection's extensions (proxy, tls) kept from the http scope,
	 * the denial one added; the http ones (pathsend) are not a socket's */
	{
		PyObject *old = PyDict_GetItemString(scope, "extensions");   /* borrowed */
		PyObject *ext = Py_BuildValue("{O{}}", K_WS_DENIAL);
		static const char *const kept[] = {"proxy", "tls"};
		int bad = !ext;

		for (int i = 0; !bad && old && i < 2; i++) {
			PyObject *e = PyDict_GetItemString(old, kept[i]);          /* borrowed */

			bad = e && PyDict_SetItemString(ext, kept[i], e) < 0;
		}
		bad = bad || PyDict_SetItemString(scope, "extensions", ext) < 0;
		Py_XDECREF(ext);
		if (bad)
			goto out;
	}
	rc = 0;
out:
	Py_DECREF(subs);
	return rc;
}

/* struct app_ops's serve for an ASGI Server: an upgrade to WebSocket is
 * this file's (checked, then its app started as a task, as asgi_serve
 * does for http), any other request asgi_app.c's. */
int asgi_ws_serve(struct conn *c, PyObject *scope, int whole)
{
	Server *s = c->srv;
	const struct hp_parser *hp = c->parser->hp;
	const char *key, *ver;
	size_t klen = 0, vlen = 0;
	struct ws_pmd pmd = {0};
	WsCall *call;
	int rc;

	if (!wants_websocket(hp))
		return asgi_serve(c, scope, whole);
	key = field(hp, "sec-websocket-key", &klen);
	ver = field(hp, "sec-websocket-version", &vlen);
	if (!key || !key_ok(key, klen)) {
		conn_refuse(c, 400, key ? "Sec-WebSocket-Key is not the base64 of 16 bytes"
		                         : "a WebSocket handshake without Sec-WebSocket-Key");
		return RESPOND_CLOSE;
	}
	if (!ver) {
		conn_refuse(c, 400, "a WebSocket handshake without Sec-WebSocket-Version");
		return RESPOND_CLOSE;
	}
	if (vlen != 2 || memcmp(ver, "13", 2)) {
		ws_http_answer(c, 426, "Upgrade Required\r\nSec-WebSocket-Version: 13");
		return RESPOND_CLOSE;
	}
	if (make_scope(scope, hp) < 0)
		return -1;
	call = PyObject_GC_New(WsCall, &WsCallType);
	if (!call)
		return -1;
	memset((char *)call + sizeof(PyObject), 0, sizeof(WsCall) - sizeof(PyObject));
	call->srv = (Server *)Py_NewRef(s);
	call->conn = (struct conn *)Py_NewRef(c);
	call->scope = Py_NewRef(scope);
	call->aio = Py_XNewRef(s->thr[c->pos].aio);
	memcpy(call->key, key, 24);
	ws_init(&call->wp, max_size);
	negotiate(hp, &pmd);
	call->next = all_calls;
	if (all_calls)
		all_calls->prev = call;
	all_calls = call;
	PyObject_GC_Track(call);
	/* permessage-deflate's state allocated only when it was negotiated */
	if (!call->aio || (pmd.on && ws_pmd_attach(&call->wp, &pmd) < 0)) {
		if (call->aio)
			PyErr_NoMemory();
		else if (!PyErr_Occurred())
			PyErr_SetString(PyExc_RuntimeError, "ASGI: the loop thread has no asyncio loop");
		Py_DECREF(call);
		return -1;
	}
	/* the call itself is its runner's done() (Ws_call): no function
	 * object per call (memory per idle WebSocket) */
	rc = asgi_start_task(c, (PyObject *)call, scope, call->aio, NULL);
	if (rc == RESPOND_PARKED)
		parser_release(c->parser);             /* the handshake's head: in the scope now */
	Py_DECREF(call);
	return rc;
}

/* ---- the module's functions -------------------------------------------------------------------- */

static PyObject *py_ws_open(PyObject *mod, PyObject *noarg)
{
	(void)mod;
	(void)noarg;
	return PyLong_FromLong(ws_open);
}

/* Whether call is in all_calls (unlink_call: its connection's drop, its dealloc). */
static int call_linked(const WsCall *call)
{
	return call->prev || all_calls == call;
}

/* Every WebSocket of the calling loop thread of server ends with close
 * 1001 (going away): the drain's deadline (worker/loop.py going_away). */
static PyObject *py_ws_going_away(PyObject *mod, PyObject *server)
{
	Server *s = (Server *)server;
	int pos, n = 0;

	(void)mod;
	if (!PyObject_TypeCheck(server, server_type)) {
		PyErr_SetString(PyExc_TypeError, "ws_going_away(server)");
		return NULL;
	}
	pos = srv_current(s);
	if (pos < 0) {
		PyErr_SetString(PyExc_RuntimeError, "ws_going_away() from a thread that is not a loop "
		             "thread of this server");
		return NULL;
	}
	for (WsCall *call = all_calls, *next; call; call = next) {
		struct conn *c = call->conn;

		next = call->next;
		if (!c || c->srv != s || c->pos != pos || c->closed || call->finished)
			continue;
		Py_INCREF(call);
		Py_XINCREF(next);
		if (call->state == ST_OPEN) {
			ws_finish(call, 1001, "", 0);
			if (ws_close_out(call, 1001, "going away", 10) < 0)
				PyErr_WriteUnraisable((PyObject *)call);
			n++;
		}
		else {
			ws_finish(call, 1006, "", 0);
			ws_http_answer(c, 503, "Service Unavailable");
		}
		/* a close at once (a 503 with nothing unread, a send that
		 * failed) unlinked call, its next NULL: not the list's end
		 * (issue 35, review 2: the WebSockets behind it were never told
		 * 1001). A linked call is alive (its connection holds it), so
		 * the one to go on with is read before our references go. */
		{
			WsCall *held = next;

			if (call_linked(call))
				next = call->next;
			else if (!held || call_linked(held))
				next = held;
			else
				next = all_calls;              /* both unlinked: from the start (finished ones skipped) */
			Py_DECREF(call);
			Py_XDECREF(held);
		}
	}
	return PyLong_FromLong(n);
}

static PyObject *py_ws_held(PyObject *mod, PyObject *noarg)
{
	(void)mod;
	(void)noarg;
	return PyLong_FromSize_t(ws_held);
}

static PyObject *py_ws_settings(PyObject *mod, PyObject *args)
{
	unsigned long long size;
	int deflate = 0;

	(void)mod;
	if (!PyArg_ParseTuple(args, "K|p:ws_settings", &size, &deflate))
		return NULL;
	if (deflate && !size) {
		/* a compressed message would inflate without bound (issue 35,
		 * point 23: a 255 KiB one to 256 MiB); settings.py says so first */
		PyErr_SetString(PyExc_ValueError, "ws_settings(): permessage-deflate needs a message "
		                "bound (max_size 0 is none)");
		return NULL;
	}
	max_size = size;
	pmd_enabled = deflate;
	Py_RETURN_NONE;
}

PyMethodDef asgi_ws_module_methods[] = {
	{"ws_open", py_ws_open, METH_NOARGS, "ws_open() -> the WebSockets open in this process"},
	{"ws_going_away", py_ws_going_away, METH_O,
	 "ws_going_away(server): close 1001 to each WebSocket of the calling loop thread; how many"},
	{"ws_held", py_ws_held, METH_NOARGS,
	 "ws_held() -> the bytes every WebSocket's receive queue holds in this process"},
	{"ws_settings", py_ws_settings, METH_VARARGS,
	 "ws_settings(max_size, deflate=False): a message's bound (close 1009 past it; 0 none, "
	 "not with deflate), whether permessage-deflate is negotiated"},
	{NULL},
};

int asgi_ws_make_keys(void)
{
	struct { PyObject **at; const char *s; } keys[] = {
		{&K_TYPE, "type"}, {&K_TEXT, "text"}, {&K_BYTES, "bytes"}, {&K_CODE, "code"},
		{&K_REASON, "reason"}, {&V_CONNECT, "websocket.connect"},
		{&V_RECEIVE, "websocket.receive"}, {&V_DISCONNECT, "websocket.disconnect"},
		{&V_WEBSOCKET, "websocket"}, {&V_WS, "ws"}, {&K_WS_DENIAL, "websocket.http.response"},
	};

	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (!(*keys[i].at = PyUnicode_InternFromString(keys[i].s)))
			return -1;
	return ws_send_make_keys() < 0 ? -1 : ws_cost_init();
}

