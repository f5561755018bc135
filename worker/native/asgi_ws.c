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
 *    the app's): an idle WebSocket is never cut by the engine. The one
 *    timer left is the send timer: output that waits and that the client
 *    takes none of for body_timeout closes the connection, as for HTTP;
 *  - a send past HIGH_WATER waits until the output drains below LOW_WATER
 *    (resume), as an http.response.body does;
 *  - the connection's close drops the call (drop): the app's receive
 *    says websocket.disconnect (1006 unless a close code was exchanged),
 *    its send raises ClientDisconnected.
 * A connection with a call is never shared among threads nor moved
 * (asgi_app.c): each WebSocket lives on the loop thread that accepted it.
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
 * May call: asgi_app.c's http entries (the requests that are not
 * upgrades), the frame codec (ws_frame.c), the HTTP/1 codec (h1.h), the
 * connection layer (conn.h).
 */
#include <string.h>
#include <strings.h>

#include "asgi.h"
#include "ws.h"

#define WS_QUEUE_MAX (256u << 10)          /* message bytes parsed, not received yet */
#define WS_GUID "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

/* WAIT: before the app's answer; OPEN: accepted; DENY: the denial
 * response started; DONE: closed (or refused) */
enum { ST_WAIT = 0, ST_OPEN, ST_DENY, ST_DONE };

typedef struct WsCall {
	PyObject_HEAD
	Server *srv;
	HttpConn *conn;                    /* NULL once the connection closed */
	PyObject *scope, *aio, *rx, *tx;
	PyObject *queue;                   /* messages for receive(), in order */
	size_t queued;                     /* their payload bytes */
	char key[24];                      /* Sec-WebSocket-Key, checked */
	struct ws_parser wp;
	struct h1_frame f;                 /* the denial response's framing */
	int state;
	/* connect_taken: websocket.connect was received; close_sent: our close
	 * frame is out (nothing but it after); finished: the disconnect is
	 * queued (the last message); ended: the app returned; open_counted:
	 * counted in ws_open; head_sent: the denial's head is out; close_rcvd:
 * the client's close frame came */
	unsigned connect_taken : 1, close_sent : 1, finished : 1, ended : 1, open_counted : 1,
	         head_sent : 1, close_rcvd : 1;
	struct WsCall *prev, *next;        /* every live call (ws_going_away) */
} WsCall;

static WsCall *all_calls;                  /* GIL-protected, as every call */
static long ws_open;                       /* accepted and not closed */
static unsigned long long max_size = 16u << 20;   /* ws_max_size (uvicorn's default) */
static PyObject *K_TYPE, *K_TEXT, *K_BYTES, *K_CODE, *K_REASON, *V_CONNECT, *V_RECEIVE,
                *V_DISCONNECT, *V_WEBSOCKET, *V_WS, *sha1, *b64;

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

/* Whether some field named name lists token (comma-separated,
 * case-insensitive: Connection: keep-alive, Upgrade). */
static int has_token(const struct hp_parser *hp, const char *name, const char *token)
{
	size_t nl = strlen(name), tl = strlen(token);

	for (uint32_t i = 0; i < hp->nfields; i++) {
		const struct hp_field *f = &hp->fields[i];
		const char *v = hp->head + f->value, *end = v + f->value_len;

		if (f->name_len != nl || strncasecmp(hp->head + f->name, name, nl))
			continue;
		while (v < end) {
			const char *comma = memchr(v, ',', (size_t)(end - v)), *e = comma ? comma : end;

			while (v < e && (*v == ' ' || *v == '\t'))
				v++;
			while (e > v && (e[-1] == ' ' || e[-1] == '\t'))
				e--;
			if ((size_t)(e - v) == tl && !strncasecmp(v, token, tl))
				return 1;
			v = comma ? comma + 1 : end;
		}
	}
	return 0;
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

/* ---- messages ---------------------------------------------------------------------------------- */

static PyObject *message(PyObject *type, PyObject *k1, PyObject *v1, PyObject *k2, PyObject *v2)
{
	PyObject *d = PyDict_New();

	if (d && (PyDict_SetItem(d, K_TYPE, type) < 0 || (k1 && PyDict_SetItem(d, k1, v1) < 0) ||
	          (k2 && PyDict_SetItem(d, k2, v2) < 0)))
		Py_CLEAR(d);
	return d;
}

/* The first queued message, taken off the queue (a new reference), its
 * bytes off the count: exact once the queue is empty, an estimate before
 * for text (its code points by their width: the bound, not an account).
 * The disconnect stays: it is said again to a receive after it. */
static PyObject *take(WsCall *call)
{
	PyObject *msg, *t, *b;
	size_t n;

	if (!PyList_GET_SIZE(call->queue))
		return NULL;
	msg = Py_NewRef(PyList_GET_ITEM(call->queue, 0));
	if (call->finished && PyList_GET_SIZE(call->queue) == 1)
		return msg;
	if (PyList_SetSlice(call->queue, 0, 1, NULL) < 0) {
		Py_DECREF(msg);
		return NULL;
	}
	t = PyDict_GetItem(msg, K_TEXT);
	b = PyDict_GetItem(msg, K_BYTES);
	n = t ? (size_t)PyUnicode_GET_LENGTH(t) * PyUnicode_KIND(t) : b ? (size_t)PyBytes_GET_SIZE(b) : 0;
	call->queued = !PyList_GET_SIZE(call->queue) || n > call->queued ? 0 : call->queued - n;
	return msg;
}

/* The first queued message to a waiting receive(). */
static void deliver(WsCall *call)
{
	PyObject *msg;

	if (!call->rx || !PyList_GET_SIZE(call->queue))
		return;
	if (!(msg = take(call)))
		PyErr_WriteUnraisable((PyObject *)call);
	else {
		asgi_resolve(&call->rx, msg, NULL);
		Py_DECREF(msg);
	}
}

/* The call's last message, websocket.disconnect with code: queued once;
 * the WebSocket no longer counts as open. */
static void finish(WsCall *call, int code, const char *reason, size_t rlen)
{
	PyObject *c, *r, *msg;

	if (call->finished)
		return;
	call->finished = 1;
	call->state = ST_DONE;
	if (call->open_counted) {
		call->open_counted = 0;
		ws_open--;
	}
	c = PyLong_FromLong(code);
	r = PyUnicode_DecodeUTF8(reason, (Py_ssize_t)rlen, "replace");
	msg = c && r ? message(V_DISCONNECT, K_CODE, c, K_REASON, r) : NULL;
	if (!msg || PyList_Append(call->queue, msg) < 0)
		PyErr_WriteUnraisable((PyObject *)call);
	Py_XDECREF(c);
	Py_XDECREF(r);
	Py_XDECREF(msg);
	deliver(call);
}

/* ---- output ------------------------------------------------------------------------------------ */

/* One server frame into the output (not flushed). */
static int frame_out(HttpConn *c, int op, const char *data, size_t n)
{
	uint8_t head[10];
	size_t hn = ws_frame_head(head, op, n);

	if (hconn_send(c, (const char *)head, hn, 0) < 0)
		return -1;
	return hconn_send(c, data, n, 0);
}

/* Our close frame (code 0: none), then the connection closes once it is
 * out. If the close is ours (the client's did not come), the client
 * still owes its answer: the connection lingers (asgi_ws_unread), our FIN
 * right behind the frame, its answer read and dropped until its FIN; a
 * close() at once would meet that answer with a reset, and a reset can
 * destroy our close frame before the client reads it (found by the
 * drain's test: clients cut with no close frame). */
static int close_out(WsCall *call, int code, const char *reason, size_t rlen)
{
	HttpConn *c = call->conn;
	char payload[125];

	if (!c || call->close_sent)
		return 0;
	call->close_sent = 1;
	if (rlen > 123)
		rlen = 123;
	payload[0] = (char)(code >> 8);
	payload[1] = (char)code;
	memcpy(payload + 2, reason, rlen);
	if (frame_out(c, WS_OP_CLOSE, payload, code ? rlen + 2 : 0) < 0)
		return -1;
	Py_INCREF(c);                              /* the close may drop the call's */
	hconn_close_soft(c);
	hconn_flush(c);
	Py_DECREF(c);
	return 0;
}

/* An HTTP answer of ours (a refusal before the app, its 403) and the close. */
static void http_answer(HttpConn *c, int status, const char *head)
{
	const char *date;
	size_t dn;
	char buf[512];
	int n;

	http_date(&date, &dn);
	n = snprintf(buf, sizeof(buf), "HTTP/1.1 %d %s\r\n%.*sContent-Length: 0\r\n"
	             "Connection: close\r\n\r\n", status, head, (int)dn, date);
	srv_count(c->srv, status);
	if (hconn_send(c, buf, (size_t)n, 0) < 0)
		PyErr_Clear();                         /* no memory: the close says enough */
	hconn_close_soft(c);
	hconn_flush(c);
}

/* ---- input: frames ------------------------------------------------------------------------------ */

/* Parses what the connection buffered into messages for receive(), while
 * fewer than WS_QUEUE_MAX bytes of them wait; answers pings and the
 * client's close, and a protocol error with its code. 0 or -1 (memory). */
static int pump(WsCall *call)
{
	HttpConn *c = call->conn;
	Parser *p;
	int rc = 0;

	if (!c || c->closed || call->state != ST_OPEN)
		return 0;
	p = c->parser;
	Py_INCREF(c);
	while (!call->finished && call->queued < WS_QUEUE_MAX && call->conn) {
		size_t used;
		int ev = ws_parse(&call->wp, (const uint8_t *)p->pending + p->start, p->len - p->start,
		                  &used);
		struct ws_parser *wp = &call->wp;
		PyObject *v, *msg;

		p->start += used;
		if (ev == WS_MORE)
			break;
		switch (ev) {
		case -1:
			PyErr_NoMemory();
			rc = -1;
			goto out;
		case WS_TEXT:
		case WS_BINARY:
			v = ev == WS_TEXT ? PyUnicode_DecodeUTF8(wp->msg ? wp->msg : "", (Py_ssize_t)wp->msg_len, NULL)
			                  : PyBytes_FromStringAndSize(wp->msg, (Py_ssize_t)wp->msg_len);
			msg = v ? message(V_RECEIVE, ev == WS_TEXT ? K_TEXT : K_BYTES, v, NULL, NULL) : NULL;
			Py_XDECREF(v);
			if (!msg || PyList_Append(call->queue, msg) < 0) {
				Py_XDECREF(msg);
				rc = -1;
				goto out;
			}
			Py_DECREF(msg);
			call->queued += wp->msg_len;
			break;
		case WS_PING:
			if (!call->close_sent && frame_out(c, WS_OP_PONG, (const char *)wp->ctl,
			                                    wp->ctl_len) < 0) {
				rc = -1;
				goto out;
			}
			break;
		case WS_PONG:
			break;                             /* unsolicited, or ours: nothing to do */
		case WS_CLOSE: {
			/* the closing handshake: its code echoed (none if it gave
			 * none), the app told, the connection closed */
			int code = wp->close_code;
			const char *reason = wp->ctl_len > 2 ? (const char *)wp->ctl + 2 : "";
			size_t rl = wp->ctl_len > 2 ? wp->ctl_len - 2u : 0;

			call->close_rcvd = 1;
			finish(call, code, reason, rl);
			if (close_out(call, code == 1005 ? 0 : code, "", 0) < 0)
				rc = -1;
			goto out;
		}
		default:                               /* WS_FAIL: the client broke the protocol */
			finish(call, wp->fail_code, "", 0);
			if (close_out(call, wp->fail_code, wp->fail_reason, strlen(wp->fail_reason)) < 0)
				rc = -1;
			goto out;
		}
	}
	if (!call->finished && c->peer_eof && call->queued < WS_QUEUE_MAX)
		finish(call, 1006, "", 0);             /* its end without a close frame */
	if (!c->closed) {
		h1_input_room(c);                      /* taken: reading may go on */
		hconn_flush(c);                        /* the pongs */
	}
out:
	Py_DECREF(c);
	deliver(call);
	return rc;
}

/* ---- receive ------------------------------------------------------------------------------------ */

static int owner_thread(WsCall *call, const char *what)
{
	HttpConn *c = call->conn;

	if (c && srv_current(c->srv) != c->pos) {
		PyErr_Format(PyExc_RuntimeError, "ASGI %s from a thread that is not the WebSocket's "
		             "loop thread (use loop.call_soon_threadsafe)", what);
		return -1;
	}
	return 0;
}

/* The next message: websocket.connect first, then the client's messages
 * and its end (websocket.disconnect, again if asked again). */
static PyObject *ws_receive(WsCall *call, PyObject *noarg)
{
	PyObject *msg, *r;

	(void)noarg;
	if (owner_thread(call, "receive()") < 0)
		return NULL;
	if (!call->connect_taken) {
		call->connect_taken = 1;
		msg = message(V_CONNECT, NULL, NULL, NULL, NULL);
		r = msg ? asgi_ready(msg) : NULL;
		Py_XDECREF(msg);
		return r;
	}
	if (call->rx) {
		PyErr_SetString(PyExc_RuntimeError, "ASGI receive() called while another receive() of "
		                "the same WebSocket waits");
		return NULL;
	}
	if (!PyList_GET_SIZE(call->queue) && pump(call) < 0)
		return NULL;
	if (!PyList_GET_SIZE(call->queue) && !call->finished && !call->conn)
		finish(call, 1006, "", 0);
	if (PyList_GET_SIZE(call->queue)) {
		if (!(msg = take(call)))
			return NULL;
		/* room again: what waits is parsed (the pongs it owes said) */
		if (call->state == ST_OPEN && pump(call) < 0) {
			Py_DECREF(msg);
			return NULL;
		}
		r = asgi_ready(msg);
		Py_DECREF(msg);
		return r;
	}
	call->rx = PyObject_CallMethod(call->aio, "create_future", NULL);
	return Py_XNewRef(call->rx);
}

/* ---- send --------------------------------------------------------------------------------------- */

/* A header name or value the app gave: bytes, no CR / LF / NUL (and a
 * name a token's characters). */
static int header_ok(PyObject *o, int name)
{
	const char *s;
	Py_ssize_t n;

	if (!PyBytes_Check(o))
		return 0;
	s = PyBytes_AS_STRING(o);
	n = PyBytes_GET_SIZE(o);
	if (name && !n)
		return 0;
	for (Py_ssize_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];

		if (ch == '\r' || ch == '\n' || ch == 0 || (name && (ch <= ' ' || ch == ':' || ch >= 127)))
			return 0;
	}
	return 1;
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

/* websocket.accept: the 101, with the app's subprotocol and headers. */
static PyObject *do_accept(WsCall *call, PyObject *msg)
{
	HttpConn *c = call->conn;
	PyObject *sub = PyDict_GetItemString(msg, "subprotocol"), *headers, *seq = NULL, *key;
	static const char head[] = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
	                           "Connection: Upgrade\r\nSec-WebSocket-Accept: ";
	const char *date, *subs = NULL;
	Py_ssize_t subn = 0;
	size_t dn;

	if (call->state != ST_WAIT) {
		PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R): websocket.accept after the "
		             "WebSocket was %s", msg, call->state == ST_OPEN ? "accepted" : "answered");
		return NULL;
	}
	if (sub && sub != Py_None) {
		if (!PyUnicode_Check(sub) || !(subs = PyUnicode_AsUTF8AndSize(sub, &subn)) ||
		    strpbrk(subs, "\r\n") || (Py_ssize_t)strlen(subs) != subn) {
			if (!PyErr_Occurred())
				PyErr_Format(PyExc_ValueError, "ASGI send(%.200R): subprotocol must be a str "
				             "without CR or LF", msg);
			return NULL;
		}
	}
	headers = PyDict_GetItemString(msg, "headers");
	if (headers && headers != Py_None) {
		seq = PySequence_Fast(headers, "websocket.accept's headers must be a sequence of pairs");
		if (!seq)
			return NULL;
		for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
			PyObject *pair = PySequence_Fast_GET_ITEM(seq, i);

			if (!PySequence_Check(pair) || PySequence_Size(pair) != 2) {
				PyErr_Clear();
				goto bad_header;
			}
			PyObject *n = PySequence_GetItem(pair, 0), *v = PySequence_GetItem(pair, 1);
			int ok = n && v && header_ok(n, 1) && header_ok(v, 0);

			Py_XDECREF(n);
			Py_XDECREF(v);
			if (!ok) {
				PyErr_Clear();
				goto bad_header;
			}
		}
	}
	if (!(key = accept_key(call)))
		goto fail;
	http_date(&date, &dn);
	if (hconn_send(c, head, sizeof(head) - 1, 0) < 0 ||
	    hconn_send(c, PyBytes_AS_STRING(key), 28, 0) < 0 ||
	    hconn_send(c, "\r\n", 2, 0) < 0 || hconn_send(c, date, dn, 0) < 0 ||
	    (subs && (hconn_send(c, "Sec-WebSocket-Protocol: ", 24, 0) < 0 ||
	              hconn_send(c, subs, (size_t)subn, 0) < 0 || hconn_send(c, "\r\n", 2, 0) < 0))) {
		Py_DECREF(key);
		goto fail;
	}
	Py_DECREF(key);
	for (Py_ssize_t i = 0; seq && i < PySequence_Fast_GET_SIZE(seq); i++) {
		PyObject *pair = PySequence_Fast_GET_ITEM(seq, i);
		PyObject *n = PySequence_GetItem(pair, 0), *v = PySequence_GetItem(pair, 1);
		int rc = n && v ? 0 : -1;

		if (!rc && (hconn_send(c, PyBytes_AS_STRING(n), (size_t)PyBytes_GET_SIZE(n), 0) < 0 ||
		            hconn_send(c, ": ", 2, 0) < 0 ||
		            hconn_send(c, PyBytes_AS_STRING(v), (size_t)PyBytes_GET_SIZE(v), 0) < 0 ||
		            hconn_send(c, "\r\n", 2, 0) < 0))
			rc = -1;
		Py_XDECREF(n);
		Py_XDECREF(v);
		if (rc < 0)
			goto fail;
	}
	Py_XDECREF(seq);
	if (hconn_send(c, "\r\n", 2, 1) < 0)
		return NULL;
	srv_count(c->srv, 101);
	call->state = ST_OPEN;
	call->open_counted = 1;
	ws_open++;
	/* frames the client sent right behind its handshake */
	if (pump(call) < 0)
		return NULL;
	return asgi_ready(Py_None);
bad_header:
	PyErr_Format(PyExc_ValueError, "ASGI send(%.200R): websocket.accept's headers must be "
	             "[name, value] pairs of bytes without CR, LF or NUL", msg);
fail:
	Py_XDECREF(seq);
	return NULL;
}

/* websocket.send: one text or bytes message, one frame. */
static PyObject *do_send(WsCall *call, PyObject *msg)
{
	HttpConn *c = call->conn;
	PyObject *text = PyDict_GetItemString(msg, "text"), *data = PyDict_GetItemString(msg, "bytes");
	Py_buffer view = {0};
	const char *s;
	Py_ssize_t n;
	int rc;

	if (text == Py_None)
		text = NULL;
	if (data == Py_None)
		data = NULL;
	if (call->state != ST_OPEN || call->close_sent) {
		if (call->finished && call->state != ST_WAIT) {
			PyErr_SetString(ClientDisconnected, "the WebSocket is closed");
			return NULL;
		}
		PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R): websocket.send before "
		             "websocket.accept", msg);
		return NULL;
	}
	if (!text == !data) {
		PyErr_Format(PyExc_ValueError, "ASGI send(%.200R): websocket.send takes one of 'text' "
		             "(str) and 'bytes'", msg);
		return NULL;
	}
	if (text) {
		if (!PyUnicode_Check(text)) {
			PyErr_Format(PyExc_TypeError, "ASGI send(): websocket.send's text must be str, "
			             "not %.100s", Py_TYPE(text)->tp_name);
			return NULL;
		}
		if (!(s = PyUnicode_AsUTF8AndSize(text, &n)))
			return NULL;
		rc = frame_out(c, WS_OP_TEXT, s, (size_t)n);
	}
	else {
		if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
			return NULL;
		rc = frame_out(c, WS_OP_BINARY, view.buf, (size_t)view.len);
		PyBuffer_Release(&view);
	}
	if (rc < 0)
		return NULL;
	hconn_flush(c);
	if (c->closed || !call->conn) {
		PyErr_SetString(ClientDisconnected, "the client went away");
		return NULL;
	}
	if (hconn_pending(c) > HIGH_WATER) {
		/* the app waits until the client takes it below LOW_WATER (resume) */
		call->tx = PyObject_CallMethod(call->aio, "create_future", NULL);
		return Py_XNewRef(call->tx);
	}
	return asgi_ready(Py_None);
}

/* websocket.close: a close frame once accepted, a 403 before. */
static PyObject *do_close(WsCall *call, PyObject *msg)
{
	PyObject *code_o = PyDict_GetItemString(msg, "code"), *reason_o = PyDict_GetItemString(msg, "reason");
	long code = 1000;
	const char *reason = "";
	Py_ssize_t rlen = 0;

	if (code_o && code_o != Py_None) {
		code = PyLong_Check(code_o) ? PyLong_AsLong(code_o) : -1;
		if (code < 1000 || code > 4999 || code == 1005 || code == 1006 || code == 1015) {
			PyErr_Clear();
			PyErr_Format(PyExc_ValueError, "ASGI send(%.200R): websocket.close's code must be "
			             "an int a close frame may carry (1000-4999, not 1005/1006/1015)", msg);
			return NULL;
		}
	}
	if (reason_o && reason_o != Py_None) {
		if (!PyUnicode_Check(reason_o) || !(reason = PyUnicode_AsUTF8AndSize(reason_o, &rlen)) ||
		    rlen > 123) {
			if (!PyErr_Occurred())
				PyErr_Format(PyExc_ValueError, "ASGI send(%.200R): websocket.close's reason "
				             "must be a str of at most 123 UTF-8 bytes", msg);
			return NULL;
		}
	}
	if (call->state == ST_WAIT) {
		finish(call, 1006, "", 0);
		http_answer(call->conn, 403, "Forbidden");
	}
	else if (call->state == ST_OPEN) {
		finish(call, (int)code, reason, (size_t)rlen);
		if (close_out(call, (int)code, reason, (size_t)rlen) < 0)
			return NULL;
	}
	else if (call->state == ST_DENY) {
		PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R): websocket.close during the "
		             "denial response", msg);
		return NULL;
	}
	return asgi_ready(Py_None);                /* closed already: nothing more to say */
}

/* websocket.http.response.start / body: the denial response. */
static PyObject *do_deny(WsCall *call, PyObject *msg, int body)
{
	HttpConn *c = call->conn;

	if (!body) {
		PyObject *status = PyDict_GetItemString(msg, "status"), *prefix;
		PyObject *headers = PyDict_GetItemString(msg, "headers");
		long long length;
		int flags, code;

		if (call->state != ST_WAIT) {
			PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R): websocket.http.response.start "
			             "after the WebSocket was accepted or answered", msg);
			return NULL;
		}
		if (!status) {
			PyErr_Format(PyExc_ValueError, "ASGI send(%.200R): without a status", msg);
			return NULL;
		}
		if (head_from_asgi(status, headers ? headers : Py_None, &prefix, &length, &flags,
		                   &code) < 0)
			return NULL;
		call->f = (struct h1_frame){.http11 = 1, .keep = 0, .length = length, .code = code,
		                            .prefix = prefix, .app_date = !!(flags & HEAD_APP_DATE),
		                            .app_server = !!(flags & HEAD_APP_SERVER),
		                            .bodiless = code == 204 || code == 304 || code < 200};
		call->state = ST_DENY;
		return asgi_ready(Py_None);
	}
	{
		PyObject *data = PyDict_GetItemString(msg, "body"), *more_o = PyDict_GetItemString(msg, "more_body");
		Py_buffer view = {0};
		int more = more_o ? PyObject_IsTrue(more_o) : 0;

		if (call->state != ST_DENY) {
			PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R): websocket.http.response.body "
			             "without websocket.http.response.start", msg);
			return NULL;
		}
		if (more < 0 || (data && PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0))
			return NULL;
		if (!call->head_sent) {
			if (h1_head(c, &call->f, more ? -1 : (long long)view.len) < 0)
				goto fail;
			call->head_sent = 1;
		}
		if (view.len && h1_send_body(c, &call->f, view.buf, (size_t)view.len, 0, 0) < 0)
			goto fail;
		PyBuffer_Release(&view);
		if (!more) {
			if (h1_end_body(c, &call->f) < 0)
				return NULL;
			srv_count(c->srv, call->f.code);
			finish(call, 1006, "", 0);
			hconn_close_soft(c);
		}
		hconn_flush(c);
		return asgi_ready(Py_None);
fail:
		PyBuffer_Release(&view);
		return NULL;
	}
}

static PyObject *ws_send(WsCall *call, PyObject *msg)
{
	PyObject *type, *r;
	HttpConn *c;

	if (!PyDict_Check(msg)) {
		PyErr_Format(PyExc_TypeError, "ASGI send() takes a message dict, not %.100s",
		             Py_TYPE(msg)->tp_name);
		return NULL;
	}
	type = PyDict_GetItemString(msg, "type");
	if (!type || !PyUnicode_Check(type)) {
		PyErr_Format(PyExc_ValueError, "ASGI send(%.200R): a message needs a 'type' str", msg);
		return NULL;
	}
	if (owner_thread(call, "send()") < 0)
		return NULL;
	if (call->tx) {
		PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R) while another send() of the same "
		             "WebSocket waits", msg);
		return NULL;
	}
	c = (HttpConn *)Py_XNewRef(call->conn);
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
		r = do_deny(call, msg, 0);
	else if (PyUnicode_CompareWithASCIIString(type, "websocket.http.response.body") == 0)
		r = do_deny(call, msg, 1);
	else {
		PyErr_Format(PyExc_ValueError, "ASGI send(%.200R): not a message of a websocket scope "
		             "(websocket.accept, websocket.send, websocket.close, "
		             "websocket.http.response.start/body)", msg);
		r = NULL;
	}
	Py_DECREF(c);
	return r;
}

/* ---- the app's end ------------------------------------------------------------------------------ */

/* The app returned (or raised: logged): what it left unsaid is said. A
 * WebSocket still open is closed, 1000 (1011 if the app raised); one
 * never answered gets a 403 (500 if the app raised); a denial response
 * cut short ends the connection. */
static PyObject *ws_done(WsCall *call, PyObject *exc)
{
	HttpConn *c = (HttpConn *)Py_XNewRef(call->conn);

	call->ended = 1;
	if (exc != Py_None) {
		if (!PyExceptionInstance_Check(exc)) {
			Py_XDECREF(c);
			PyErr_SetString(PyExc_TypeError, "done(): an exception or None");
			return NULL;
		}
		PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), Py_NewRef(exc),
		              PyException_GetTraceback(exc));
		report_exc(call->srv, call->scope, "app");
	}
	if (c && !c->closed) {
		if (call->state == ST_WAIT) {
			finish(call, 1006, "", 0);
			if (exc != Py_None)
				http_answer(c, 500, "Internal Server Error");
			else
				http_answer(c, 403, "Forbidden");
		}
		else if (call->state == ST_OPEN) {
			finish(call, exc != Py_None ? 1011 : 1000, "", 0);
			if (close_out(call, exc != Py_None ? 1011 : 1000, "", 0) < 0)
				report_exc(call->srv, call->scope, "closing the WebSocket");
		}
		else if (call->state == ST_DENY) {
			finish(call, 1006, "", 0);
			if (call->head_sent)
				hconn_close_now(c);            /* mid-body: the client sees a cut */
			else
				http_answer(c, 500, "Internal Server Error");
		}
	}
	Py_XDECREF(c);
	Py_RETURN_NONE;
}

static PyMethodDef done_def = {"ws_done", (PyCFunction)ws_done, METH_O,
                               "done(exc or None): the end of an ASGI WebSocket's app"};

/* ---- the type ----------------------------------------------------------------------------------- */

static int Ws_traverse(WsCall *call, visitproc visit, void *arg)
{
	Py_VISIT(call->scope);
	Py_VISIT(call->aio);
	Py_VISIT(call->rx);
	Py_VISIT(call->tx);
	Py_VISIT(call->queue);
	return 0;
}

static int Ws_clear(WsCall *call)
{
	Py_CLEAR(call->scope);
	Py_CLEAR(call->aio);
	Py_CLEAR(call->rx);
	Py_CLEAR(call->tx);
	Py_CLEAR(call->queue);
	return 0;
}

static void unlink_call(WsCall *call)
{
	if (call->prev)
		call->prev->next = call->next;
	else if (all_calls == call)
		all_calls = call->next;
	if (call->next)
		call->next->prev = call->prev;
	call->prev = call->next = NULL;
	if (call->open_counted) {
		call->open_counted = 0;
		ws_open--;
	}
}

static void Ws_dealloc(WsCall *call)
{
	PyObject_GC_UnTrack(call);
	unlink_call(call);
	Ws_clear(call);
	ws_free(&call->wp);
	Py_CLEAR(call->conn);
	Py_CLEAR(call->f.prefix);
	Py_CLEAR(call->srv);
	PyObject_GC_Del(call);
}

static PyMethodDef Ws_methods[] = {
	{"receive", (PyCFunction)ws_receive, METH_NOARGS,
	 "receive() -> awaitable of the next message (websocket.connect, websocket.receive, "
	 "websocket.disconnect)."},
	{"send", (PyCFunction)ws_send, METH_O, "send(message) -> awaitable."},
	{NULL},
};

PyTypeObject WsCallType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "sockherd.worker._http.WsCall",
	.tp_doc = "One ASGI WebSocket's receive and send (asgi_ws.c).",
	.tp_basicsize = sizeof(WsCall),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
	.tp_dealloc = (destructor)Ws_dealloc,
	.tp_traverse = (traverseproc)Ws_traverse,
	.tp_clear = (inquiry)Ws_clear,
	.tp_methods = Ws_methods,
};

/* ---- the codec's entries: an upgrade served, the connection's side ----------------------------- */

/* Whether this request asks for a WebSocket (RFC 6455 4.2.1: GET,
 * Upgrade: websocket, Connection: upgrade): other upgrades stay HTTP. */
static int wants_websocket(const struct hp_parser *hp)
{
	return hp->ll.method == HTTP_GET && hp->ll.http_minor == 1 &&
	       has_token(hp, "upgrade", "websocket") && has_token(hp, "connection", "upgrade");
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
		const char *s = hp->head + f->value, *end = s + f->value_len;

		if (f->name_len != 22 || strncasecmp(hp->head + f->name, "sec-websocket-protocol", 22))
			continue;
		while (s < end) {
			const char *comma = memchr(s, ',', (size_t)(end - s)), *e = comma ? comma : end;

			while (s < e && (*s == ' ' || *s == '\t'))
				s++;
			while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
				e--;
			if (e > s) {
				v = PyUnicode_DecodeLatin1(s, e - s, NULL);
				if (!v || PyList_Append(subs, v) < 0) {
					Py_XDECREF(v);
					goto out;
				}
				Py_DECREF(v);
			}
			s = comma ? comma + 1 : end;
		}
	}
	if (PyDict_SetItemString(scope, "subprotocols", subs) < 0 ||
	    PyDict_SetItemString(scope, "type", V_WEBSOCKET) < 0 ||
	    PyDict_SetItemString(scope, "scheme", V_WS) < 0)
		goto out;
	if (PyDict_DelItemString(scope, "method") < 0)
		PyErr_Clear();
	v = Py_BuildValue("{s{}}", "websocket.http.response");
	if (!v || PyDict_SetItemString(scope, "extensions", v) < 0) {
		Py_XDECREF(v);
		goto out;
	}
	Py_DECREF(v);
	rc = 0;
out:
	Py_DECREF(subs);
	return rc;
}

/* struct h1_app's serve for an ASGI Server: an upgrade to WebSocket is
 * this file's (checked, then its app started as a task, as asgi_serve
 * does for http), any other request asgi_app.c's. */
int asgi_ws_serve(HttpConn *c, PyObject *scope, int whole)
{
	Server *s = c->srv;
	const struct hp_parser *hp = &c->parser->hp;
	const char *key, *ver;
	size_t klen = 0, vlen = 0;
	WsCall *call;
	PyObject *receive = NULL, *send = NULL, *done = NULL, *coro = NULL, *task = NULL;
	PyObject *args[5];
	int rc = -1;

	if (!wants_websocket(hp))
		return asgi_serve(c, scope, whole);
	key = field(hp, "sec-websocket-key", &klen);
	ver = field(hp, "sec-websocket-version", &vlen);
	if (!key || !key_ok(key, klen)) {
		hconn_refuse(c, 400, key ? "Sec-WebSocket-Key is not the base64 of 16 bytes"
		                         : "a WebSocket handshake without Sec-WebSocket-Key");
		return RESPOND_CLOSE;
	}
	if (!ver) {
		hconn_refuse(c, 400, "a WebSocket handshake without Sec-WebSocket-Version");
		return RESPOND_CLOSE;
	}
	if (vlen != 2 || memcmp(ver, "13", 2)) {
		http_answer(c, 426, "Upgrade Required\r\nSec-WebSocket-Version: 13");
		return RESPOND_CLOSE;
	}
	if (make_scope(scope, hp) < 0)
		return -1;
	call = PyObject_GC_New(WsCall, &WsCallType);
	if (!call)
		return -1;
	memset((char *)call + sizeof(PyObject), 0, sizeof(WsCall) - sizeof(PyObject));
	call->srv = (Server *)Py_NewRef(s);
	call->conn = (HttpConn *)Py_NewRef(c);
	call->scope = Py_NewRef(scope);
	call->aio = Py_XNewRef(s->thr[c->pos].aio);
	call->queue = PyList_New(0);
	memcpy(call->key, key, 24);
	ws_init(&call->wp, max_size);
	call->next = all_calls;
	if (all_calls)
		all_calls->prev = call;
	all_calls = call;
	PyObject_GC_Track(call);
	if (!call->aio || !call->queue) {
		if (!PyErr_Occurred())
			PyErr_SetString(PyExc_RuntimeError, "ASGI: the loop thread has no asyncio loop");
		Py_DECREF(call);
		return -1;
	}
	/* the connection holds the call from now: a close drops it */
	c->call = Py_NewRef((PyObject *)call);
	receive = PyObject_GetAttrString((PyObject *)call, "receive");
	send = PyObject_GetAttrString((PyObject *)call, "send");
	done = PyCFunction_New(&done_def, (PyObject *)call);
	if (receive && send && done) {
		args[0] = s->app;
		args[1] = scope;
		args[2] = receive;
		args[3] = send;
		args[4] = done;
		coro = PyObject_Vectorcall(s->slow, args, 5, NULL);
		task = coro ? PyObject_CallMethod(call->aio, "create_task", "O", coro) : NULL;
		rc = task ? RESPOND_PARKED : -1;
	}
	if (rc < 0) {
		if (coro)
			Py_XDECREF(PyObject_CallMethod(coro, "close", NULL));
		if (c->call == (PyObject *)call) {
			c->call = NULL;
			Py_DECREF(call);
		}
	}
	Py_XDECREF(receive);
	Py_XDECREF(send);
	Py_XDECREF(done);
	Py_XDECREF(coro);
	Py_XDECREF(task);
	Py_DECREF(call);
	return rc;
}

/* struct h1_app's input: frames for a WebSocket's receive, else http's */
int asgi_ws_input(HttpConn *c)
{
	WsCall *call = (WsCall *)c->call;

	if (!call || !Py_IS_TYPE(c->call, &WsCallType))
		return asgi_input(c);
	if (call->state == ST_OPEN)
		return pump(call);
	if (c->peer_eof && !call->finished)
		finish(call, 1006, "", 0);             /* gone before the app's answer */
	return 0;
}

/* struct h1_app's resume: the output drained, a waiting send goes on */
int asgi_ws_resume(HttpConn *c)
{
	WsCall *call = (WsCall *)c->call;

	if (!call || !Py_IS_TYPE(c->call, &WsCallType))
		return asgi_resume(c);
	if (call->tx && hconn_pending(c) < LOW_WATER)
		asgi_resolve(&call->tx, Py_None, NULL);
	return RESPOND_PARKED;
}

/* struct conn_ops's unread: a WebSocket that sent its close frame first
 * awaits the client's (close_out says why); else the codec's answer. */
int asgi_ws_unread(HttpConn *c)
{
	WsCall *call = (WsCall *)c->call;

	if (call && Py_IS_TYPE(c->call, &WsCallType) && call->state != ST_WAIT &&
	    call->close_sent && !call->close_rcvd)
		return 1;
	return h1_unread(c);
}

/* struct conn_ops's drop: the connection closed under the call */
void asgi_ws_drop(HttpConn *c, PyObject *obj)
{
	WsCall *call = (WsCall *)obj;
	PyObject *exc;

	if (!Py_IS_TYPE(obj, &WsCallType)) {
		asgi_drop(c, obj);
		return;
	}
	finish(call, 1006, "", 0);                 /* unless a close was exchanged */
	deliver(call);
	if (call->tx) {
		exc = PyObject_CallFunction(ClientDisconnected, "s", "the client went away");
		if (exc) {
			asgi_resolve(&call->tx, NULL, exc);
			Py_DECREF(exc);
		}
		else
			PyErr_WriteUnraisable(obj);
	}
	unlink_call(call);
	Py_CLEAR(call->conn);
	Py_DECREF(obj);                            /* the connection's reference */
}

/* ---- the module's functions -------------------------------------------------------------------- */

static PyObject *py_ws_open(PyObject *mod, PyObject *noarg)
{
	(void)mod;
	(void)noarg;
	return PyLong_FromLong(ws_open);
}

/* Every WebSocket of the calling loop thread of server ends with close
 * 1001 (going away): the drain's deadline (worker/loop.py going_away). */
static PyObject *py_ws_going_away(PyObject *mod, PyObject *server)
{
	Server *s = (Server *)server;
	int pos, n = 0;

	(void)mod;
	if (!PyObject_TypeCheck(server, &ServerType)) {
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
		HttpConn *c = call->conn;

		next = call->next;
		if (!c || c->srv != s || c->pos != pos || c->closed || call->finished)
			continue;
		Py_INCREF(call);
		if (call->state == ST_OPEN) {
			finish(call, 1001, "", 0);
			if (close_out(call, 1001, "going away", 10) < 0)
				PyErr_WriteUnraisable((PyObject *)call);
			n++;
		}
		else {
			finish(call, 1006, "", 0);
			http_answer(c, 503, "Service Unavailable");
		}
		next = call->next;                     /* (unlinked if its close was at once) */
		Py_DECREF(call);
	}
	return PyLong_FromLong(n);
}

static PyObject *py_ws_settings(PyObject *mod, PyObject *args)
{
	unsigned long long size;

	(void)mod;
	if (!PyArg_ParseTuple(args, "K:ws_settings", &size))
		return NULL;
	max_size = size;
	Py_RETURN_NONE;
}

PyMethodDef asgi_ws_module_methods[] = {
	{"ws_open", py_ws_open, METH_NOARGS, "ws_open() -> the WebSockets open in this process"},
	{"ws_going_away", py_ws_going_away, METH_O,
	 "ws_going_away(server): close 1001 to each WebSocket of the calling loop thread; how many"},
	{"ws_settings", py_ws_settings, METH_VARARGS,
	 "ws_settings(max_size): a message's bound (close 1009 past it; 0 none)"},
	{NULL},
};

int asgi_ws_make_keys(void)
{
	struct { PyObject **at; const char *s; } keys[] = {
		{&K_TYPE, "type"}, {&K_TEXT, "text"}, {&K_BYTES, "bytes"}, {&K_CODE, "code"},
		{&K_REASON, "reason"}, {&V_CONNECT, "websocket.connect"},
		{&V_RECEIVE, "websocket.receive"}, {&V_DISCONNECT, "websocket.disconnect"},
		{&V_WEBSOCKET, "websocket"}, {&V_WS, "ws"},
	};

	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (!(*keys[i].at = PyUnicode_InternFromString(keys[i].s)))
			return -1;
	return 0;
}
