/* The ASGI adapter's websocket side (asgi_ws.c draws it): its call
 * object, shared by its three files:
 *
 *   asgi_ws_frames.c  the call's messages (the queue for receive()), its
 *                     frames out, the client's frames parsed (pump)
 *   asgi_ws_ping.c    the keep-alive ping: its timer's two kinds (issue 35, point 27)
 *   asgi_ws_send.c    send(): accept, send, close
 *   asgi_ws_deny.c    send()'s denial response (websocket.http.response)
 *   asgi_ws_call.c    the call: receive(), the app's end, its type, the
 *                     connection's side (input, drained output, close)
 *   asgi_ws.c         the upgrade checked and served, the drain's going
 *                     away, the module's functions
 */
#ifndef SOCKHERD_ASGI_WS_H
#define SOCKHERD_ASGI_WS_H

#include "asgi.h"
#include "ws.h"

/* what messages parsed and not received yet may hold (ws_cost: their
 * dicts and objects, not only their payload), a WebSocket's and all of a
 * worker's together (asgi_ws_frames.c ws_room) */
#define WS_QUEUE_MAX (256u << 10)
#define WS_WORKER_QUEUE_MAX (64u << 20)
#define WS_GUID "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

/* WAIT: before the app's answer; OPEN: accepted; DENY: the denial
 * response started; DONE: closed (or refused) */
enum { ST_WAIT = 0, ST_OPEN, ST_DENY, ST_DONE };

typedef struct WsCall {
	PyObject_HEAD
	Server *srv;
	struct conn *conn;                    /* NULL once the connection closed */
	PyObject *scope, *aio, *rx, *tx;
	PyObject *queue;                   /* messages for receive(), in order; NULL: none
	                                    * (an idle WebSocket holds no list: issue 23) */
	size_t queued;                     /* what they hold (ws_cost), in ws_held too */
	char key[24];                      /* Sec-WebSocket-Key, checked */
	struct ws_parser wp;               /* with permessage-deflate's state (wp.pmd) */
	/* the denial response's framing: allocated at its start (most
	 * WebSockets are accepted: an idle one holds none, issue 23) */
	struct h1_frame *f;
	int state;
	/* connect_taken: websocket.connect was received; close_sent: our close
	 * frame is out (nothing but it after); finished: the disconnect is
	 * queued (the last message); ended: the app returned; open_counted:
	 * counted in ws_open; head_sent: the denial's head is out; close_rcvd:
 * the client's close frame came; sending: a send() runs (the app's code
 * it calls may call another: refused, asgi_ws_send.c); receiving: a
 * receive() pumps, its message the app's (ws_room) */
	unsigned connect_taken : 1, close_sent : 1, finished : 1, ended : 1, open_counted : 1,
	         head_sent : 1, close_rcvd : 1, sending : 1, receiving : 1;
	struct WsCall *prev, *next;        /* every live call (ws_going_away) */
} WsCall;


extern WsCall *all_calls;                  /* GIL-protected, as every call */
extern long ws_open;                       /* accepted and not closed */
extern size_t ws_held;                     /* what every call's queue holds (GIL-protected) */
extern PyObject *K_TYPE, *K_TEXT, *K_BYTES, *K_CODE, *K_REASON, *V_CONNECT, *V_RECEIVE,
                *V_DISCONNECT, *V_WEBSOCKET, *V_WS, *K_WS_DENIAL;

/* RuntimeError unless the calling thread is the WebSocket's loop thread
 * (its fd and output are that thread's alone). */
static inline int ws_owner_thread(WsCall *call, const char *what)
{
	struct conn *c = call->conn;

	if (c && srv_current(c->srv) != c->pos) {
		PyErr_Format(PyExc_RuntimeError, "ASGI %s from a thread that is not the WebSocket's "
		             "loop thread (use loop.call_soon_threadsafe)", what);
		return -1;
	}
	return 0;
}

/* The messages queued for receive(). */
static inline Py_ssize_t ws_nqueued(const WsCall *call)
{
	return call->queue ? PyList_GET_SIZE(call->queue) : 0;
}

/* ---- asgi_ws_frames.c ---- */
/* msg, whose value (text or bytes) is v (NULL: none, not counted), queued
 * for receive() (the list made for the first), its cost counted. 0 or -1. */
int ws_enqueue(WsCall *call, PyObject *msg, PyObject *v);
/* Every queued message dropped (the call's end), off the worker's count. */
void ws_unqueue_all(WsCall *call);
/* A message dict's size measured (module init, after the keys). 0 or -1. */
int ws_cost_init(void);
/* A message dict {type, k1: v1, k2: v2} (k NULL: none). */
PyObject *ws_message(PyObject *type, PyObject *k1, PyObject *v1, PyObject *k2, PyObject *v2);
/* The first queued message, taken off (a new reference), NULL if none. */
PyObject *ws_take(WsCall *call);
/* The first queued message to a waiting receive(). */
void ws_deliver(WsCall *call);
/* websocket.disconnect with code queued, once: the WebSocket is closed. */
void ws_finish(WsCall *call, int code, const char *reason, size_t rlen);
/* One server frame into c's output (not flushed); op may carry RSV1 (0x40). */
int ws_frame_out(struct conn *c, int op, const char *data, size_t n);
/* Our close frame (code 0: none), the connection closed once it is out. */
int ws_close_out(WsCall *call, int code, const char *reason, size_t rlen);
/* An HTTP answer of ours (status, reason and extra lines in head) and the close. */
void ws_http_answer(struct conn *c, int status, const char *head);
/* The buffered input parsed into messages while there is room. 0 or -1. */
int ws_pump(WsCall *call);

/* ---- asgi_ws_ping.c (issue 35, point 27) ---- */
/* The WebSocket was accepted: its ping timer, if the server pings. */
void ws_ping_start(WsCall *call);
/* Input came (c->last_active, the event's clock): the ping's interval
 * from then, if the ping timer runs (not while output waits: the send
 * timer's). Inline: it runs per read. */
static inline void ws_ping_input(struct conn *c)
{
	if (c->tkind == TIMER_PING || c->tkind == TIMER_PONG)
		timer_arm_at(c, TIMER_PING, c->last_active + c->srv->ws_ping_interval);
}

/* ---- asgi_ws_send.c ---- */
PyObject *ws_send(WsCall *call, PyObject *msg);
int ws_send_make_keys(void);                    /* its message keys (module init) */
/* the keys of send()'s messages (ws_send_make_keys) */
extern PyObject *K_SUBPROTOCOL, *K_HEADERS, *K_BODY, *K_MORE_BODY, *K_STATUS;

/* msg[key], a new reference: NULL if absent or None, NULL with the
 * app's error if the lookup raised (a key's __eq__). Held, not borrowed:
 * the app's message may run its code while we use what we took out of it
 * (a key's __eq__ in the next lookup, more_body's __bool__, an iterable's
 * __iter__), and that code may empty it; a borrowed value was then read
 * after its free, other objects' bytes on the wire (issue 35, point 2). */
static inline PyObject *ws_field(PyObject *msg, PyObject *key)
{
	PyObject *v = PyDict_GetItemWithError(msg, key);

	return v == Py_None ? NULL : Py_XNewRef(v);
}

/* ---- asgi_ws_deny.c: websocket.http.response.start / body ---- */
PyObject *ws_deny_start(WsCall *call, PyObject *msg);
PyObject *ws_deny_body(WsCall *call, PyObject *msg);

/* ---- the Python side ---- */
extern PyTypeObject WsCallType;
/* the module's functions: the open WebSockets' count and their going
 * away (asgi_ws.c) */
extern PyMethodDef asgi_ws_module_methods[];
/* module init: the adapter's interned keys */
int asgi_ws_make_keys(void);

/* ---- asgi_ws.c (serve), asgi_ws_call.c (the rest): the ASGI Server's
 * table (server.c) takes these in place of asgi_app.c's: each hands what
 * is not a WebSocket's to it ---- */
int asgi_ws_serve(struct conn *c, PyObject *scope, int whole);
int asgi_ws_input(struct conn *c);
int asgi_ws_resume(struct conn *c);
/* struct app_ops's drop: the connection closed under the call */
void asgi_ws_drop(struct conn *c, PyObject *call);
/* struct app_ops's lingers: a WebSocket that sent its close frame first
 * awaits the client's */
int asgi_ws_lingers(struct conn *c);
/* struct app_ops's timer: a WebSocket's ping due, or its answer late (asgi_ws_ping.c) */
int asgi_ws_timer(struct conn *c, int kind);

#endif /* SOCKHERD_ASGI_WS_H */
