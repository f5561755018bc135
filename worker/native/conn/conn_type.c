/* The connection object (the connection layer): its creation, and its
 * Python side. The Python side sees a connection with the stream
 * interface's names (fd, th, cookie, pending, closed, last_active, write,
 * close, flush_now, adopted_by): the loop's drain, the relief's takeover,
 * the gate's counts and the slow path use it as they used
 * stream.Connection. The layers above add their own methods to the type
 * (httpmodule.c joins them: the codec's refuse, the adapter's respond).
 *
 * May call: conn_io.c, conn_timers.c; above only through struct conn_ops
 * (open, owed).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "server.h"
#include "conn_tls.h"

/* server.h: the Server's type, set by the module's init */
PyTypeObject *server_type;
#include <structmember.h>

/* ---- addresses ----------------------------------------------------------------- */

static PyObject *host_str(const struct sockaddr_storage *ss)
{
	char buf[INET6_ADDRSTRLEN];

	if (ss->ss_family == AF_INET)
		inet_ntop(AF_INET, &((const struct sockaddr_in *)ss)->sin_addr, buf, sizeof(buf));
	else
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)ss)->sin6_addr, buf, sizeof(buf));
	return PyUnicode_FromString(buf);
}

static int port_of(const struct sockaddr_storage *ss)
{
	return ntohs(ss->ss_family == AF_INET ? ((const struct sockaddr_in *)ss)->sin_port
	                                      : ((const struct sockaddr_in6 *)ss)->sin6_port);
}

/* s->local_obj and s->local_port for the local address local (len
 * bytes): the last connection's when it is the same address, else made
 * (and kept for the next). 0 or -1. */
static int shared_local(Server *s, const struct sockaddr_storage *local, socklen_t len)
{
	PyObject *lh, *obj, *port;

	if (s->local_obj && len == s->local_key_len && len <= sizeof(s->local_key) &&
	    !memcmp(s->local_key, local, len))
		return 0;
	if (!(lh = host_str(local)))
		return -1;
	obj = Py_BuildValue("(Ni)", lh, port_of(local));
	port = PyUnicode_FromFormat("%d", port_of(local));
	if (!obj || !port) {
		Py_XDECREF(obj);
		Py_XDECREF(port);
		return -1;
	}
	Py_XSETREF(s->local_obj, obj);
	Py_XSETREF(s->local_port, port);
	s->local_key_len = len <= sizeof(s->local_key) ? (unsigned)len : 0;
	memcpy(s->local_key, local, s->local_key_len);
	return 0;
}

/* The peer's host as str (a new reference): the last connection's when
 * it came from the same address, else made (and kept for the next). */
static PyObject *shared_peer_host(Server *s, const struct sockaddr_storage *peer)
{
	unsigned char key[17];
	unsigned n;
	PyObject *h;

	key[0] = peer->ss_family == AF_INET6;
	if (key[0]) {
		memcpy(key + 1, &((const struct sockaddr_in6 *)peer)->sin6_addr, 16);
		n = 17;
	}
	else {
		memcpy(key + 1, &((const struct sockaddr_in *)peer)->sin_addr, 4);
		n = 5;
	}
	if (s->peer_host && n == s->peer_key_len && !memcmp(key, s->peer_key, n))
		return Py_NewRef(s->peer_host);
	if (!(h = host_str(peer)))
		return NULL;
	Py_XSETREF(s->peer_host, Py_NewRef(h));
	memcpy(s->peer_key, key, n);
	s->peer_key_len = n;
	return h;
}

/* SERVER_NAME, SERVER_PORT, REMOTE_ADDR, REMOTE_PORT, and peer / local
 * as Python's socket gives them ((host, port), or the unix path). */
static int addresses(struct conn *c)
{
	struct sockaddr_storage local, peer;
	socklen_t ll = sizeof(local), pl = sizeof(peer);

	memset(&local, 0, sizeof(local));
	memset(&peer, 0, sizeof(peer));
	if (getsockname(c->fd, (struct sockaddr *)&local, &ll) < 0 ||
	    getpeername(c->fd, (struct sockaddr *)&peer, &pl) < 0) {
		/* reset already: the first read will tell */
		c->addr = Py_BuildValue("(ssss)", "", "", "", "");
		c->peer = Py_NewRef(Py_None);
		c->local = Py_NewRef(Py_None);
		c->proxy_wait = c->srv->proxy_mode != 0;   /* not trusted: no peer to trust */
		return c->addr ? 0 : -1;
	}
	conn_trust_peer(c, (const struct sockaddr *)&peer, pl);
	if (local.ss_family == AF_INET || local.ss_family == AF_INET6) {
		PyObject *ph = shared_peer_host(c->srv, &peer);

		if (!ph || shared_local(c->srv, &local, ll) < 0) {
			Py_XDECREF(ph);
			return -1;
		}
		/* c->addr: made from these by conn_addr when asked (WSGI) */
		c->local = Py_NewRef(c->srv->local_obj);
		c->peer = Py_BuildValue("(Oi)", ph, port_of(&peer));
		Py_DECREF(ph);
	}
	else {
		const struct sockaddr_un *un = (const struct sockaddr_un *)&local;
		size_t n = ll > offsetof(struct sockaddr_un, sun_path)
		           ? strnlen(un->sun_path, ll - offsetof(struct sockaddr_un, sun_path)) : 0;

		c->local = PyUnicode_DecodeFSDefaultAndSize(un->sun_path, (Py_ssize_t)n);
		c->peer = PyUnicode_FromString("");
		c->addr = c->local ? Py_BuildValue("(Osss)", c->local, "", "", "") : NULL;
		if (!c->addr)
			return -1;
	}
	if (c->srv->proxy_mode) {
		c->proxy_wait = 1;
		c->proxy_trusted = (unsigned)netmatch_peer(&c->srv->proxy_allow,
		                                              (const struct sockaddr *)&peer, pl);
	}
	return c->local && c->peer ? 0 : -1;
}

struct conn *conn_new(Server *s, int pos, int fd, uint64_t cookie)
{
	struct conn *c = PyObject_New(struct conn, &ConnType);

	if (!c)
		return NULL;
	memset((char *)c + sizeof(PyObject), 0, sizeof(struct conn) - sizeof(PyObject));
	c->srv = (Server *)Py_NewRef(s);
	c->fd = fd;
	c->pos = pos;
	c->cookie = cookie;
	c->th = Py_NewRef(s->thr[pos].obj);
	c->tkind = -1;
	c->inside = -1;
	c->missed_timer = -1;
	c->last_active = mono_now();
	if (s->ops->open(c) < 0 || addresses(c) < 0 || tls_open(c) < 0) {
		c->closed = 1;
		Py_DECREF(c);
		return NULL;
	}
	return c;
}

/* ---- the Python side -------------------------------------------------------------------------- */

static void Conn_dealloc(struct conn *c)
{
	tls_free(c);
	PyMem_Free(c->out);
	Py_XDECREF(c->parser);
	Py_XDECREF(c->th);
	Py_XDECREF(c->addr);
	Py_XDECREF(c->peer);
	Py_XDECREF(c->local);
	Py_XDECREF(c->response);
	Py_XDECREF(c->parked);
	Py_XDECREF(c->held);
	Py_XDECREF(c->call);
	Py_XDECREF(c->proxy);
	Py_XDECREF(c->srv);
	PyObject_Free(c);
}

/* From a thread that is not a loop thread: run it on the owner's. */
static PyObject *post(struct conn *c, const char *method, PyObject *arg)
{
	PyObject *fn = PyObject_GetAttrString((PyObject *)c, method), *r;

	if (!fn)
		return NULL;
	r = PyObject_CallFunctionObjArgs(c->srv->post, (PyObject *)c, fn, arg, NULL);
	Py_DECREF(fn);
	return r;
}

static PyObject *Conn_write(struct conn *c, PyObject *data)
{
	Py_buffer b;

	if (c->closed || c->closing)
		Py_RETURN_NONE;
	/* From a thread that is not a loop thread: while c is serving, its
	 * owner is inside the app and this thread is the app's (ctx()), so
	 * the bytes go out now, as the WSGI write() of such a thread does;
	 * posted to the owner, the slow path's 100 Continue for a body read by
	 * a thread the owner waits for never went out (review). Else posted. */
	if (srv_current(c->srv) < 0 && !c->serving) {
		PyObject *copy = PyBytes_FromObject(data), *r;
		if (!copy)
			return NULL;
		r = post(c, "write", copy);
		Py_DECREF(copy);
		return r;
	}
	if (PyObject_GetBuffer(data, &b, PyBUF_SIMPLE) < 0)
		return NULL;
	int rc = conn_send(c, b.buf, (size_t)b.len, 1);
	PyBuffer_Release(&b);
	if (rc < 0)
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *Conn_close(struct conn *c, PyObject *noarg)
{
	(void)noarg;
	if (c->closed)
		Py_RETURN_NONE;
	if (srv_current(c->srv) < 0)
		return post(c, "close", NULL);
	conn_close_soft(c);
	Py_RETURN_NONE;
}

static PyObject *Conn_close_now(struct conn *c, PyObject *noarg)
{
	(void)noarg;
	if (conn_close_now(c) < 0)
		return NULL;
	Py_RETURN_NONE;
}

PyDoc_STRVAR(flush_now_doc,
"flush_now(timeout, below=0): sends buffered output until at most `below`\n"
"bytes wait, waiting for the socket (the caller's thread is the\n"
"connection's while the app runs). Raises ClientGone if the client went\n"
"away or did not read for timeout seconds.");

static PyObject *Conn_flush_now(struct conn *c, PyObject *args)
{
	double timeout;
	Py_ssize_t below = 0;

	if (!PyArg_ParseTuple(args, "d|n:flush_now", &timeout, &below))
		return NULL;
	if (conn_flush_wait(c, timeout, (size_t)(below < 0 ? 0 : below)) < 0)
		return NULL;
	Py_RETURN_NONE;
}

/* recv(n): the slow path's read of a body (wsgi.py), through the
 * connection's reads (TLS: decrypted; the session may hold bytes the
 * socket no longer has, so it is called before any wait for the socket). */
static PyObject *Conn_recv(struct conn *c, PyObject *arg)
{
	Py_ssize_t n = PyLong_AsSsize_t(arg);
	PyObject *b;
	ssize_t got;

	if (n < 0 || n > (1 << 24)) {
		if (!PyErr_Occurred())
			PyErr_SetString(PyExc_ValueError, "recv(n): 0 < n <= 16 MiB");
		return NULL;
	}
	if (c->closed) {
		PyErr_SetString(ClientGone, "the client went away");
		return NULL;
	}
	if (!(b = PyBytes_FromStringAndSize(NULL, n)))
		return NULL;
	got = conn_read(c, PyBytes_AS_STRING(b), (size_t)n);
	if (got == -1) {
		Py_DECREF(b);
		return NULL;
	}
	if (got == 0) {
		Py_DECREF(b);
		if (c->closed) {
			PyErr_SetString(ClientGone, "the client went away");
			return NULL;
		}
		Py_RETURN_NONE;
	}
	if (_PyBytes_Resize(&b, got == -2 ? 0 : got) < 0)
		return NULL;
	return b;
}

static PyObject *Conn_flush(struct conn *c, PyObject *noarg)
{
	(void)noarg;
	conn_flush(c);
	Py_RETURN_NONE;
}

PyDoc_STRVAR(adopted_by_doc,
"adopted_by(th): th took the connection over (fdcore takeover, recv\n"
"stopped): it owns it from now on, timer included. Work was waiting on\n"
"it: that is activity (a drain must not take it for idle).");

static PyObject *Conn_adopted_by(struct conn *c, PyObject *th)
{
	Server *s = c->srv;
	int pos = -1;

	for (int i = 0; i < s->nthreads; i++)
		if (s->thr[i].obj == th)
			pos = i;
	if (pos < 0) {
		PyErr_SetString(PyExc_ValueError, "not one of this loop's threads");
		return NULL;
	}
	int kind = c->tkind;
	double due = c->due;
	timer_cancel(c);
	c->pos = pos;
	Py_SETREF(c->th, Py_NewRef(th));
	c->last_active = mono_now();
	c->want_send = 0;            /* the core keeps a wanted send: re-say it */
	c->recv_on = 0;              /* ... and stopped recv */
	if (kind >= 0) {
		c->tkind = kind;
		c->due = due;
		timer_arm(c, -1);        /* same deadline, the new owner's list */
	}
	conn_sync(c);
	Py_RETURN_NONE;
}

/* the connection's own methods: the codec's and the adapter's follow them
 * in the type (httpmodule.c) */
PyMethodDef conn_methods[] = {
	{"write", (PyCFunction)Conn_write, METH_O, "write(data): sends, buffering the rest."},
	{"close", (PyCFunction)Conn_close, METH_NOARGS, "Closes once the output is sent."},
	{"_close_now", (PyCFunction)Conn_close_now, METH_NOARGS, "Closes at once."},
	{"flush_now", (PyCFunction)Conn_flush_now, METH_VARARGS, flush_now_doc},
	{"flush", (PyCFunction)Conn_flush, METH_NOARGS,
	 "flush(): one write of the buffered output, what the kernel takes (no wait)."},
	{"adopted_by", (PyCFunction)Conn_adopted_by, METH_O, adopted_by_doc},
	{"recv", (PyCFunction)Conn_recv, METH_O,
	 "recv(n): at most n bytes read (decrypted under TLS); b'' the end, None nothing now."},
	{NULL},
};

static PyObject *get_pending(struct conn *c, void *x)
{
	(void)x;
	return PyLong_FromSize_t(conn_pending(c) + (c->parked ? c->srv->ops->owed(c) : 0));
}

static PyObject *get_tls(struct conn *c, void *x)
{
	(void)x;
	return PyBool_FromLong(c->ssl != NULL);
}

static PyObject *get_closed(struct conn *c, void *x)
{
	(void)x;
	return PyBool_FromLong(c->closed);
}

static PyObject *get_loop(struct conn *c, void *x)
{
	(void)x;
	return Py_NewRef(c->srv->loop);
}

static PyObject *get_last_active(struct conn *c, void *x)
{
	(void)x;
	return PyFloat_FromDouble(c->last_active);
}

static int set_last_active(struct conn *c, PyObject *v, void *x)
{
	double d = v ? PyFloat_AsDouble(v) : -1.0;

	(void)x;
	if (!v || (d == -1.0 && PyErr_Occurred()))
		return -1;
	c->last_active = d;
	return 0;
}

static PyObject *get_response(struct conn *c, void *x)
{
	(void)x;
	return Py_NewRef(c->response ? c->response : Py_None);
}

static PyObject *get_buffering(struct conn *c, void *x)
{
	(void)x;
	/* a call runs (ASGI): not idle either, whatever its last event */
	return PyBool_FromLong(c->held != NULL || c->call != NULL);
}

static PyGetSetDef Conn_getset[] = {
	{"buffering", (getter)get_buffering, NULL,
	 "a request's body is being read before its app runs, or its ASGI app runs (not idle)", NULL},
	{"pending", (getter)get_pending, NULL,
	 "bytes written and not yet sent, with a parked body's rest (1 for an iterator's)", NULL},
	{"closed", (getter)get_closed, NULL, "closed (or failed)", NULL},
	{"tls", (getter)get_tls, NULL, "its bytes go through a TLS session (conn_tls.c)", NULL},
	{"loop", (getter)get_loop, NULL, "the worker's loop", NULL},
	{"last_active", (getter)get_last_active, (setter)set_last_active,
	 "monotonic time of the last event (the drain's idle grace)", NULL},
	{"response", (getter)get_response, NULL, "the Respond of the request being served", NULL},
	{NULL},
};

static PyMemberDef Conn_members[] = {
	{"fd", T_INT, offsetof(struct conn, fd), READONLY, "the connection's fd"},
	{"cookie", T_ULONGLONG, offsetof(struct conn, cookie), READONLY, "its owner cookie in the table"},
	{"th", T_OBJECT, offsetof(struct conn, th), READONLY, "the owner loop thread's fdcore.Thread"},
	{"parser", T_OBJECT, offsetof(struct conn, parser), READONLY, "its RequestParser"},
	{"peer", T_OBJECT, offsetof(struct conn, peer), READONLY, "the client's address"},
	{"local", T_OBJECT, offsetof(struct conn, local), READONLY, "our address"},
	{"proxy", T_OBJECT, offsetof(struct conn, proxy), READONLY,
	 "what a PROXY protocol header told (a dict), or None"},
	{NULL},
};

PyTypeObject ConnType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "sockherd.worker._http.HttpConn",
	.tp_doc = "One HTTP/1.1 connection of the native engine.",
	.tp_basicsize = sizeof(struct conn),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_dealloc = (destructor)Conn_dealloc,
	/* .tp_methods: conn_methods and the layers' above, joined (httpmodule.c) */
	.tp_getset = Conn_getset,
	.tp_members = Conn_members,
};
