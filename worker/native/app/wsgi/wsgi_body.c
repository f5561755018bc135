/* The body the WSGI app returned, sent: a list or tuple of bytes (a
 * Content-Length, one write; past HIGH_WATER its tail sent by writev
 * straight from its objects), any other iterable (block by block, a
 * whole one held for a Content-Length), a FileWrapper of a regular file
 * (sendfile). Pending output past HIGH_WATER makes the app's write() wait
 * (bounded by body_timeout) for the client to read; a body the app
 * returned goes out from the loop instead (parked on its connection, see
 * below): a client that does not read never costs more than a bounded
 * buffer, nor holds a loop thread.
 *
 * May call: wsgi_respond.c, the codec (h1_response.c), the connection
 * layer (conn_io.c: its output, writev and sendfile on its fd).
 */
#include <errno.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/uio.h>

#include "wsgi.h"

/* ---- running the app -------------------------------------------------------------------------- */

/* A body past HIGH_WATER never waits for its client on the loop thread
 * (issue 21: a client that did not read a 10 MB answer held the thread,
 * and every other connection of it, for body_timeout): the connection
 * keeps it (c->parked) and the loop sends the rest on its POLLOUT events,
 * whichever loop thread handles them, before serving its next request.
 * A list of bytes stays in the app's objects (the tail, sent by writev
 * straight from them); an iterator is resumed when the output drains below
 * LOW_WATER, so a connection holds at most HIGH_WATER plus one block. */

#define TAIL_IOV 64
#define TLS_STAGE (256u << 10)

/* The tail went out up to the announced length: bytes past it are cut
 * (keep-alive ends), the tail is dropped. 0. */
static int tail_end(Respond *r)
{
	PyObject *t = r->tail;

	for (Py_ssize_t i = r->tail_i; i < PyTuple_GET_SIZE(t); i++)
		if ((size_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(t, i)) > (i == r->tail_i ? r->tail_off : 0)) {
			r->f.keep = 0;                     /* past the app's Content-Length: cut */
			break;
		}
	Py_CLEAR(r->tail);
	return 0;
}

/* push_tail under TLS: the tail is copied into the output, TLS_STAGE
 * ahead at most, where every TLS write is made (conn_tls.c says why).
 * The same results as push_tail's. */
static int push_tail_tls(Respond *r)
{
	struct conn *c = r->conn;
	PyObject *t = r->tail;
	Py_ssize_t n = PyTuple_GET_SIZE(t);

	while (r->tail_i < n && r->f.sent < (unsigned long long)r->f.length) {
		PyObject *b = PyTuple_GET_ITEM(t, r->tail_i);
		size_t len = (size_t)PyBytes_GET_SIZE(b) - r->tail_off;
		unsigned long long room = (unsigned long long)r->f.length - r->f.sent;
		size_t pending = conn_pending(c);

		if (c->closed) {
			PyErr_SetString(ClientGone, "the client went away");
			return -1;
		}
		if (pending >= TLS_STAGE) {
			unsigned long long before = c->wrote;

			conn_flush(c);
			if (!c->closed && c->wrote == before)
				return RESPOND_PARKED;        /* the kernel is full: its POLLOUT resumes */
			continue;
		}
		if (len > TLS_STAGE - pending)
			len = TLS_STAGE - pending;
		if (len > room)
			len = (size_t)room;
		if (len && conn_send(c, PyBytes_AS_STRING(b) + r->tail_off, len, 0) < 0)
			return -1;
		r->f.sent += len;
		r->tail_off += len;
		if (r->tail_off == (size_t)PyBytes_GET_SIZE(b)) {
			r->tail_i++;
			r->tail_off = 0;
		}
	}
	conn_flush(c);
	if (c->closed) {
		PyErr_SetString(ClientGone, "the client went away");
		return -1;
	}
	return tail_end(r);
}

/* Sends what the kernel takes of the pending output and the tail after
 * it, in order. 0 when all of it went out (or the announced length was
 * reached: the rest is cut and the connection closes), RESPOND_PARKED
 * when the kernel is full, -1 with ClientGone (closed: reset, EPIPE). */
int push_tail(Respond *r)
{
	struct conn *c = r->conn;
	PyObject *t = r->tail;
	Py_ssize_t n = PyTuple_GET_SIZE(t);

	if (c->ssl)
		return push_tail_tls(r);
	for (;;) {
		struct iovec iov[TAIL_IOV];
		int k = 0;
		size_t out = conn_pending(c), asked = out, took, body;
		/* emit_head set a length: the list's total, or the app's own */
		unsigned long long room = r->f.sent < (unsigned long long)r->f.length
		                          ? (unsigned long long)r->f.length - r->f.sent : 0;
		ssize_t w;

		if (c->closed) {
			PyErr_SetString(ClientGone, "the client went away");
			return -1;
		}
		if (out) {
			iov[k].iov_base = c->out + c->ostart;
			iov[k++].iov_len = out;
		}
		for (Py_ssize_t i = r->tail_i; i < n && k < TAIL_IOV && room; i++) {
			PyObject *b = PyTuple_GET_ITEM(t, i);
			size_t off = i == r->tail_i ? r->tail_off : 0;
			size_t len = (size_t)PyBytes_GET_SIZE(b) - off;

			if (len > room)
				len = (size_t)room;
			if (!len)
				continue;
			iov[k].iov_base = PyBytes_AS_STRING(b) + off;
			iov[k++].iov_len = len;
			room -= len;
			asked += len;
		}
		if (!k)
			break;
		w = writev(c->fd, iov, k);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return RESPOND_PARKED;
			conn_fail(c);
			PyErr_SetString(ClientGone, "the client went away");
			return -1;
		}
		c->wrote += (unsigned long long)w;
		if (c->srv->draining)
			c->last_active = mono_now();   /* the drain's idle grace: conn_io.c */
		took = (size_t)w < out ? (size_t)w : out;
		if (took)
			conn_taken(c, took);
		body = (size_t)w - took;
		r->f.sent += body;
		while (body) {
			size_t left = (size_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(t, r->tail_i)) - r->tail_off;

			if (body < left) {
				r->tail_off += body;
				body = 0;
			}
			else {
				body -= left;
				r->tail_i++;
				r->tail_off = 0;
			}
		}
		if ((size_t)w < asked)
			return RESPOND_PARKED;            /* the kernel is full: its POLLOUT resumes */
	}
	return tail_end(r);
}

size_t respond_owed(const Respond *r)
{
	size_t owed = r->file_fd >= 0 ? (size_t)r->file_left : 0;

	if (r->tail)
		for (Py_ssize_t i = r->tail_i; i < PyTuple_GET_SIZE(r->tail); i++)
			owed += (size_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(r->tail, i)) -
			        (i == r->tail_i ? r->tail_off : 0);
	return owed ? owed : 1;
}

/* A list or tuple of bytes, nothing given yet: its length is known, so
 * it gets a Content-Length, and goes out without holding a chunk; past
 * HIGH_WATER (can_park), as the tail. 0, RESPOND_PARKED or -1. */
int body_sequence(Respond *r, PyObject *seq, int can_park)
{
	struct conn *c = r->conn;
	Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
	PyObject **items = PySequence_Fast_ITEMS(seq);
	long long total = 0;

	if (!r->status || r->headers_sent || r->first)
		goto one_by_one;
	for (Py_ssize_t i = 0; i < n; i++) {
		if (!PyBytes_CheckExact(items[i]))
			goto one_by_one;
		total += PyBytes_GET_SIZE(items[i]);
	}
	if (total)
		r->started = 1;
	r->headers_sent = 1;
	if (h1_head(r->conn, &r->f, total) < 0)
		return -1;
	if (can_park && total && !r->f.head_only && !r->f.bodiless &&
	    conn_pending(c) + (unsigned long long)total > HIGH_WATER) {
		/* a tuple of the same objects (no byte copied): the app's other
		 * threads may change its list while the loop sends it */
		r->tail = PySequence_Tuple(seq);
		if (!r->tail)
			return -1;
		return push_tail(r);
	}
	/* each item held while it is sent: a blocked writer lets the GIL go,
	 * and the app's other threads could change its list meanwhile */
	for (Py_ssize_t i = 0; i < n && i < PySequence_Fast_GET_SIZE(seq); i++) {
		PyObject *item = Py_NewRef(PySequence_Fast_ITEMS(seq)[i]);
		int rc = PyBytes_Check(item)
		         ? h1_send_body(r->conn, &r->f, PyBytes_AS_STRING(item), (size_t)PyBytes_GET_SIZE(item), 0,
		                     !can_park)
		         : 0;
		Py_DECREF(item);
		if (rc < 0)
			return -1;
	}
	return 0;
one_by_one:
	/* all here: each block is held for one write, not flushed one by one */
	r->all_here = 1;
	r->it = PyObject_GetIter(seq);
	return r->it ? iterate(r, can_park) : -1;
}

/* The body's iterator, block by block, from where it is (a parked one's
 * resumption too). can_park: before taking a block, output past
 * HIGH_WATER parks it (RESPOND_PARKED); else a block past it waits for
 * the client (send_body). 0 when exhausted, -1 on error (the app's
 * included: next() is its code). */
int iterate(Respond *r, int can_park)
{
	struct conn *c = r->conn;
	PyObject *item;

	for (;;) {
		int rc = 0, whole = 0;

		if (can_park && conn_pending(c) > HIGH_WATER)
			return RESPOND_PARKED;
		if (!(item = PyIter_Next(r->it)))
			break;
		if (r->all_here) {
			if (!PyBytes_Check(item) || PyBytes_GET_SIZE(item))
				rc = write_chunk(r, item, 0, 1, !can_park);
			Py_DECREF(item);
			if (rc < 0)
				return -1;
			continue;
		}
		if (!r->headers_sent && !r->first) {
			Py_ssize_t left = r->items == 1 ? 0 : PyObject_LengthHint(r->it, -1);

			if (left < 0 && PyErr_Occurred())
				rc = -1;
			whole = left == 0;
		}
		if (rc == 0 && (!PyBytes_Check(item) || PyBytes_GET_SIZE(item)))
			rc = write_chunk(r, item, !whole, whole, !can_park);
		Py_DECREF(item);
		if (rc < 0)
			return -1;
	}
	if (PyErr_Occurred())
		return -1;
	Py_CLEAR(r->it);
	return 0;
}

/* Any other iterable: each block goes out as the app gives it, but for a
 * body given whole: an iterable of one item (its len()), or an iterator
 * that says it is exhausted after its first block (a list's, Django's
 * response): that block is held for a Content-Length and one write. The
 * hints are the app's code: an exception there is the app's. */
int body_iterable(Respond *r, PyObject *result, int can_park)
{
	r->items = PyObject_LengthHint(result, -1);
	if (r->items < 0 && PyErr_Occurred())
		return -1;
	r->it = PyObject_GetIter(result);
	return r->it ? iterate(r, can_park) : -1;
}

/* Sends what the kernel takes of the pending output, then of the file
 * span, by sendfile(2). 0 when all of it went out (a file that shrank
 * under us ends it short: the connection closes), RESPOND_PARKED when the
 * kernel is full, -1 with ClientGone (closed). */
int push_file(Respond *r)
{
	struct conn *c = r->conn;

	for (;;) {
		ssize_t n;

		if (c->closed) {
			PyErr_SetString(ClientGone, "the client went away");
			return -1;
		}
		if (conn_pending(c)) {
			conn_flush(c);                      /* the head first, in order */
			if (c->closed)
				continue;
			if (conn_pending(c))
				return RESPOND_PARKED;
		}
		if (!r->file_left)
			break;
		n = conn_sendfile(c, r->file_fd, &r->file_off,
		             r->file_left > (1u << 30) ? (size_t)1 << 30 : (size_t)r->file_left);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return RESPOND_PARKED;
			conn_fail(c);
			continue;
		}
		if (n == 0) {
			r->f.keep = 0;                         /* the file shrank: fewer bytes than announced */
			break;
		}
		c->wrote += (unsigned long long)n;
		if (c->srv->draining)
			c->last_active = mono_now();   /* the drain's idle grace: conn_io.c */
		r->f.sent += (unsigned long long)n;
		r->file_left -= (unsigned long long)n;
	}
	r->file_fd = -1;                             /* the app's: closed by its close() */
	return 0;
}

/* The app returned a FileWrapper of a regular file: sendfile. can_park:
 * wsgi.py's sendfile_response sends the head and says which span of the
 * file goes out; the loop sends it (push_file), parked while the client
 * does not read (the FileWrapper, kept as the result, holds the file
 * open). Else sendfile_response sends it all, waiting for the socket as
 * it needs. 1 if it did, RESPOND_PARKED, 0 if the result is to be
 * iterated, -1 on error. */
int body_file(Respond *r, PyObject *result, int can_park)
{
	Server *s = r->conn->srv;
	PyObject *fd, *done;
	long ffd;
	long long off;
	unsigned long long count;
	int rc;

	if (!s->file_wrapper || !PyObject_TypeCheck(result, (PyTypeObject *)s->file_wrapper) ||
	    r->first || r->headers_sent)
		return 0;
	/* the slow path's sendfile writes to the fd itself: under TLS the
	 * wrapper is iterated instead (its blocks encrypted as any body) */
	if (r->conn->ssl && !can_park)
		return 0;
	fd = PyObject_CallMethod(result, "regular_fd", NULL);
	if (!fd)
		return -1;
	ffd = PyLong_AsLong(fd);
	Py_DECREF(fd);
	if (ffd == -1 && PyErr_Occurred())
		return -1;
	if (ffd < 0)
		return 0;
	done = PyObject_CallFunction(s->sendfile, "OOOlO", r->conn, r, result, ffd,
	                             can_park ? Py_True : Py_False);
	if (!done)
		return -1;
	if (done == Py_None) {
		Py_DECREF(done);
		return 1;
	}
	if (!PyArg_ParseTuple(done, "LK", &off, &count)) {
		Py_DECREF(done);
		return -1;
	}
	Py_DECREF(done);
	r->file_fd = (int)ffd;
	r->file_off = (off_t)off;
	r->file_left = count;
	rc = push_file(r);
	return rc == 0 ? 1 : rc;
}


size_t wsgi_owed(struct conn *c)
{
	return respond_owed(c->parked);
}
