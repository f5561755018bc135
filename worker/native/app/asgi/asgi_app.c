/* The ASGI adapter's entry points: a request head made a scope and its
 * app started as a task (struct app_ops: asgi_request, asgi_serve), the
 * task's end (asgi_done), what ends every response (asgi_end: the counts,
 * the access log, the codec going on), and the connection's side: input
 * for a waiting receive (asgi_input), output drained for a waiting send
 * (asgi_resume), the client gone (asgi_drop).
 *
 * The errors of §2 of issue 22, all logged with the request, never a
 * traceback to the client:
 *  - the app raises (any BaseException) before its head went out: 500;
 *    after: the connection is closed mid-body;
 *  - it returns without a whole response: the same, logged as such;
 *  - a message of the wrong type or order: send() raises into the app
 *    naming the message (asgi_call.c), and the above applies.
 * The runner (asgi.py run_call) catches every BaseException of the app
 * and hands it to done(): a SystemExit or KeyboardInterrupt never reaches
 * asyncio's run loop (worker/aio.py runs that again all the same).
 *
 * Threads: a call's task lives on the loop of the thread that served its
 * request (the connection's owner), and its send() and receive() touch
 * the connection from that thread. So an ASGI Server never shares its
 * connections among a group's threads (no per-request dispatch) and the
 * relief never moves one (asgi.py turns both off): a connection with a
 * running task is only ever touched by its task's thread.
 *
 * May call: asgi_call.c, asgi_end.c, asgi_scope.c, the codec
 * (h1_response.c), the connection layer (conn_io.c).
 */
#include <string.h>

#include "asgi.h"

static PyObject *P_500;                    /* the 500's status line and field, made once */

/* ---- the codec's calls: a request, served ----------------------------------------------------- */

PyObject *asgi_request(struct conn *c)
{
	PyObject *scope = asgi_build_scope(c);

	if (scope && asgi_ext_scope(c, scope) < 0)
		Py_CLEAR(scope);
	return scope;
}

/* The app's error (pending) logged with the request, then answered: a
 * 500 if its head did not go out, else the connection closes. */
static void app_failed(AsgiCall *call, const char *what)
{
	struct conn *c = call->conn;

	report_exc(call->srv, call->scope, what);
	if (!c || call->gone || call->ended)
		return;
	if (call->head_sent) {
		call->f.keep = 0;
		asgi_account(call);
		Py_INCREF(c);                          /* the close drops the call's */
		conn_close_now(c);                    /* mid-body: the client sees a cut */
		Py_DECREF(c);
		return;
	}
	{
		struct h1_frame f = {.http11 = call->f.http11, .keep = 0, .head_only = call->f.head_only,
		                     .length = -1, .code = 500, .prefix = Py_NewRef(P_500)};
		static const char msg[] = "Internal Server Error\n";

		Py_XSETREF(call->f.prefix, NULL);
		call->f = f;
		call->started = call->head_sent = 1;
		if (h1_head(c, &call->f, sizeof(msg) - 1) < 0 ||
		    h1_send_body(c, &call->f, msg, sizeof(msg) - 1, 0, 0) < 0 ||
		    h1_end_body(c, &call->f) < 0)
			report_exc(call->srv, call->scope, "the 500 response");
		asgi_end(call, 0);
	}
}

static PyObject *asgi_done(AsgiCall *call, PyObject *exc);
static PyMethodDef done_def = {"asgi_done", (PyCFunction)asgi_done, METH_O,
                               "done(exc or None): the end of an ASGI call's app"};

/* The app runs inside the runner (asgi.py run_call: the Server's `slow`
 * slot for an ASGI Server), a coroutine that awaits the app and then
 * calls done(exception or None): no done callback, which cost a handle
 * and one more loop iteration per request, and every BaseException of
 * the app ends there, not in asyncio's run loop. */
int asgi_serve(struct conn *c, PyObject *scope, int whole)
{
	AsgiCall *call = asgi_call_new(c, scope);
	int rc;

	(void)whole;                               /* receive reads what is still to come */
	if (!call)
		return -1;
	rc = asgi_start_task(c, (PyObject *)call, scope, call->aio, &done_def);
	Py_DECREF(call);
	return rc;
}

/* ---- the task's end ---------------------------------------------------------------------------- */

/* The app ended (its runner's done): its exception, or a return without
 * a whole response, answered and logged (once); a return after the
 * response, nothing. */
static PyObject *asgi_done(AsgiCall *call, PyObject *exc)
{
	if (exc != Py_None) {
		if (!PyExceptionInstance_Check(exc)) {
			PyErr_SetString(PyExc_TypeError, "done(): an exception or None");
			return NULL;
		}
		/* our own send()'s ClientDisconnected, come back through the app
		 * that did not catch it: the client left, the app did nothing
		 * wrong and there is no one to answer (found by bench/asgi_loop.py:
		 * a traceback logged per request wrk cut at the end of its run) */
		if (PyErr_GivenExceptionMatches(exc, ClientDisconnected) &&
		    (call->gone || !call->conn || call->conn->closed))
			Py_RETURN_NONE;
		PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), Py_NewRef(exc),
		              PyException_GetTraceback(exc));
		app_failed(call, "app");
	}
	else if (!call->ended && !call->gone) {
		PyErr_SetString(PyExc_RuntimeError, call->body_end
		                ? "the app returned before its trailers ended (more_trailers)"
		                : call->started
		                ? "the app returned before its response ended (more_body)"
		                : "the app returned without sending http.response.start");
		app_failed(call, "app");
	}
	Py_RETURN_NONE;
}

/* ---- the connection's side ------------------------------------------------------------------------ */

int asgi_resume(struct conn *c)
{
	AsgiCall *call = (AsgiCall *)c->call;
	int rc;

	if (call && call->file_fd >= 0) {
		Py_INCREF(call);                       /* its end drops the connection's */
		rc = asgi_file_resume(call);
		Py_DECREF(call);
		return rc;
	}
	if (call && call->tx && conn_pending(c) < LOW_WATER)
		asgi_resolve(&call->tx, Py_None, NULL);
	return RESPOND_PARKED;
}

int asgi_input(struct conn *c)
{
	AsgiCall *call = (AsgiCall *)c->call;
	PyObject *msg = NULL;

	if (call && c->parser->body_late) {
		asgi_body_late(call);                  /* its receive waited past body_timeout */
		return 0;
	}
	if (!call || !asgi_waiting(&call->rx))
		return 0;                              /* no one to take it: it stays in the parser */
	if (!call->body_done) {
		msg = asgi_take_body(call);
		if (!msg && PyErr_Occurred())
			return -1;
	}
	if (!msg && c->parser->hp->state == HP_ERROR) {
		/* the client broke its body (a bad chunk, past the limit): it is
		 * told so, not the app's fault (issue 35, point 8: the app read a
		 * disconnect, the client was still there and got a 500) */
		asgi_body_error(call);
		return 0;
	}
	if (!msg && c->peer_eof)
		msg = asgi_disconnect();               /* the client ended its request */
	if (msg) {
		asgi_resolve(&call->rx, msg, NULL);
		Py_DECREF(msg);
		h1_body_wait(c, 0);                    /* answered: the app's time now */
	}
	return 0;
}

void asgi_drop(struct conn *c, PyObject *obj)
{
	AsgiCall *call = (AsgiCall *)obj;
	PyObject *msg;

	(void)c;
	call->gone = 1;
	asgi_file_close(call);                     /* a file still going out: never now */
	if (!call->ended)
		asgi_account(call);                    /* what went out of it, if anything */
	if (call->rx && (msg = asgi_disconnect())) {
		asgi_resolve(&call->rx, msg, NULL);
		Py_DECREF(msg);
	}
	asgi_resolve_gone(&call->tx, obj);         /* a waiting send: the client went away */
	Py_CLEAR(call->conn);
	Py_DECREF(obj);                            /* the connection's reference */
}

int asgi_make_app(void)
{
	P_500 = PyBytes_FromString("HTTP/1.1 500 Internal Server Error\r\n"
	                           "Content-Type: text/plain; charset=utf-8\r\n");
	return P_500 && asgi_make_keys() == 0 && asgi_call_make() == 0
	       ? asgi_ext_make() : -1;
}
