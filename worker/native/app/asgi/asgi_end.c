/* The end of an ASGI call (asgi.h): the response whole, or answered for
 * the app, or its client gone: counted and logged once (asgi_account),
 * the call detached from its connection and the codec going on with the
 * requests behind it (asgi_end); and the futures a receive or a send
 * waits on, resolved (asgi_resolve).
 *
 * May call: asgi_scope.c (the disconnect message), the codec (h1_conn.c:
 * the call done), the connection layer (conn_io.c: containment).
 */
#include "asgi.h"

/* asgi.h; made by the module's init (httpmodule.c). Here, in the first
 * of the adapter's files that raise it */
PyObject *ClientDisconnected;

/* ---- futures ---------------------------------------------------------------------------------- */

/* A future's method called by an interned name through vectorcall: no
 * str made from a C string, no format parsed, no bound method or argument
 * tuple built for each call. PyObject_CallMethod(fut, "done", NULL) did all
 * four, ~1,300 instructions, twice per WebSocket message (5 % of an echo:
 * bench/RESULTS.md, 2026-12-03). name: a slot for the interned name, made
 * once (under the GIL, as every caller runs). A new reference, or NULL with
 * the error set. */
static PyObject *fut_call(PyObject *fut, PyObject **name, const char *s, PyObject *arg)
{
	PyObject *args[2] = {fut, arg};

	if (!*name && !(*name = PyUnicode_InternFromString(s)))
		return NULL;
	/* args[0] is the future itself; no ARGUMENTS_OFFSET: there is no
	 * args[-1] the callee could borrow */
	return PyObject_VectorcallMethod(*name, args, arg ? 2 : 1, NULL);
}

static PyObject *N_DONE, *N_SET_RESULT, *N_SET_EXCEPTION;

void asgi_resolve(PyObject **fut, PyObject *value, PyObject *exc)
{
	PyObject *f = *fut, *done, *rc;
	int is_done;

	if (!f)
		return;
	*fut = NULL;
	{
		PyObject *t, *v, *tb;

		PyErr_Fetch(&t, &v, &tb);          /* called on error paths too */
		done = fut_call(f, &N_DONE, "done", NULL);
		/* the app's loop's future: done() may return junk whose truth
		 * raises (-1 was taken for done, its error dropped unreported:
		 * issue 35, review 2) */
		is_done = done ? PyObject_IsTrue(done) : -1;
		if (is_done == 0)
			rc = exc ? fut_call(f, &N_SET_EXCEPTION, "set_exception", exc)
			         : fut_call(f, &N_SET_RESULT, "set_result", value ? value : Py_None);
		else
			rc = is_done > 0 ? Py_NewRef(Py_None) : NULL;
		if (!rc)
			PyErr_WriteUnraisable(f);
		Py_XDECREF(rc);
		Py_XDECREF(done);
		PyErr_Restore(t, v, tb);
	}
	Py_DECREF(f);
}

void asgi_resolve_gone(PyObject **fut, PyObject *who)
{
	PyObject *exc;

	if (!*fut)
		return;
	exc = PyObject_CallFunction(ClientDisconnected, "s", "the client went away");
	if (exc) {
		asgi_resolve(fut, NULL, exc);
		Py_DECREF(exc);
	}
	else
		PyErr_WriteUnraisable(who);
}

int asgi_waiting(PyObject **fut)
{
	PyObject *done;
	int waits;

	if (!*fut)
		return 0;
	done = fut_call(*fut, &N_DONE, "done", NULL);
	waits = done ? PyObject_Not(done) : -1;
	Py_XDECREF(done);
	if (waits < 0) {
		PyErr_WriteUnraisable(*fut);               /* not an asyncio future's way */
		waits = 0;
	}
	if (!waits)
		Py_CLEAR(*fut);
	return waits;
}

/* ---- the end ---------------------------------------------------------------------------------------- */

void asgi_account(AsgiCall *call)
{
	Server *s = call->srv;
	PyObject *rc;

	if (call->counted)
		return;
	call->counted = 1;
	srv_count(s, call->head_sent ? call->f.code : 0);
	srv_time(s, call->since);
	if (s->access != Py_None) {
		rc = PyObject_CallFunction(s->access, "OiKd", call->scope,
		                           call->head_sent ? call->f.code : 0, call->f.sent, call->since);
		if (!rc)
			PyErr_WriteUnraisable(s->access);
		Py_XDECREF(rc);
	}
	if (s->on_retire && s->requests >= s->retire_at) {
		PyObject *fn = s->on_retire;           /* max_requests: once (wsgi_app.c) */

		s->on_retire = NULL;
		rc = PyObject_CallNoArgs(fn);
		if (!rc)
			PyErr_WriteUnraisable(fn);
		Py_XDECREF(rc);
		Py_DECREF(fn);
	}
}

struct conn *asgi_detach(AsgiCall *call)
{
	struct conn *c = call->conn;
	PyObject *msg;

	if (call->ended || !c)
		return NULL;
	call->ended = 1;
	asgi_file_close(call);                     /* sent, or never to be */
	asgi_account(call);
	/* a receive waiting for the client's end: the response ended (ASGI:
	 * a receive after it says disconnect) */
	if (call->rx && (msg = asgi_disconnect())) {
		asgi_resolve(&call->rx, msg, NULL);
		Py_DECREF(msg);
	}
	call->conn = NULL;                         /* ours now */
	if (c->call == (PyObject *)call) {
		c->call = NULL;
		Py_DECREF(call);                       /* the connection's (the caller holds one) */
	}
	/* a whole body the app did not read is dropped; one still coming
	 * ends the connection (parser_finish says so) */
	if (!c->closed) {
		if (c->parser->hp->state == HP_DONE)
			c->parser->bstart = c->parser->blen;
		h1_call_detached(c);
	}
	return c;
}

/* The context the running callback entered (a task's step: the task's
 * own), stepped out of: a new reference to it, the current context then
 * the one it was entered from; NULL if no context was entered (the
 * turn's own code: it runs in the loop thread's context already). Any
 * pending exception is kept. */
static PyObject *step_out(void)
{
	PyObject *ctx = PyThreadState_Get()->context, *t, *v, *tb;

	if (!ctx)
		return NULL;
	Py_INCREF(ctx);
	PyErr_Fetch(&t, &v, &tb);
	if (PyContext_Exit(ctx) < 0) {             /* not entered: no step runs */
		PyErr_Clear();
		Py_CLEAR(ctx);
	}
	PyErr_Restore(t, v, tb);
	return ctx;
}

/* back into ctx (step_out's), which is released */
static void step_in(PyObject *ctx)
{
	PyObject *t, *v, *tb;

	if (!ctx)
		return;
	PyErr_Fetch(&t, &v, &tb);
	if (PyContext_Enter(ctx) < 0)
		PyErr_WriteUnraisable(ctx);            /* cannot happen: it was current */
	PyErr_Restore(t, v, tb);
	Py_DECREF(ctx);
}

void asgi_end(AsgiCall *call, int keep)
{
	struct conn *c = asgi_detach(call);
	PyObject *ctx = NULL;

	if (!c)
		return;
	/* A request behind this one whose head is here already (pipelined)
	 * is served now, from inside the app's send() or done(): inside this
	 * request's task step and its context. Its task, made there, would
	 * copy this request's context vars (asyncio's Task copies the
	 * current context): a var the app set showed in the next request
	 * (tests/worker/test_aio_tasks.py). Made instead in the context the
	 * step was entered from, the loop's, as a task started by the turn
	 * is. Only then: the step out and back costs ~0.1k instructions. */
	if (keep && !c->closed && c->parser->len > c->parser->start)
		ctx = step_out();
	if (!c->closed && h1_call_done(c, keep) < 0)
		contain(c);
	step_in(ctx);
	Py_DECREF(c);
}

