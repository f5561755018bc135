/* The HTTP/1 codec's timers on one connection (the header, keep-alive and
 * body timers; a body's deadline pushed back by what arrives, at
 * min_body_rate) and its refusals: an error answered, counted, logged at
 * most once a second, and the connection closed. h1_conn.c serves the
 * requests; it calls in here through h1.h and h1_conn_int.h.
 *
 * May call: h1_parser.c, h1_response.c (the Date line), the connection
 * layer (conn_io.c, conn_report.c, conn_timers.c, conn_proxy.c).
 */
#include <string.h>

#include "h1.h"
#include "h1_conn_int.h"

static const char *REASONS(int status)
{
	switch (status) {
	case 400: return "Bad Request";
	case 408: return "Request Timeout";
	case 413: return "Content Too Large";
	case 414: return "URI Too Long";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 501: return "Not Implemented";
	case 505: return "HTTP Version Not Supported";
	default: return "Error";
	}
}

/* c's timer of `kind` due at `due` (not a fixed time from now): a body's
 * deadline, pushed back by what arrived */
#define arm_at timer_arm_at

/* The timer for what the connection waits for now, after a request or
 * some output went out: the client to take pending output (send), the
 * rest of a head (its clock runs from the first of its bytes: not re-armed
 * by the next ones), or the next request (keep-alive). */
void h1_rearm(struct conn *c)
{
	/* held: the body timer runs from the head on, whatever goes out */
	if (c->closed || c->serving || c->lingering || c->held)
		return;
	if (conn_owed(c)) {
		c->head_clock = 0;                 /* a head's clock starts again after */
		timer_arm(c, TIMER_SEND);
		return;
	}
	if (c->closing)
		return;
	if (c->call) {
		/* a call runs: the app's own time is not the client's to be
		 * timed; a send timer of output now taken ends here (it cut an
		 * SSE stream quiet for body_timeout after a burst). But a body
		 * the app waits for is the client's: its deadline runs on */
		if (c->parser->body_wait)
			arm_at(c, TIMER_BODY, c->parser->body_due);
		else if (!c->call_ping)
			timer_cancel(c);
		else if (c->tkind != TIMER_PING && c->tkind != TIMER_PONG)
			timer_arm(c, TIMER_PING);      /* an open WebSocket: its ping's (asgi_ws_ping.c) */
		return;
	}
	if (parser_head_started(c->parser)) {
		if (!c->head_clock) {
			c->head_clock = 1;
			timer_arm(c, TIMER_HEADER);
		}
	}
	else {
		c->head_clock = 0;
		timer_arm(c, TIMER_KEEPALIVE);
	}
}

/* ---- refusals ------------------------------------------------------------------------------ */

/* A refusal counted by kind, and logged (srv_log_refusal: at most a line
 * a second per worker, a flood of bad requests must not flood the log). */
static void note_refusal(struct conn *c, int status, int kind, const char *reason)
{
	c->srv->refused[kind]++;
	srv_log_refusal(c->srv, c->peer, status, reason);
}

/* conn_refuse, counted under `kind` (refusal_kind() of the status, or
 * one the status does not tell apart) */
static void refuse_as(struct conn *c, int status, int kind, const char *reason)
{
	char buf[1100];
	char body[600];
	const char *date;
	size_t dn;
	int bn = snprintf(body, sizeof(body), "%d %s: %.500s\n", status, REASONS(status), reason);
	srv_count(c->srv, status);
	note_refusal(c, status, kind, reason);
	http_date(&date, &dn);
	int hn = snprintf(buf, sizeof(buf),
	                  "HTTP/1.1 %d %s\r\n%.*sContent-Type: text/plain\r\nContent-Length: %d\r\n"
	                  "Connection: close\r\n\r\n%s", status, REASONS(status), (int)dn, date, bn,
	                  body);

	if (conn_send(c, buf, (size_t)hn, 0) < 0)
		PyErr_Clear();                         /* no memory: the close says enough */
	conn_close_soft(c);
	conn_flush(c);
}

void conn_refuse(struct conn *c, int status, const char *reason)
{
	refuse_as(c, status, refusal_kind(status), reason);
}

/* A held request's body progressed by n bytes (framing included, as the
 * slow path counts them): its deadline moves back n / min_body_rate
 * seconds, so a client sending at that rate or faster is never cut, one
 * trickling a byte at a time is (the slow path's rule). */
void body_progress(struct conn *c, size_t n)
{
	double rate = c->srv->min_body_rate;
	double due;

	if (c->tkind != TIMER_BODY || rate <= 0)
		return;
	due = c->due + (double)n / rate;
	arm_at(c, TIMER_BODY, due);
}

/* The same rule for a body an adapter's call streams: its deadline moves
 * back with what arrives, whether the call waits for it now or not. */
void call_body_progress(struct conn *c, size_t n)
{
	Parser *p = c->parser;
	double rate = c->srv->min_body_rate;

	if (!p->body_due || rate <= 0)
		return;
	p->body_due += (double)n / rate;
	if (c->tkind == TIMER_BODY)
		arm_at(c, TIMER_BODY, p->body_due);
}

void h1_body_wait(struct conn *c, int waiting)
{
	Parser *p = c->parser;

	if (c->closed || (unsigned)!!waiting == p->body_wait)
		return;
	p->body_wait = (unsigned)!!waiting;
	/* body_timeout from the first wait on, as the slow path's (wsgi.py
	 * _recv_more): a total the client has, not an idle timer */
	if (waiting && !p->body_due && c->srv->body_timeout > 0)
		p->body_due = mono_now() + c->srv->body_timeout;
	if (!p->body_due)
		p->body_wait = 0;                      /* body_timeout 0: no timeout */
	h1_rearm(c);
}

/* A streamed body's refusal: answered (a refusal of the kind, the
 * connection closed after it) if nothing of the response went out, else
 * counted and logged all the same (what the client did wrong is said in
 * the log if it cannot be said to the client) and the connection ends. */
static void body_refuse(struct conn *c, int answer, int status, int kind, const char *reason)
{
	if (c->closed)
		return;
	if (answer) {
		refuse_as(c, status, kind, reason);
		return;
	}
	note_refusal(c, status, kind, reason);
	conn_close_now(c);
}

void h1_body_late(struct conn *c, int answer)
{
	body_refuse(c, answer, 408, REFUSAL_BODY_TIMEOUT, "the request body did not arrive in time");
}

void h1_body_refuse(struct conn *c, int answer)
{
	struct hp_parser *hp = c->parser->hp;
	int status = hp->status ? hp->status : 400;

	body_refuse(c, answer, status, refusal_kind(status),
	            hp->reason ? hp->reason : "bad request body");
}

/* A timer of the protocol's kinds is due (conn_io.c took the send and
 * linger ones): a body that did not come in time, a head that did not,
 * or an idle keep-alive connection. */
int h1_timeout(struct conn *c, int kind)
{
	if (kind == TIMER_PING || kind == TIMER_PONG)
		return c->call && c->srv->app_ops->timer ? c->srv->app_ops->timer(c, kind) : 0;
	if (c->proxy_wait) {
		conn_proxy_timeout(c);                /* not HTTP yet: no 408, a close */
		return 0;
	}
	if (kind == TIMER_BODY && c->call) {
		/* the body the call waits for is late: the adapter answers (it
		 * knows whether its response began) and its receive ends */
		c->parser->body_wait = 0;
		c->parser->body_late = 1;
		return c->srv->app_ops->input ? c->srv->app_ops->input(c) : 0;
	}
	if (kind == TIMER_BODY && c->held) {
		Py_CLEAR(c->held);
		refuse_as(c, 408, REFUSAL_BODY_TIMEOUT, "the request body did not arrive in time");
		return 0;
	}
	if (parser_head_started(c->parser))
		conn_refuse(c, 408, "the request head did not arrive in time");
	else
		conn_close_soft(c);                   /* idle keep-alive: nothing to say */
	return 0;
}

/* ---- the Python side: the codec's method on the connection ------------------------------------ */

static PyObject *Conn_refuse(struct conn *c, PyObject *args)
{
	int status;
	const char *reason;

	if (!PyArg_ParseTuple(args, "is:refuse", &status, &reason))
		return NULL;
	conn_refuse(c, status, reason);
	Py_RETURN_NONE;
}

PyMethodDef h1_conn_methods[] = {
	{"refuse", (PyCFunction)Conn_refuse, METH_VARARGS,
	 "refuse(status, reason): answers the error and closes."},
	{NULL},
};
