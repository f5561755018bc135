/* The refusal log of a Server's connections (a line at most a second per
 * worker) and the containment of an error out of a connection's handler
 * (logged through the loop's report callable, the connection closed).
 *
 * May call: conn_io.c (the close), the loop's Python callables (report,
 * on_refusal).
 */
#include "engine.h"

/* ---- the refusal log ------------------------------------------------------------------------- */

/* A refusal logged with the peer and the reason: a line at most a second
 * per worker (a flood of bad requests must not flood the log), saying how
 * many were refused since the last one. The codec's refused requests and
 * this layer's closed connections (a bad PROXY header: status 0) share it. */
void srv_log_refusal(Server *s, PyObject *peer, int status, const char *reason)
{
	double now;
	PyObject *rc;

	s->refusal_unlogged++;
	if (!s->on_refusal)
		return;
	now = mono_now();
	if (s->refusal_logged && now - s->refusal_logged < 1.0)
		return;
	rc = PyObject_CallFunction(s->on_refusal, "OisK", peer, status, reason, s->refusal_unlogged);
	s->refusal_logged = now;
	s->refusal_unlogged = 0;
	if (!rc)
		PyErr_WriteUnraisable(s->on_refusal);
	Py_XDECREF(rc);
}

/* ---- containment ------------------------------------------------------------------------------- */

void report_exc(Server *s, PyObject *env, const char *what)
{
	/* the exception as the handled one while report() runs: it logs
	 * with exc_info=True, as log.exception would in an except block */
	PyObject *t, *v, *tb;
	PyErr_Fetch(&t, &v, &tb);
	PyErr_NormalizeException(&t, &v, &tb);
	if (tb && v)
		PyException_SetTraceback(v, tb);
	PyObject *prev = PyErr_GetHandledException();
	PyErr_SetHandledException(v);
	Py_XDECREF(t);
	Py_XDECREF(tb);
	PyErr_Clear();
	{
		PyObject *rc = PyObject_CallFunction(s->report, "Os", env ? env : Py_None, what);
		if (!rc)
			PyErr_WriteUnraisable(s->report);
		Py_XDECREF(rc);
	}
	PyErr_SetHandledException(prev);
	Py_XDECREF(prev);
	Py_XDECREF(v);
}

/* An error out of a connection's handler (an event's or a timer's) that
 * is not the app's (those are answered in wsgi_app.c): ours, or no memory.
 * Logged, and that connection closes; the loop thread serves on: a loop
 * thread never ends while its worker serves (DESIGN §5, issue 18 §1). */
void contain(HttpConn *c)
{
	report_exc(c->srv, NULL, "a connection's handler");
	if (!c->closed && hconn_close_now(c) < 0)
		report_exc(c->srv, NULL, "closing a failed connection");
}
