/* An open WebSocket's keep-alive ping (issue 35, point 27): a peer that
 * vanished without a FIN (its host off, a NAT entry dropped) would hold
 * its connection, its call and its app's task forever, since an open
 * WebSocket has no other timer while it owes nothing. uvicorn's rule
 * (websockets' keepalive), ws_ping_interval and ws_ping_timeout:
 *
 *   - a WebSocket that heard nothing from its client for ws_ping_interval
 *     is sent a ping (a 4-byte counter as its payload);
 *   - if nothing at all comes in the ws_ping_timeout after that ping, it
 *     is closed: our close frame 1011 "keepalive ping timeout", the app
 *     told websocket.disconnect 1011 (the code we closed with, as for the
 *     drain's 1001 and a protocol error's code), and the connection
 *     closed at once, without waiting for the client's close (it is
 *     presumed gone: no lingering);
 *   - any input (a pong, a message, a ping, a fragment) is life: it
 *     re-arms the interval. With ws_ping_timeout 0, pings are sent
 *     (to keep proxies' and NATs' idle timers from cutting the
 *     connection) and nothing is timed out;
 *   - while the server itself does not read (in_full: the app behind,
 *     its queue and the input buffer full), no ping is sent or timed
 *     out: the client's answer would wait unread (issue 35, review 2).
 *
 * Where the clock lives: the connection's one timer (conn_timers.c), two
 * kinds, TIMER_PING (the interval) and TIMER_PONG (the timeout), each of
 * one fixed duration so that each per-thread list stays sorted by
 * construction. No state on the call: the armed kind is the state (PONG
 * armed <=> a ping is unanswered). The ping timer is the one a call's
 * connection runs when it owes nothing (h1_rearm, c->call_ping); output
 * waiting has the send timer instead (body_timeout: a client that takes
 * nothing is cut by that), and the ping timer comes back once it drained.
 *
 * Its cost per message: the input's re-arm (asgi_ws_input, ws_ping_input:
 * an unlink and an append at the tail, due = the event's own clock read
 * + interval, so no clock read and no walk); the output's h1_rearm keeps
 * an armed ping timer (a compare). Measured with bench/ws_callgrind.py
 * (bench/RESULTS.md).
 *
 * May call: asgi_ws_frames.c (frames out, the disconnect), the connection
 * layer (conn.h).
 */
#include "asgi_ws.h"

static uint32_t pings;                          /* the payloads' counter (GIL-protected) */

/* The WebSocket was accepted (its 101 out): its ping timer from now on,
 * if the server pings. */
void ws_ping_start(WsCall *call)
{
	struct conn *c = call->conn;

	if (!c || c->closed || c->srv->ws_ping_interval <= 0)
		return;
	c->call_ping = 1;
	if (!conn_owed(c) && c->tkind < 0)
		timer_arm(c, TIMER_PING);
}

/* struct app_ops's timer for an ASGI Server: a WebSocket's ping is due
 * (PING), or the one sent is unanswered (PONG). */
int asgi_ws_timer(struct conn *c, int kind)
{
	WsCall *call = (WsCall *)c->call;
	Server *s = c->srv;
	uint8_t payload[4];
	uint32_t n;

	if (!call || !Py_IS_TYPE(c->call, &WsCallType) || call->state != ST_OPEN ||
	    call->close_sent || c->closing)
		return 0;
	if (c->in_full) {
		/* we stopped reading (the app is behind: its queue and the
		 * input buffer full): the client's answer would wait unread
		 * in the kernel, so nothing it does can count as life; a live
		 * client was closed 1011 and its messages lost (issue 35,
		 * review 2). The interval again: reading resumes once the
		 * app receives, and what waited is life then. */
		timer_arm(c, TIMER_PING);
		return 0;
	}
	if (kind == TIMER_PING) {
		n = ++pings;
		payload[0] = (uint8_t)(n >> 24);
		payload[1] = (uint8_t)(n >> 16);
		payload[2] = (uint8_t)(n >> 8);
		payload[3] = (uint8_t)n;
		if (ws_frame_out(c, WS_OP_PING, (const char *)payload, 4) < 0)
			return -1;
		/* armed before the flush: the flush's h1_rearm keeps it (or the
		 * send timer replaces it while the ping cannot go out) */
		timer_arm(c, s->ws_ping_timeout > 0 ? TIMER_PONG : TIMER_PING);
		conn_flush(c);
		return 0;
	}
	/* nothing came since our ping: the peer is presumed gone */
	Py_INCREF(c);
	Py_INCREF(call);
	ws_finish(call, 1011, "keepalive ping timeout", 22);
	call->close_sent = 1;
	{
		static const char close[] = "\x03\xf3keepalive ping timeout";   /* 1011 */

		if (ws_frame_out(c, WS_OP_CLOSE, close, sizeof(close) - 1) < 0)
			PyErr_Clear();                     /* no memory: the close says enough */
	}
	conn_flush(c);
	if (conn_close_now(c) < 0)
		PyErr_WriteUnraisable((PyObject *)c);
	Py_DECREF(call);
	Py_DECREF(c);
	return 0;
}
