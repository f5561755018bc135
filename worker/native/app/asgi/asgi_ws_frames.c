/* The ASGI websocket call's messages and frames (asgi_ws.h): the queue
 * receive() takes from, websocket.disconnect as its last message, the
 * server's frames out (a close, and the connection's end after it), and
 * the client's frames parsed from the connection's input (pump), pings
 * and the client's close answered there, protocol errors closed with
 * their code.
 *
 * May call: the frame codec (ws_frame.c), asgi_end.c (a future
 * resolved), the HTTP/1 codec (h1.h), the connection layer (conn.h).
 */
#include <stddef.h>
#include <string.h>

#include "asgi_ws.h"

WsCall *all_calls;
long ws_open;
PyObject *K_TYPE, *K_TEXT, *K_BYTES, *K_CODE, *K_REASON, *V_CONNECT, *V_RECEIVE, *V_DISCONNECT,
         *V_WEBSOCKET, *V_WS, *K_WS_DENIAL;

/* ---- messages ---------------------------------------------------------------------------------- */

PyObject *ws_message(PyObject *type, PyObject *k1, PyObject *v1, PyObject *k2, PyObject *v2)
{
	PyObject *d = PyDict_New();

	if (d && (PyDict_SetItem(d, K_TYPE, type) < 0 || (k1 && PyDict_SetItem(d, k1, v1) < 0) ||
	          (k2 && PyDict_SetItem(d, k2, v2) < 0)))
		Py_CLEAR(d);
	return d;
}

/* ---- the queue and its account ------------------------------------------------------------------ */

size_t ws_held;
static size_t dict_cost;                   /* a message dict's own bytes (ws_cost_init) */

/* What a queued websocket.receive message holds, from its value v alone
 * (text or bytes, ours, immutable; NULL for a message without one, the
 * disconnect, which is not counted): the dict, the value's object, the
 * queue's slot, each rounded as the allocator rounds it. The same v gives
 * the same number when the message is queued and when it is taken, so the
 * count is an account, exact: before, payload bytes counted nothing for
 * an empty message's ~280 bytes (issue 35, point 4) and UTF-8 bytes in,
 * a str's width out, let ~4 messages in for each taken (point 17). */
static size_t ws_cost(PyObject *v)
{
	size_t n;

	if (!v)
		return 0;
	if (PyUnicode_Check(v))
		n = PyUnicode_IS_COMPACT_ASCII(v)
		    ? sizeof(PyASCIIObject) + (size_t)PyUnicode_GET_LENGTH(v) + 1
		    : sizeof(PyCompactUnicodeObject) +
		      ((size_t)PyUnicode_GET_LENGTH(v) + 1) * PyUnicode_KIND(v);
	else
		n = offsetof(PyBytesObject, ob_sval) + 1 + (size_t)PyBytes_GET_SIZE(v);
	/* pymalloc's 16-byte classes up to 512 bytes, malloc's header past */
	n = (n + 15) & ~(size_t)15;
	if (n > 512)
		n += 16;
	return dict_cost + n + sizeof(PyObject *);
}

int ws_cost_init(void)
{
	/* a message's dict as ws_message makes it, measured once: its size
	 * differs between Python versions, and sys.getsizeof adds the GC
	 * header __sizeof__ leaves out */
	PyObject *v = PyBytes_FromStringAndSize("", 0);
	PyObject *d = v ? ws_message(V_RECEIVE, K_BYTES, v, NULL, NULL) : NULL;
	PyObject *sys = d ? PyImport_ImportModule("sys") : NULL;
	PyObject *n = sys ? PyObject_CallMethod(sys, "getsizeof", "O", d) : NULL;
	Py_ssize_t size = n ? PyLong_AsSsize_t(n) : -1;

	Py_XDECREF(v);
	Py_XDECREF(d);
	Py_XDECREF(sys);
	Py_XDECREF(n);
	if (size < 0)
		return -1;
	dict_cost = ((size_t)size + 15) & ~(size_t)15;
	return 0;
}

/* The message's value: text or bytes, NULL for one with neither. */
static PyObject *ws_value(PyObject *msg)
{
	PyObject *v = PyDict_GetItem(msg, K_TEXT);

	return v ? v : PyDict_GetItem(msg, K_BYTES);
}

int ws_enqueue(WsCall *call, PyObject *msg, PyObject *v)
{
	size_t n;

	if (!call->queue && !(call->queue = PyList_New(0)))
		return -1;
	if (PyList_Append(call->queue, msg) < 0)
		return -1;
	n = ws_cost(v);
	call->queued += n;
	ws_held += n;
	return 0;
}

/* The first queued message, taken off the queue (a new reference), its
 * cost off both counts. The disconnect stays: it is said again to a
 * receive after it. */
PyObject *ws_take(WsCall *call)
{
	PyObject *msg;
	size_t n;

	if (!ws_nqueued(call))
		return NULL;
	msg = Py_NewRef(PyList_GET_ITEM(call->queue, 0));
	if (call->finished && PyList_GET_SIZE(call->queue) == 1)
		return msg;
	if (PyList_SetSlice(call->queue, 0, 1, NULL) < 0) {
		Py_DECREF(msg);
		return NULL;
	}
	if (!PyList_GET_SIZE(call->queue))
		Py_CLEAR(call->queue);                 /* empty: none held while idle */
	n = ws_cost(ws_value(msg));
	n = n < call->queued ? n : call->queued;   /* an account: equal at most */
	call->queued -= n;
	ws_held -= n;
	return msg;
}

void ws_unqueue_all(WsCall *call)
{
	ws_held -= call->queued < ws_held ? call->queued : ws_held;
	call->queued = 0;
	Py_CLEAR(call->queue);
}

/* Whether the pump may parse another message for call: while its queue
 * holds less than WS_QUEUE_MAX and the worker's queues together less than
 * WS_WORKER_QUEUE_MAX; past the worker's bound only for an app waiting in
 * receive() with nothing queued (the message is then the app's, not the
 * queue's), so every app still gets its next message and a stalled one
 * leaves its client's bytes unread (issue 35, point 18: inflated
 * messages held by every stalled connection, unbounded together). */
static int ws_room(const WsCall *call)
{
	if (call->queued >= WS_QUEUE_MAX)
		return 0;
	return ws_held < WS_WORKER_QUEUE_MAX || (!ws_nqueued(call) && (call->rx || call->receiving));
}

/* The first queued message to a waiting receive(); none to a receive the
 * app stopped awaiting (wait_for's timeout: asgi_waiting drops it), so
 * the message stays queued for the next receive() (it was taken for the
 * cancelled future and lost: issue 35, point 6). */
void ws_deliver(WsCall *call)
{
	PyObject *msg, *t, *v, *tb;
	int waits;

	if (!ws_nqueued(call) || !call->rx)
		return;
	PyErr_Fetch(&t, &v, &tb);                  /* a drop's path too, as asgi_resolve's */
	waits = asgi_waiting(&call->rx);
	PyErr_Restore(t, v, tb);
	if (!waits)
		return;
	if (!(msg = ws_take(call)))
		PyErr_WriteUnraisable((PyObject *)call);
	else {
		asgi_resolve(&call->rx, msg, NULL);
		Py_DECREF(msg);
	}
}

/* The call's last message, websocket.disconnect with code: queued once;
 * the WebSocket no longer counts as open. */
void ws_finish(WsCall *call, int code, const char *reason, size_t rlen)
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
	msg = c && r ? ws_message(V_DISCONNECT, K_CODE, c, K_REASON, r) : NULL;
	if (!msg || ws_enqueue(call, msg, NULL) < 0)
		PyErr_WriteUnraisable((PyObject *)call);
	Py_XDECREF(c);
	Py_XDECREF(r);
	Py_XDECREF(msg);
	ws_deliver(call);
}

/* ---- output ------------------------------------------------------------------------------------ */

/* One server frame into the output (not flushed). */
int ws_frame_out(struct conn *c, int op, const char *data, size_t n)
{
	uint8_t head[10];
	size_t hn = ws_frame_head(head, op, n);

	if (conn_send(c, (const char *)head, hn, 0) < 0)
		return -1;
	return conn_send(c, data, n, 0);
}

/* Our close frame (code 0: none), then the connection closes once it is
 * out. If the close is ours (the client's did not come), the client
 * still owes its answer: the connection lingers (asgi_ws_lingers), our FIN
 * right behind the frame, its answer read and dropped until its FIN; a
 * close() at once would meet that answer with a reset, and a reset can
 * destroy our close frame before the client reads it (found by the
 * drain's test: clients cut with no close frame). */
int ws_close_out(WsCall *call, int code, const char *reason, size_t rlen)
{
	struct conn *c = call->conn;
	char payload[125];

	if (!c || call->close_sent)
		return 0;
	call->close_sent = 1;
	if (rlen > 123)
		rlen = 123;
	payload[0] = (char)(code >> 8);
	payload[1] = (char)code;
	memcpy(payload + 2, reason, rlen);
	if (ws_frame_out(c, WS_OP_CLOSE, payload, code ? rlen + 2 : 0) < 0)
		return -1;
	Py_INCREF(c);                              /* the close may drop the call's */
	conn_close_soft(c);
	conn_flush(c);
	Py_DECREF(c);
	return 0;
}

/* An HTTP answer of ours (a refusal before the app, its 403) and the close. */
void ws_http_answer(struct conn *c, int status, const char *head)
{
	const char *date;
	size_t dn;
	char buf[512];
	int n;

	http_date(&date, &dn);
	n = snprintf(buf, sizeof(buf), "HTTP/1.1 %d %s\r\n%.*sContent-Length: 0\r\n"
	             "Connection: close\r\n\r\n", status, head, (int)dn, date);
	srv_count(c->srv, status);
	if (conn_send(c, buf, (size_t)n, 0) < 0)
		PyErr_Clear();                         /* no memory: the close says enough */
	conn_close_soft(c);
	conn_flush(c);
}

/* ---- input: frames ------------------------------------------------------------------------------ */

/* Parses what the connection buffered into messages for receive(), while
 * there is room for them (ws_room); answers pings and the
 * client's close, and a protocol error with its code. 0 or -1 (memory). */
int ws_pump(WsCall *call)
{
	struct conn *c = call->conn;
	Parser *p;
	int rc = 0;

	if (!c || c->closed || call->state != ST_OPEN)
		return 0;
	p = c->parser;
	Py_INCREF(c);
	while (!call->finished && ws_room(call) && call->conn) {
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
			msg = v ? ws_message(V_RECEIVE, ev == WS_TEXT ? K_TEXT : K_BYTES, v, NULL, NULL) : NULL;
			if (!msg || ws_enqueue(call, msg, v) < 0) {
				Py_XDECREF(v);
				Py_XDECREF(msg);
				rc = -1;
				goto out;
			}
			Py_DECREF(v);
			Py_DECREF(msg);
			ws_let_go(wp);                     /* copied: a big buffer not held twice */
			break;
		case WS_PING:
			if (!call->close_sent && ws_frame_out(c, WS_OP_PONG, (const char *)ws_ctl(wp),
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
			const char *reason = wp->ctl_len > 2 ? (const char *)ws_ctl(wp) + 2 : "";
			size_t rl = wp->ctl_len > 2 ? wp->ctl_len - 2u : 0;

			call->close_rcvd = 1;
			ws_finish(call, code, reason, rl);
			if (ws_close_out(call, code == 1005 ? 0 : code, "", 0) < 0)
				rc = -1;
			goto out;
		}
		default:                               /* WS_FAIL: the client broke the protocol */
			ws_finish(call, wp->fail_code, "", 0);
			if (ws_close_out(call, wp->fail_code, wp->fail_reason, strlen(wp->fail_reason)) < 0)
				rc = -1;
			goto out;
		}
	}
	if (!call->finished && c->peer_eof && ws_room(call))
		ws_finish(call, 1006, "", 0);             /* its end without a close frame */
	if (!c->closed) {
		/* an idle WebSocket holds no input buffer, as an idle kept-alive
		 * connection (h1_parser.c parser_finish): the next read
		 * allocates again (memory per idle WebSocket) */
		if (p->start == p->len && p->pending) {
			PyMem_Free(p->pending);
			p->pending = NULL;
			p->start = p->len = p->cap = 0;
		}
		if (p->start == p->len)
			ws_trim(&call->wp);                /* the codec's buffers too */
		h1_input_room(c);                      /* taken: reading may go on */
		conn_flush(c);                        /* the pongs */
	}
out:
	Py_DECREF(c);
	ws_deliver(call);
	return rc;
}

