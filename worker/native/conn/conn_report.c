/* The refusal log of a Server's connections (a line at most a second per
 * worker) and the containment of an error out of a connection's handler
 * (logged through the loop's report callable, the connection closed),
 * repeated ones throttled per kind.
 *
 * May call: conn_io.c (the close), the loop's Python callables (report,
 * on_refusal).
 */
#include <stdio.h>
#include <string.h>

#include "server.h"

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

/* The throttle of report_exc: a remote client that triggers one error
 * per connection (a bad SNI did, issue 35 §19) must not flood the log,
 * one traceback a connection. Per kind (where, and the exception's type),
 * REPORT_BURST lines per REPORT_INTERVAL, the last of them saying that
 * more are counted; the first line after the interval says how many were
 * not logged. The app's own errors ("app") are each logged, as gunicorn
 * logs each: they are the app's to see, with the request they failed. A
 * kind pushed out of the table (more than 8 at once) loses its count. */
#define REPORT_BURST 5
#define REPORT_INTERVAL 10.0

static int report_allowed(Server *s, const char *what, const void *type, char *note, size_t n)
{
	struct report_kind *k = NULL, *oldest = &s->report_kinds[0];
	double now = mono_now();
	size_t i;

	snprintf(note, n, "%s", what);
	if (!strcmp(what, "app"))
		return 1;
	for (i = 0; i < sizeof(s->report_kinds) / sizeof(s->report_kinds[0]); i++) {
		struct report_kind *r = &s->report_kinds[i];

		if (r->what == what && r->type == type) {
			k = r;
			break;
		}
		if (r->since < oldest->since)
			oldest = r;
	}
	if (!k) {
		k = oldest;
		*k = (struct report_kind){what, type, now, 0, 0};
	}
	if (now - k->since >= REPORT_INTERVAL) {
		k->since = now;
		k->logged = 0;
	}
	if (k->logged >= REPORT_BURST) {
		k->unlogged++;
		return 0;
	}
	k->logged++;
	if (k->unlogged)
		snprintf(note, n, "%s (%llu more like it were not logged since the last line)", what,
		         k->unlogged);
	else if (k->logged == REPORT_BURST)
		snprintf(note, n, "%s (more like it are counted, not logged, for %g s)", what,
		         REPORT_INTERVAL);
	k->unlogged = 0;
	return 1;
}

void report_exc(Server *s, PyObject *env, const char *what)
{
	/* the exception as the handled one while report() runs: it logs
	 * with exc_info=True, as log.exception would in an except block */
	PyObject *t, *v, *tb, *prev;
	char note[256];

	PyErr_Fetch(&t, &v, &tb);
	PyErr_NormalizeException(&t, &v, &tb);
	if (!report_allowed(s, what, t, note, sizeof(note))) {
		Py_XDECREF(t);
		Py_XDECREF(v);
		Py_XDECREF(tb);
		PyErr_Clear();
		return;
	}
	if (tb && v)
		PyException_SetTraceback(v, tb);
	prev = PyErr_GetHandledException();
	PyErr_SetHandledException(v);
	Py_XDECREF(t);
	Py_XDECREF(tb);
	PyErr_Clear();
	{
		PyObject *rc = PyObject_CallFunction(s->report, "Os", env ? env : Py_None, note);
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
void contain(struct conn *c)
{
	report_exc(c->srv, NULL, "a connection's handler");
	if (!c->closed && conn_close_now(c) < 0)
		report_exc(c->srv, NULL, "closing a failed connection");
}
