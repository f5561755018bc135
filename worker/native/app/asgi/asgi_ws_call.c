/* One ASGI WebSocket's call object (WsCall, asgi_ws.h), from the upgrade
 * (asgi_ws.c makes it) to its connection's close: the app's receive()
 * (websocket.connect first, then the client's messages and its end), the
 * app's end (what it left unsaid is said: a close, a 403, a cut), the
 * type's life (every live call linked for the drain's going away, and
 * counted in ws_open once accepted), and the connection's side as struct
 * app_ops and struct conn_ops see it: input, drained output, a lingering
 * close, the connection closed under the call.
 *
 * Apart from the upgrade (asgi_ws.c): the handshake is checked once, a
 * call lives as long as its WebSocket, and the type is what both share.
 *
 * May call: asgi_ws_frames.c, asgi_ws_send.c, asgi_app.c's http entries
 * (a connection without a WebSocket), the HTTP/1 codec (h1.h), the
 * connection layer (conn.h).
 */
#include "asgi_ws.h"

/* ---- receive ------------------------------------------------------------------------------------ */

/* The next message: websocket.connect first, then the client's messages
 * and its end (websocket.disconnect, again if asked again). */
static PyObject *ws_receive(WsCall *call, PyObject *noarg)
{
	PyObject *msg, *r;

	(void)noarg;
	if (ws_owner_thread(call, "receive()") < 0)
		return NULL;
	if (!call->connect_taken) {
		call->connect_taken = 1;
		msg = ws_message(V_CONNECT, NULL, NULL, NULL, NULL);
		r = msg ? asgi_ready(msg) : NULL;
		Py_XDECREF(msg);
		return r;
	}
	/* a receive the app stopped awaiting (wait_for's timeout, its task
	 * cancelled) is dropped, as the http scope's is (issue 35, point 6) */
	if (asgi_waiting(&call->rx)) {
		PyErr_SetString(PyExc_RuntimeError, "ASGI receive() called while another receive() of "
		                "the same WebSocket waits");
		return NULL;
	}
	if (!ws_nqueued(call)) {
		int rc;

		call->receiving = 1;                   /* past the worker's bound too (ws_room) */
		rc = ws_pump(call);
		call->receiving = 0;
		if (rc < 0)
			return NULL;
	}
	if (!ws_nqueued(call) && !call->finished && !call->conn)
		ws_finish(call, 1006, "", 0);
	if (ws_nqueued(call)) {
		if (!(msg = ws_take(call)))
			return NULL;
		/* room again: what waits is parsed (the pongs it owes said) */
		if (call->state == ST_OPEN && ws_pump(call) < 0) {
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

/* ---- the app's end ------------------------------------------------------------------------------ */

/* The app returned (or raised: logged): what it left unsaid is said. A
 * WebSocket still open is closed, 1000 (1011 if the app raised); one
 * never answered gets a 403 (500 if the app raised); a denial response
 * cut short ends the connection. */
static PyObject *ws_done(WsCall *call, PyObject *exc)
{
	struct conn *c = (struct conn *)Py_XNewRef(call->conn);

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
			ws_finish(call, 1006, "", 0);
			if (exc != Py_None)
				ws_http_answer(c, 500, "Internal Server Error");
			else
				ws_http_answer(c, 403, "Forbidden");
		}
		else if (call->state == ST_OPEN) {
			ws_finish(call, exc != Py_None ? 1011 : 1000, "", 0);
			if (ws_close_out(call, exc != Py_None ? 1011 : 1000, "", 0) < 0)
				report_exc(call->srv, call->scope, "closing the WebSocket");
		}
		else if (call->state == ST_DENY) {
			ws_finish(call, 1006, "", 0);
			if (call->head_sent)
				conn_close_now(c);            /* mid-body: the client sees a cut */
			else
				ws_http_answer(c, 500, "Internal Server Error");
		}
	}
	Py_XDECREF(c);
	Py_RETURN_NONE;
}

/* The call itself is the runner's done (asgi.py run_call): calling it
 * is ws_done. Not a function object of its own bound to the call: that
 * one would live as long as the WebSocket (~70 bytes each, issue 23). */
static PyObject *Ws_call(WsCall *call, PyObject *args, PyObject *kw)
{
	PyObject *exc;

	if (kw && PyDict_GET_SIZE(kw)) {
		PyErr_SetString(PyExc_TypeError, "done(exc or None): no keyword arguments");
		return NULL;
	}
	if (!PyArg_UnpackTuple(args, "done", 1, 1, &exc))
		return NULL;
	return ws_done(call, exc);
}

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
	ws_unqueue_all(call);
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
	if (call->f) {
		Py_CLEAR(call->f->prefix);
		PyMem_Free(call->f);
	}
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
	.tp_call = (ternaryfunc)Ws_call,
	.tp_traverse = (traverseproc)Ws_traverse,
	.tp_clear = (inquiry)Ws_clear,
	.tp_methods = Ws_methods,
};

/* ---- the connection's side ------------------------------------------------------------------- */

/* struct app_ops's input: frames for a WebSocket's receive, else http's */
int asgi_ws_input(struct conn *c)
{
	WsCall *call = (WsCall *)c->call;

	if (!call || !Py_IS_TYPE(c->call, &WsCallType))
		return asgi_input(c);
	if (call->state == ST_OPEN) {
		ws_ping_input(c);                       /* life: the ping's interval again */
		return ws_pump(call);
	}
	if (c->peer_eof && !call->finished)
		ws_finish(call, 1006, "", 0);             /* gone before the app's answer */
	return 0;
}

/* struct app_ops's resume: the output drained, a waiting send goes on */
int asgi_ws_resume(struct conn *c)
{
	WsCall *call = (WsCall *)c->call;

	if (!call || !Py_IS_TYPE(c->call, &WsCallType))
		return asgi_resume(c);
	if (call->tx && conn_pending(c) < LOW_WATER)
		asgi_resolve(&call->tx, Py_None, NULL);
	return RESPOND_PARKED;
}

/* struct app_ops's lingers: a WebSocket that sent its close frame first
 * awaits the client's (close_out says why): a close reads on meanwhile. */
int asgi_ws_lingers(struct conn *c)
{
	WsCall *call = (WsCall *)c->call;

	return call && Py_IS_TYPE(c->call, &WsCallType) && call->state != ST_WAIT &&
	       call->close_sent && !call->close_rcvd;
}

/* struct app_ops's drop: the connection closed under the call */
void asgi_ws_drop(struct conn *c, PyObject *obj)
{
	WsCall *call = (WsCall *)obj;

	if (!Py_IS_TYPE(obj, &WsCallType)) {
		asgi_drop(c, obj);
		return;
	}
	ws_finish(call, 1006, "", 0);                 /* unless a close was exchanged */
	ws_deliver(call);
	asgi_resolve_gone(&call->tx, obj);         /* a waiting send: the client went away */
	unlink_call(call);
	Py_CLEAR(call->conn);
	Py_DECREF(obj);                            /* the connection's reference */
}
