/* The HTTP/1 codec's responses on the wire: the head into the
 * connection's output (h1_head: the adapter's checked prefix from
 * h1_head.c, the Date line, the framing we choose) and the body's framing
 * (Content-Length or chunked, never more than announced, HEAD/204/304
 * without a body, keep-alive decided at the head). The framing state of
 * one response is a struct h1_frame, which the adapter's response object
 * holds (wsgi.h: Respond; asgi.h) and hands in.
 *
 * The rules (each has a test in tests/worker/test_wsgi.py or
 * test_response_*.py):
 *  - the app's Date and Server fields win: ours are left out;
 *  - a length the app did not give and cannot be known: chunked on
 *    HTTP/1.1, else the connection closes after the body;
 *  - never more bytes than announced (the rest is cut and the connection
 *    closes), and fewer than announced closes it too;
 *  - HEAD, 204 and 304 send no body, whatever the app gives.
 *
 * May call: conn_io.c (the connection's output).
 */
#include <string.h>
#include <time.h>

#include "h1.h"

/* ---- the Date line, formatted once a second per thread ----------------------- */

static _Thread_local time_t date_sec = -1;
static _Thread_local char date_line[48];
static _Thread_local size_t date_len;

/* A new second: the line again (once a second per thread, off the hot path). */
static __attribute__((noinline)) void date_format(time_t t)
{
	static const char days[] = "SunMonTueWedThuFriSat";
	static const char months[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
	struct tm tm;

	gmtime_r(&t, &tm);
	/* by hand: strftime's %a and %b follow the locale */
	date_len = (size_t)snprintf(date_line, sizeof(date_line),
	                            "Date: %.3s, %02d %.3s %04d %02d:%02d:%02d GMT\r\n",
	                            days + 3 * tm.tm_wday, tm.tm_mday, months + 3 * tm.tm_mon,
	                            tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
	date_sec = t;
}

/* static inline for h1_head (the hot path: an exported function is
 * called through the PLT under -fPIC); http_date for h1_timers.c's refusals */
static inline void date_now(const char **s, size_t *n)
{
	time_t t = time(NULL);

	if (t != date_sec)
		date_format(t);
	*s = date_line;
	*n = date_len;
}

void http_date(const char **s, size_t *n)
{
	date_now(s, n);
}
/* ---- framing --------------------------------------------------------------------------- */

static int emit(struct conn *c, const char *s, size_t n)
{
	return conn_send(c, s, n, 0);
}

/* The head: the app's status line and fields, Date, Server, and the
 * framing we choose; known is the body's length if known, else -1. */
int h1_head(struct conn *c, struct h1_frame *f, long long known)
{
	Server *s = c->srv;
	const char *d;
	size_t dn;
	char line[64];

	if (emit(c, PyBytes_AS_STRING(f->prefix), (size_t)PyBytes_GET_SIZE(f->prefix)) < 0)
		return -1;
	date_now(&d, &dn);
	if ((!f->app_date && emit(c, d, dn) < 0) ||
	    (!f->app_server &&
	     emit(c, PyBytes_AS_STRING(s->server_line), (size_t)PyBytes_GET_SIZE(s->server_line)) < 0))
		return -1;
	if (f->bodiless || (f->head_only && known == 0))
		/* nothing to count: no body goes out; a HEAD answered with no
		 * body at all (werkzeug gives () for HEAD) says nothing of the
		 * GET's length, which may be a stream: no Content-Length: 0 */
		known = -1;
	if (f->length < 0 && known >= 0) {
		f->length = known;
		size_t n = sizeof("Content-Length: ") - 1;

		memcpy(line, "Content-Length: ", n);
		n += h1_put_dec(line + n, (unsigned long long)known);
		memcpy(line + n, "\r\n", 2);
		if (emit(c, line, n + 2) < 0)
			return -1;
	}
	if (f->length < 0 && !f->head_only && !f->bodiless) {
		if (f->http11) {
			f->chunked = 1;
			if (emit(c, "Transfer-Encoding: chunked\r\n", 28) < 0)
				return -1;
		}
		else
			f->keep = 0;                     /* HTTP/1.0, length unknown: close ends it */
	}
	if (s->draining)
		/* decided now, not when the request came: one already in the app
		 * when the drain began was answered keep-alive, and its client's
		 * next request raced the drain's idle close (review) */
		f->keep = 0;
	if (!f->keep) {
		if (emit(c, "Connection: close\r\n", 19) < 0)
			return -1;
	}
	else if (!f->http11 && emit(c, "Connection: keep-alive\r\n", 24) < 0)
		return -1;
	return emit(c, "\r\n", 2);
}

/* Body bytes after the head; `now`: try the socket at once (a streaming
 * app: the client sees each chunk as it comes); `wait`: past HIGH_WATER,
 * wait here for the client to read (write(), the slow path), else the
 * caller parks the body (respond, iterate). */
int h1_send_body(struct conn *c, struct h1_frame *f, const char *data, size_t n, int now, int wait)
{
	char line[24];

	if (c->closed) {
		PyErr_SetString(ClientGone, "the client went away");
		return -1;
	}
	if (f->head_only || f->bodiless || !n)
		return now ? conn_flush(c) : 0;         /* the head, at least, goes now */
	if (f->length >= 0 && (f->sent >= (unsigned long long)f->length ||
	                       n > (unsigned long long)f->length - f->sent)) {
		/* never past what we announced; sent may be past it already (it
		 * is writable from Python, for sendfile: an app that set it on its
		 * start_response made this a huge n, or wrapped sent + n, a read
		 * far past data, and the worker died of SIGSEGV: review) */
		n = f->sent >= (unsigned long long)f->length
		    ? 0 : (size_t)((unsigned long long)f->length - f->sent);
		f->keep = 0;
		if (!n)
			return now ? conn_flush(c) : 0;
	}
	f->sent += n;
	if (f->chunked) {
		if (conn_send(c, line, (size_t)snprintf(line, sizeof(line), "%zx\r\n", n), 0) < 0 ||
		    conn_send(c, data, n, 0) < 0 || conn_send(c, "\r\n", 2, now) < 0)
			return -1;
	}
	else if (conn_send(c, data, n, now) < 0)
		return -1;
	if (wait && conn_pending(c) > HIGH_WATER)
		return conn_flush_wait(c, c->srv->body_timeout, LOW_WATER);
	return 0;
}

/* The end of the body (the adapter's finish): the last chunk of a
 * chunked one, and a body shorter than announced closes the connection. */
int h1_end_body(struct conn *c, struct h1_frame *f)
{
	if (f->chunked && conn_send(c, "0\r\n\r\n", 5, 0) < 0)
		return -1;
	if (f->length >= 0 && f->sent < (unsigned long long)f->length && !f->head_only &&
	    !f->bodiless)
		f->keep = 0;                         /* the app sent less than it announced */
	return 0;
}

/* ---- a span the adapter sends itself, trailers ---------------------------------------- */

long long h1_span_begin(struct conn *c, struct h1_frame *f, unsigned long long n)
{
	char line[24];

	if (f->head_only || f->bodiless || !n)
		return 0;
	if (f->length >= 0 && (f->sent >= (unsigned long long)f->length ||
	                       n > (unsigned long long)f->length - f->sent)) {
		/* never past what we announced (h1_send_body's rule) */
		n = f->sent >= (unsigned long long)f->length
		    ? 0 : (unsigned long long)f->length - f->sent;
		f->keep = 0;
	}
	if (n && f->chunked &&
	    conn_send(c, line, (size_t)snprintf(line, sizeof(line), "%llx\r\n", n), 0) < 0)
		return -1;
	return (long long)n;
}

int h1_span_end(struct conn *c, struct h1_frame *f, unsigned long long n)
{
	return n && f->chunked ? conn_send(c, "\r\n", 2, 0) : 0;
}

int h1_end_chunks(struct conn *c, struct h1_frame *f)
{
	return f->chunked ? conn_send(c, "0\r\n", 3, 0) : 0;
}

int h1_trailers(struct conn *c, struct h1_frame *f, PyObject *block, int last)
{
	if (!f->chunked)
		return 0;                            /* no body on the wire, no trailers */
	if (conn_send(c, PyBytes_AS_STRING(block), (size_t)PyBytes_GET_SIZE(block), 0) < 0)
		return -1;
	return last ? conn_send(c, "\r\n", 2, 0) : 0;
}
