/* Taking connections into the engine: accept (a listener's batch, taken
 * and registered in one C call), take (one accepted elsewhere: a draining
 * worker emptying a deleted listener's queue), and serve_accepted (what a
 * shared connection's first read brought, dispatch.c). Each connection is
 * registered in the table owned by the accepting loop thread, reading,
 * with its header timer, before any other thread can see it.
 *
 * Apart from the turn (engine.c): a connection is accepted once, served
 * many times; neither file calls the other (both bind through as_thread,
 * engine.h). Their methods join the Server type in httpmodule.c.
 *
 * Connection layer, beside engine.c. May call: dispatch.c, conn_type.c,
 * conn_io.c, conn_timers.c, fdcore; above only through struct conn_ops
 * (read_first: a shared connection's first read).
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine.h"

/* A number the kernel just gave us (accept) that the table still has: a
 * disowned entry can only be an app's asyncio registration (worker/aio.py)
 * of an fd the app closed while registered (issue 35 point 3). The kernel
 * hands out only free numbers, so that entry is stale: it is forgotten (a
 * disowned entry is never close()d by the table) and the connection taken;
 * before, every connection given that number was closed unanswered for the
 * worker's life. The app's selector key of it acts on nothing any more
 * (app_fd: its cookie is no longer the number's owner). 1 forgotten. */
static int forget_stale_app_fd(Server *s, struct srv_thread *t, int fd)
{
	struct fdc_fdinfo info;

	if (s->api.dump(s->table, fd, &info) < 0 || !(info.state & FDC_DISOWN))
		return 0;
	return s->api.delete(t->th, fd) == 1;
}

/* One accepted connection into the table and the engine, owned by loop
 * thread pos, reading, with its header timer. 1 taken (2: a shared one
 * whose first read brought something: serve_first it), 0 dropped (closed:
 * beyond the table, or refused by it), -1 with a Python error (closed; not
 * for ValueError: the number is a live connection's, left alone). */
static int take_fd(Server *s, struct srv_thread *t, int pos, int fd)
{
	int one = 1, first = 0;
	uint64_t cookie = s->next_cookie++;
	struct conn *c;
	PyObject *key;

	/* not for a unix socket: EOPNOTSUPP, harmless */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (fd < s->maxfd && s->conns[fd]) {
		/* a live connection's number (a caller's mistake): never closed here */
		PyErr_Format(PyExc_ValueError, "fd %d is a live connection of this engine", fd);
		return -1;
	}
	if (fd >= s->maxfd) {
		close(fd);                              /* beyond the table: nothing else to do */
		return 0;
	}
	if (s->dispatch) {
		/* shared by the group: its siblings' pollers may report it the
		 * instant it is registered, so the connection is made first,
		 * and no Python runs (no GIL hand-off) from the registration to
		 * its entry in conns */
		c = conn_new(s, pos, fd, cookie);
		if (!c) {
			close(fd);
			return -1;
		}
		first = s->ops->read_first(c);
		if (first < 0 || c->closed) {
			c->closed = 1;
			Py_DECREF(c);
			close(fd);
			return first < 0 ? -1 : 0;
		}
		/* what that read brought is this thread's to serve first
		 * (serve_first): a sibling that a report of the same socket
		 * wakes meanwhile (the end of input after it, more bytes) only
		 * records it, else it read the EOF and closed the connection
		 * with the first request unserved (a fuzz run's dropped request) */
		if (first)
			c->inside = pos;
		int rc = s->api.insert_shared(t->th, fd, cookie, s->kind_conn, t->group_mask);

		if (rc == -EEXIST && forget_stale_app_fd(s, t, fd))
			rc = s->api.insert_shared(t->th, fd, cookie, s->kind_conn, t->group_mask);
		if (rc < 0) {
			c->closed = 1;
			Py_DECREF(c);
			close(fd);
			return 0;
		}
	}
	else {
		int rc = s->api.insert(s->table, fd, cookie, s->kind_conn, t->tgid, t->bit,
		                       FDC_ACCEPTED);

		if (rc == -EEXIST && forget_stale_app_fd(s, t, fd))
			rc = s->api.insert(s->table, fd, cookie, s->kind_conn, t->tgid, t->bit,
			                   FDC_ACCEPTED);
		if (rc < 0) {
			close(fd);
			return 0;
		}
		c = conn_new(s, pos, fd, cookie);
		if (!c) {
			s->api.delete(t->th, fd);
			return -1;
		}
	}
	/* the header timer and reading, before any other thread can see it */
	c->head_clock = 1;
	timer_arm(c, TIMER_HEADER);
	c->recv_on = 1;
	if (!s->dispatch)
		s->api.want_recv(t->th, fd);
	s->conns[fd] = c;                            /* the array's reference */
	s->count++;
	key = PyLong_FromLong(fd);
	if (!key || PyDict_SetItem(s->conns_dict, key, (PyObject *)c) < 0) {
		Py_XDECREF(key);
		conn_close_now(c);
		return -1;
	}
	Py_DECREF(key);
	return first ? 2 : 1;
}

/* A shared connection take_fd answered 2 for: what its first read brought
 * is served now, as a report (dispatch.c), under the fd's running bit. */
static int serve_first(Server *s, struct srv_thread *t, int pos, int fd)
{
	struct conn *c = fd < s->maxfd ? s->conns[fd] : NULL;
	uint32_t gen;

	if (!c || c->inside != pos)
		return 0;
	c->inside = -1;                 /* held since take_fd: dispatch_run's now */
	if (c->closed || s->api.enter(t->th, fd, &gen) != FDC_DONE)
		return 0;
	Py_INCREF(c);
	if (dispatch_run(c, pos, EV_FIRST, -1) < 0)
		contain(c);
	s->api.leave(t->th, fd, gen);
	Py_DECREF(c);
	return 0;
}

PyDoc_STRVAR(take_doc,
"take(pos, fd, plain=False) -> bool\n\n"
"A connection accepted elsewhere (a draining worker emptying a deleted\n"
"listener's queue) into the engine, owned by loop thread pos: as accept()\n"
"does for each of its batch. False if it was dropped (closed). plain: from\n"
"a listener that does not serve TLS (see accept).");

static PyObject *Server_take(Server *s, PyObject *args)
{
	int pos, fd, rc, plain = 0;
	struct srv_thread *t;

	if (!PyArg_ParseTuple(args, "ii|p:take", &pos, &fd, &plain) || !(t = as_thread(s, pos)))
		return NULL;
	/* accepted elsewhere, maybe blocking: the engine's reads must never
	 * wait (a shared connection's first read would hold the GIL until its
	 * client sent: a whole worker stopped, found by a full test run) */
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0 && !(fl & O_NONBLOCK))
		fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	t->plain = plain;
	rc = take_fd(s, t, pos, fd);
	t->plain = 0;
	if (rc < 0 || (rc == 2 && serve_first(s, t, pos, fd) < 0))
		return NULL;                            /* (no listener to finish with first) */
	return PyBool_FromLong(rc);
}

PyDoc_STRVAR(accept_doc,
"accept(pos, lfd, max, plain=False) -> count\n\n"
"Accepts up to max connections on listener lfd (held by loop thread pos),\n"
"and registers each one in the table, owned by that thread, reading, with\n"
"its header timer: one call for the whole batch. Raises OSError if the\n"
"first accept failed (EMFILE ...: the loop pauses accepting). plain: lfd\n"
"does not serve TLS although set_tls was called (TLS per bind: its\n"
"connections get no session).");

static PyObject *Server_accept(Server *s, PyObject *args)
{
	int pos, lfd, max, n, ok = 0, plain = 0, fds[FDC_EVBATCH];
	struct srv_thread *t;

	if (!PyArg_ParseTuple(args, "iii|p:accept", &pos, &lfd, &max, &plain) ||
	    !(t = as_thread(s, pos)))
		return NULL;
	if (max > FDC_EVBATCH - t->nfirst)
		max = FDC_EVBATCH - t->nfirst;      /* room for each first read to serve */
	n = max > 0 ? s->api.accept(t->th, lfd, fds, max) : 0;
	if (n < 0) {
		errno = -n;
		return PyErr_SetFromErrno(PyExc_OSError);
	}
	for (int i = 0; i < n; i++) {
		int rc;

		t->plain = plain;                       /* read by tls_open (conn_new) */
		rc = take_fd(s, t, pos, fds[i]);
		t->plain = 0;
		if (rc < 0) {
			for (int k = i + 1; k < n; k++)
				close(fds[k]);
			return NULL;
		}
		ok += rc > 0;
		if (rc == 2 && t->nfirst < FDC_EVBATCH)
			t->first[t->nfirst++] = fds[i];
	}
	return PyLong_FromLong(ok);
}

PyDoc_STRVAR(serve_accepted_doc,
"serve_accepted(pos): serves what the first reads of loop thread pos's\n"
"last accept() brought (shared connections, dispatch: each was read once\n"
"before its siblings' pollers held it). The Python loop calls it once it\n"
"has done with the listener (requeue, gate), since the app runs in here.");

static PyObject *Server_serve_accepted(Server *s, PyObject *arg)
{
	long pos = PyLong_AsLong(arg);
	struct srv_thread *t;

	if ((pos == -1 && PyErr_Occurred()) || !(t = as_thread(s, (int)pos)))
		return NULL;
	while (t->nfirst) {
		int fd = t->first[--t->nfirst];

		if (serve_first(s, t, (int)pos, fd) < 0)
			return NULL;
	}
	Py_RETURN_NONE;
}

PyDoc_STRVAR(app_fd_doc,
"app_fd(pos, fd, cookie, op) -> bool\n\n"
"A table verb for an app fd registered by loop thread pos's asyncio\n"
"selector (worker/aio.py) with `cookie`: op 0 delete, 1 want_recv,\n"
"2 stop_recv, 3 want_send, 4 stop_send. Done only while the number is\n"
"still that registration's (its owner the cookie); False otherwise: the\n"
"app closed the fd while registered, and the number may be a connection's\n"
"now (forget_stale_app_fd), which a stale key must never touch. For a\n"
"delete, False too if a running bit defers it.");

static PyObject *Server_app_fd(Server *s, PyObject *args)
{
	int pos, fd, op, rc;
	unsigned long long cookie;
	struct srv_thread *t;
	struct fdc_fdinfo info;

	if (!PyArg_ParseTuple(args, "iiKi:app_fd", &pos, &fd, &cookie, &op) ||
	    !(t = as_thread(s, pos)))
		return NULL;
	if (op < 0 || op > 4)
		return PyErr_Format(PyExc_ValueError, "app_fd: op %d is not 0..4", op);
	/* checked and done under the GIL, as take_fd forgets and re-inserts
	 * under it: no connection can take the number in between */
	if (s->api.dump(s->table, fd, &info) < 0 || info.owner != cookie ||
	    !(info.state & FDC_DISOWN))
		Py_RETURN_FALSE;
	switch (op) {
	case 0: rc = s->api.delete(t->th, fd) == 1 ? 0 : -1; break;
	case 1: rc = s->api.want_recv(t->th, fd); break;
	case 2: rc = s->api.stop_recv(t->th, fd); break;
	case 3: rc = s->api.want_send(t->th, fd); break;
	default: rc = s->api.stop_send(t->th, fd); break;
	}
	return PyBool_FromLong(rc >= 0);
}

/* the Server type's methods of this file (joined in httpmodule.c) */
PyMethodDef server_accept_methods[] = {
	{"accept", (PyCFunction)Server_accept, METH_VARARGS, accept_doc},
	{"take", (PyCFunction)Server_take, METH_VARARGS, take_doc},
	{"serve_accepted", (PyCFunction)Server_serve_accepted, METH_O, serve_accepted_doc},
	{"app_fd", (PyCFunction)Server_app_fd, METH_VARARGS, app_fd_doc},
	{NULL},
};
