/* The ASGI adapter's extensions (HTTP spec 2.4, "Extensions") and the
 * body timer of a streamed request body:
 *
 *  - http.response.pathsend, advertised in every scope: the message names
 *    a file that is the whole body. It is opened here (the app's error if
 *    it cannot be: its head has not gone out, so the error rule answers
 *    500), its size is the Content-Length when the app gave none, and it
 *    goes out by sendfile(2) from the loop: what the kernel takes now,
 *    the rest on the connection's POLLOUT turns (asgi_file_resume), the
 *    app's send() waiting meanwhile. The connection owes it (out_more):
 *    POLLOUT is wanted, the send timer cuts a client that takes nothing
 *    for body_timeout, a close waits for it. The fd is the call's and is
 *    closed on every path: sent (asgi_file_close in file_done or
 *    asgi_detach), the connection closed under it (asgi_drop), the call
 *    freed (its dealloc).
 *  - http.response.trailers, advertised only when the client said TE:
 *    trailers (RFC 9110 10.1.4) on HTTP/1.1: a start with trailers: True
 *    gets a chunked body (an app's Content-Length then is refused: it
 *    could not carry them), the body's last message writes the last chunk
 *    and the trailers messages (more_trailers) the trailer section, each
 *    field checked as a head's and refused where a trailer must not carry
 *    it (h1_head_asgi.c h1_trailer_block). Out of order or not advertised: the
 *    app's error.
 *  - body_timeout for a body the app streams with receive(): the codec's
 *    body timer (h1_body_wait) runs while a receive waits for body bytes;
 *    late, the client gets the engine's body_timeout refusal (a 408, or
 *    the close once the app started its response) and the receive
 *    http.disconnect; a receive the app abandoned (cancelled) is no
 *    longer the client's time. A body the client gets wrong (a bad chunk,
 *    past limit_request_body) is refused the same way, with the parser's
 *    400 / 413 (or the close once the head went out).
 *
 * May call: asgi_scope.c (messages), asgi_end.c (the end), the codec
 * (h1_response.c's framing, h1_head_asgi.c's trailer fields, h1_conn.c's body
 * timer and refusal), the connection layer (conn_io.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/stat.h>

#include "asgi.h"

/* Bytes of a file one turn sends at most: a client reading as fast as
 * the kernel sends (loopback) must not keep the loop thread from the
 * other connections for a whole large file; level-triggered, its POLLOUT
 * comes again on the next turn. */
#define FILE_TURN_MAX (4u << 20)

static PyObject *K_EXTENSIONS, *K_PATHSEND, *K_TRAILERS, *K_TRAILERS_FLAG, *K_PATH, *K_HEADERS,
                *K_MORE_TRAILERS;

int asgi_ext_make(void)
{
	struct { PyObject **at; const char *s; } keys[] = {
		{&K_EXTENSIONS, "extensions"}, {&K_PATHSEND, "http.response.pathsend"},
		{&K_TRAILERS, "http.response.trailers"}, {&K_TRAILERS_FLAG, "trailers"},
		{&K_PATH, "path"}, {&K_HEADERS, "headers"}, {&K_MORE_TRAILERS, "more_trailers"},
	};

	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (!(*keys[i].at = PyUnicode_InternFromString(keys[i].s)))
			return -1;
	return 0;
}

/* ---- the scope's extensions ------------------------------------------------------------------ */

/* Whether the TE fields of c's head (all of them, a comma-separated
 * list each) name the "trailers" t-coding (RFC 9110 10.1.4), on HTTP/1.1:
 * an HTTP/1.0 body is never chunked, so it cannot carry them. */
static int te_trailers(struct conn *c)
{
	struct hp_parser *hp = c->parser->hp;

	if (hp->ll.http_major != 1 || hp->ll.http_minor != 1)
		return 0;
	return hp_has_token(hp, "te", "trailers");
}

static int set_new(PyObject *d, PyObject *key, PyObject *v)
{
	int rc = v ? PyDict_SetItem(d, key, v) : -1;

	Py_XDECREF(v);
	return rc;
}

int asgi_ext_scope(struct conn *c, PyObject *scope)
{
	/* each request its own dicts (an app that writes to them must not
	 * reach the next request); added to the extensions the scope has
	 * already (the connection layer's "proxy": asgi_scope.c) */
	PyObject *ext = PyDict_GetItemWithError(scope, K_EXTENSIONS);     /* borrowed */
	int rc = -1;

	if (ext)
		Py_INCREF(ext);
	else if (!PyErr_Occurred())
		ext = PyDict_New();
	if (ext && set_new(ext, K_PATHSEND, PyDict_New()) == 0 &&
	    (!te_trailers(c) || set_new(ext, K_TRAILERS, PyDict_New()) == 0))
		rc = PyDict_SetItem(scope, K_EXTENSIONS, ext);
	Py_XDECREF(ext);
	return rc;
}

void asgi_ext_call(AsgiCall *call)
{
	PyObject *ext = PyDict_GetItemWithError(call->scope, K_EXTENSIONS);     /* borrowed */

	call->file_fd = -1;
	call->trailers_ok = ext && PyDict_Check(ext) && PyDict_GetItemWithError(ext, K_TRAILERS);
	PyErr_Clear();                             /* a lookup's error: not advertised */
}

/* ---- trailers -------------------------------------------------------------------------------- */

int asgi_ext_start(AsgiCall *call, PyObject *msg, long long length)
{
	PyObject *flag = PyDict_GetItemWithError(msg, K_TRAILERS_FLAG);          /* borrowed */
	int want = flag ? PyObject_IsTrue(flag) : 0;

	if (want < 0 || (!flag && PyErr_Occurred()))
		return -1;
	if (want && !call->trailers_ok) {
		PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R): trailers: True, but the client did "
		             "not send TE: trailers (http.response.trailers is not in "
		             "scope['extensions'])", msg);
		return -1;
	}
	if (want && length >= 0) {
		PyErr_Format(PyExc_ValueError, "ASGI send(%.200R): trailers: True with a Content-Length "
		             "(trailers need a chunked body)", msg);
		return -1;
	}
	call->trailers = (unsigned)want;
	return 0;
}

int asgi_ext_body_end(AsgiCall *call)
{
	struct conn *c = call->conn;

	call->body_end = 1;
	if (h1_end_chunks(c, &call->f) < 0)
		return -1;
	return conn_flush(c);                     /* the body's end is the client's now */
}

int asgi_trailers(AsgiCall *call, PyObject *msg)
{
	struct conn *c = call->conn;
	PyObject *headers, *more_obj, *block;
	int more, rc;

	if (!call->trailers) {
		PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R): http.response.trailers without "
		             "trailers: True in http.response.start", msg);
		return -1;
	}
	if (!call->body_end) {
		PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R): http.response.trailers before the "
		             "body ended (more_body)", msg);
		return -1;
	}
	/* headers held, not borrowed: the lookup of more_trailers (a key's
	 * __eq__) and its __bool__ run the app's code, which may empty the
	 * message; a borrowed list was then read after its free, its bytes
	 * other objects' on the wire (issue 35, point 2) */
	headers = PyDict_GetItemWithError(msg, K_HEADERS);
	if (!headers && PyErr_Occurred())
		return -1;
	Py_XINCREF(headers);
	more_obj = PyDict_GetItemWithError(msg, K_MORE_TRAILERS);
	Py_XINCREF(more_obj);
	more = more_obj ? PyObject_IsTrue(more_obj) : PyErr_Occurred() ? -1 : 0;
	Py_XDECREF(more_obj);
	rc = more < 0 ? -1 : h1_trailer_block(headers ? headers : Py_None, &block);
	Py_XDECREF(headers);
	if (rc < 0)
		return -1;
	rc = h1_trailers(c, &call->f, block, !more);
	Py_DECREF(block);
	if (rc < 0)
		return -1;
	if (!more)
		asgi_end(call, call->f.keep);          /* the response is whole: what is owed goes */
	else
		conn_flush(c);
	return 0;
}

/* ---- pathsend -------------------------------------------------------------------------------- */

/* Sends what the kernel takes of the output, then of the file, at most
 * FILE_TURN_MAX of it. 0: all of it went out; RESPOND_PARKED: the kernel
 * is full (or the turn's share went): the rest on a POLLOUT; -1 with
 * ClientDisconnected: the connection closed (its close dropped the call:
 * the file is closed). A file that shrank under us ends the body short:
 * the connection closes after it, at once if its chunk cannot end. */
static int push(AsgiCall *call)
{
	struct conn *c = call->conn;
	size_t turn = FILE_TURN_MAX;
	int rc = 0;

	/* owed before the flush: the one that empties the buffer arms the
	 * send timer for the file still to go (h1_rearm) */
	c->out_more = call->file_left > 0;
	while (!c->closed) {
		ssize_t n;

		if (conn_pending(c)) {
			conn_flush(c);                    /* the head first, in order */
			if (c->closed)
				break;
			if (conn_pending(c)) {
				rc = RESPOND_PARKED;
				break;
			}
		}
		if (!call->file_left)
			break;
		if (!turn) {
			rc = RESPOND_PARKED;
			break;
		}
		n = conn_sendfile(c, call->file_fd, &call->file_off,
		             call->file_left < turn ? (size_t)call->file_left : turn);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN) {
				rc = RESPOND_PARKED;
				break;
			}
			conn_fail(c);                     /* reset, EPIPE: the client is gone */
			break;
		}
		if (n == 0) {
			/* the file shrank: fewer bytes than announced */
			call->f.keep = 0;
			call->file_left = 0;
			if (call->f.chunked)
				conn_fail(c);                 /* a chunk cut short cannot end */
			break;
		}
		c->wrote += (unsigned long long)n;
		if (c->srv->draining)
			c->last_active = mono_now();   /* the drain's idle grace: conn_io.c */
		call->f.sent += (unsigned long long)n;
		call->file_left -= (unsigned long long)n;
		turn -= (size_t)n;
	}
	if (c->closed || !call->conn) {
		PyErr_SetString(ClientDisconnected, "the client went away");
		return -1;
	}
	c->out_more = call->file_left > 0;
	/* the send timer: armed by the flush that emptied the buffer (owed:
	 * out_more), re-armed on progress by the codec's resume (c->wrote) */
	conn_sync(c);
	return rc;
}

/* The file is out: closed, its chunk ended; then the body's end: 1 the
 * response is whole (the caller ends the call), 0 trailers are awaited,
 * -1 with an error. */
static int file_done(AsgiCall *call)
{
	struct conn *c = call->conn;

	asgi_file_close(call);
	if (h1_span_end(c, &call->f, call->file_span) < 0)
		return -1;
	if (call->trailers)
		return asgi_ext_body_end(call) < 0 ? -1 : 0;
	return h1_end_body(c, &call->f) < 0 ? -1 : 1;
}

/* The file of msg["path"] opened for sending: its fd and size, or -1
 * with the app's error (a path not a str, or one that cannot be sent: the
 * OSError of open(2), a directory, not a regular file). */
static int open_file(PyObject *msg, struct stat *st)
{
	PyObject *path = PyDict_GetItemWithError(msg, K_PATH), *fs;           /* borrowed */
	int fd;

	if (!path || !PyUnicode_Check(path)) {
		if (!PyErr_Occurred())
			PyErr_Format(PyExc_TypeError, "ASGI send(%.200R): http.response.pathsend's path "
			             "must be a str", msg);
		return -1;
	}
	fs = PyUnicode_EncodeFSDefault(path);
	if (!fs)
		return -1;
	if (strlen(PyBytes_AS_STRING(fs)) != (size_t)PyBytes_GET_SIZE(fs)) {
		PyErr_Format(PyExc_ValueError, "ASGI send(%.200R): http.response.pathsend's path has a "
		             "NUL byte", msg);
		Py_DECREF(fs);
		return -1;
	}
	/* O_NONBLOCK: a FIFO named there must not hold the loop in open() */
	fd = open(PyBytes_AS_STRING(fs), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	Py_DECREF(fs);
	if (fd >= 0) {
		int err = fstat(fd, st) < 0 ? errno
		          : S_ISREG(st->st_mode) ? 0
		          : S_ISDIR(st->st_mode) ? EISDIR : EINVAL;    /* a device, a FIFO, a socket */

		if (!err)
			return fd;
		close(fd);
		errno = err;
	}
	PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
	return -1;
}

int asgi_pathsend(AsgiCall *call, PyObject *msg)
{
	struct conn *c = call->conn;
	struct stat st;
	long long span;
	int fd, rc;

	if (!call->started || call->head_sent) {
		PyErr_Format(PyExc_RuntimeError, "ASGI send(%.200R): http.response.pathsend %s", msg,
		             call->started ? "after http.response.body (the file is the whole body)"
		                           : "before http.response.start");
		return -1;
	}
	fd = open_file(msg, &st);
	if (fd < 0)
		return -1;
	/* the head: the file's size is the body's length (unless trailers
	 * follow: chunked) */
	if (h1_head(c, &call->f, call->trailers ? -1 : (long long)st.st_size) < 0) {
		close(fd);
		return -1;
	}
	call->head_sent = 1;
	span = h1_span_begin(c, &call->f, (unsigned long long)st.st_size);
	if (span <= 0)
		close(fd);                             /* HEAD, 204, 304, empty: nothing to read */
	if (span < 0)
		return -1;
	if (span > 0) {
		call->file_fd = fd;
		call->file_off = 0;
		call->file_left = call->file_span = (unsigned long long)span;
		rc = push(call);
		if (rc)
			return rc < 0 ? -1 : 1;            /* the rest from the loop: the send waits */
	}
	/* no file to wait for: the body ends as a body message's does (the
	 * head goes out with what is owed: asgi_end) */
	rc = file_done(call);
	if (rc > 0)
		asgi_end(call, call->f.keep);
	return rc < 0 ? -1 : 0;
}

int asgi_file_resume(AsgiCall *call)
{
	struct conn *c;
	int rc, keep;

	if (call->file_fd < 0 || !call->conn)
		return RESPOND_PARKED;                 /* no file of ours is going out */
	rc = push(call);
	if (rc) {
		if (rc < 0)
			PyErr_Clear();                     /* closed: its drop told the app */
		return RESPOND_PARKED;
	}
	rc = file_done(call);
	if (rc < 0)
		return -1;
	asgi_resolve(&call->tx, Py_None, NULL);    /* the app's send is done */
	if (rc == 0)
		return RESPOND_PARKED;                 /* its trailers to come */
	/* whole: ended here; the codec's resume goes on with the connection
	 * (asgi_end's h1_call_done would find it inside a resume) */
	keep = call->f.keep;
	c = asgi_detach(call);
	Py_XDECREF(c);                             /* the caller holds c */
	return keep ? RESPOND_KEEP : RESPOND_CLOSE;
}

/* ---- a streamed body that went wrong: late, or the client's error ---------------------------- */

/* The call's body will not come (late: the body timer; else the client's
 * error, the parser's HP_ERROR): the client is answered (a 408, or the
 * parser's 413 / 400) if nothing of the response went out, else the
 * connection closes; the refusal is counted and logged either way. The
 * app's receive reads http.disconnect, and what the app does after it is
 * not its fault (gone: its return without a response is not logged, a
 * send() is refused with ClientDisconnected). */
static void body_failed(AsgiCall *call, int late)
{
	struct conn *c = call->conn;
	PyObject *msg;
	int answer;

	call->gone = 1;
	/* the client's error is said whenever it still can be; a 408 never
	 * stands in for a response the app started, even one whose head is
	 * still held (issue 35, point 11): the connection closes instead */
	answer = late ? !call->started : !call->head_sent;
	if (answer)
		call->counted = 1;                     /* the refusal counts it */
	else
		asgi_account(call);                    /* the response, as far as it went */
	if (call->rx && (msg = asgi_disconnect())) {
		asgi_resolve(&call->rx, msg, NULL);
		Py_DECREF(msg);
	}
	Py_INCREF(c);                              /* a close drops the call's */
	if (late)
		h1_body_late(c, answer);
	else
		h1_body_refuse(c, answer);
	Py_DECREF(c);
}

void asgi_body_error(AsgiCall *call)
{
	if (call->conn && !call->gone && !call->ended)
		body_failed(call, 0);
}

void asgi_body_late(AsgiCall *call)
{
	struct conn *c = call->conn;

	if (!c)
		return;
	c->parser->body_late = 0;
	if (call->gone || call->ended)
		return;
	/* No receive waits: the app abandoned it (wait_for's timeout cancels
	 * the future) and went on, to answer without the body, or to come
	 * back for it later. Its time now, not the client's: its answer is
	 * not replaced by a 408 (issue 35, point 11). The timer is off until
	 * a receive waits again (h1_timeout cleared body_wait); the deadline
	 * stays the body's total, so that receive is told at once if the
	 * client still owes past it. An unread body closes the connection
	 * after the response (parser_finish). */
	if (!asgi_waiting(&call->rx))
		return;
	body_failed(call, 1);
}
