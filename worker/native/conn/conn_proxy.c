/* The PROXY protocol step of the connection layer: the header a proxy in
 * front sends ahead of a connection's bytes, read before any protocol
 * above sees one (and, once TLS exists, before its handshake: the header
 * is in clear ahead of the ClientHello, so the TLS step goes after this
 * one, on the bytes this one leaves).
 *
 * Who must send one: with proxy_protocol set (Server.set_proxy), a peer
 * in proxy_allow_from must open with a header of the versions expected,
 * else the connection closes; a peer outside it may not send one (its
 * header would name any client it likes: refused, the connection closed)
 * and is served as it is otherwise. Each close is logged through the
 * refusal log (log_refusals' fn with status 0), at most a line a second.
 *
 * The codec drives it (h1_conn.c): the bytes of its read buffer go
 * through conn_proxy_read until the header is whole, which takes only the
 * header's bytes; what follows stays in the buffer for the codec. The
 * header's time is the head's: the header timer armed at accept runs on.
 *
 * May call: proxy_proto.c (the parser), netmatch.c (proxy_allow_from),
 * conn_io.c (close), conn_report.c (the refusal log).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "server.h"
#include "proxy_proto.h"

/* ---- what a header tells -------------------------------------------------------------------- */

static PyObject *text(struct pp_bytes b)
{
	return PyUnicode_DecodeLatin1((const char *)b.p, (Py_ssize_t)b.n, NULL);
}

static int put_text(PyObject *d, const char *key, struct pp_bytes b)
{
	return b.p ? dict_put(d, key, text(b)) : 0;
}

static PyObject *host(int family, const uint8_t *a)
{
	char buf[INET6_ADDRSTRLEN];

	if (!inet_ntop(family, a, buf, sizeof(buf)))
		return PyErr_SetFromErrno(PyExc_OSError);
	return PyUnicode_FromString(buf);
}

/* (host, port) of an IP family, or the unix path (str, the file system's
 * encoding) */
static PyObject *endpoint(const struct pp_result *r, int src)
{
	if (r->family == AF_UNIX) {
		struct pp_bytes p = src ? r->src_path : r->dst_path;

		return PyUnicode_DecodeFSDefaultAndSize((const char *)p.p, (Py_ssize_t)p.n);
	}
	PyObject *h = host(r->family, src ? r->src : r->dst);

	return h ? Py_BuildValue("(Ni)", h, src ? r->sport : r->dport) : NULL;
}

PyObject *proxy_info(const struct pp_result *r)
{
	PyObject *d = PyDict_New();

	if (!d)
		return NULL;
	if (dict_put(d, "version", PyLong_FromLong(r->version)) < 0 ||
	    dict_put(d, "local", PyBool_FromLong(r->local)) < 0)
		goto fail;
	if (!r->local && (dict_put(d, "src", endpoint(r, 1)) < 0 || dict_put(d, "dst", endpoint(r, 0)) < 0))
		goto fail;
	if (put_text(d, "alpn", r->alpn) < 0 || put_text(d, "authority", r->authority) < 0 ||
	    (r->unique_id.p && dict_put(d, "unique_id", PyBytes_FromStringAndSize(
	         (const char *)r->unique_id.p, (Py_ssize_t)r->unique_id.n)) < 0))
		goto fail;
	if (r->ssl.present) {
		PyObject *ssl = PyDict_New();

		if (dict_put(d, "ssl", Py_XNewRef(ssl)) < 0 ||
		    dict_put(ssl, "client", PyLong_FromLong(r->ssl.client)) < 0 ||
		    dict_put(ssl, "verify", PyLong_FromUnsignedLong(r->ssl.verify)) < 0 ||
		    put_text(ssl, "version", r->ssl.version) < 0 || put_text(ssl, "cn", r->ssl.cn) < 0 ||
		    put_text(ssl, "cipher", r->ssl.cipher) < 0 ||
		    put_text(ssl, "sig_alg", r->ssl.sig_alg) < 0 ||
		    put_text(ssl, "key_alg", r->ssl.key_alg) < 0) {
			Py_XDECREF(ssl);
			goto fail;
		}
		Py_DECREF(ssl);
	}
	return d;
fail:
	Py_DECREF(d);
	return NULL;
}

/* ---- the step --------------------------------------------------------------------------------- */

/* The trusted proxies' rules (forwarded.h: may this peer send
 * X-Forwarded-For, Forwarded...?) judge the client the header names, not
 * the proxy that sent it: the proxy is trusted with the PROXY header by
 * proxy_allow_from, the client with forwarding fields only if it is in
 * forwarded_allow_ips itself. A header that names no client (v1 UNKNOWN,
 * v2 UNSPEC, v2 LOCAL, which HAProxy also sends for a connection it
 * relays from a unix-socket frontend) still means the bytes after it are
 * a client's, not the proxy's: that client is unknown (AF_UNSPEC), which
 * only "*" trusts. */
static void judge(struct conn *c, const struct pp_result *r)
{
	struct sockaddr_storage ss;
	unsigned len = sizeof(sa_family_t);

	memset(&ss, 0, sizeof(ss));
	ss.ss_family = (sa_family_t)r->family;
	if (r->family == AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)&ss;

		memcpy(&in->sin_addr, r->src, 4);
		in->sin_port = htons(r->sport);
		len = sizeof(*in);
	}
	else if (r->family == AF_INET6) {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;

		memcpy(&in6->sin6_addr, r->src, 16);
		in6->sin6_port = htons(r->sport);
		len = sizeof(*in6);
	}
	conn_trust_peer(c, (const struct sockaddr *)&ss, len);
}

/* (conn.h) here, below conn_type.c, as this file's apply needs it */
PyObject *conn_addr(struct conn *c)
{
	PyObject *lp, *rp;

	if (c->addr)
		return c->addr;
	/* a TCP connection's: its (host, port) tuples (addresses, or the
	 * PROXY protocol's source), the ports as str */
	if (!PyTuple_Check(c->local) || !PyTuple_Check(c->peer)) {
		PyErr_SetString(PyExc_SystemError, "conn_addr: a connection without TCP addresses");
		return NULL;
	}
	lp = c->local == c->srv->local_obj ? Py_NewRef(c->srv->local_port)
	                                   : PyObject_Str(PyTuple_GET_ITEM(c->local, 1));
	rp = PyObject_Str(PyTuple_GET_ITEM(c->peer, 1));
	if (lp && rp)
		c->addr = PyTuple_Pack(4, PyTuple_GET_ITEM(c->local, 0), lp,
		                       PyTuple_GET_ITEM(c->peer, 0), rp);
	Py_XDECREF(lp);
	Py_XDECREF(rp);
	return c->addr;
}

/* The header's IP addresses become c's peer (REMOTE_ADDR, REMOTE_PORT,
 * the ASGI client); the socket's own peer stays in c->proxy["peer"]. */
static int apply(struct conn *c, const struct pp_result *r)
{
	PyObject *info = proxy_info(r), *src, *addr, *ra, *rp;

	if (!info || dict_put(info, "peer", Py_NewRef(c->peer)) < 0) {
		Py_XDECREF(info);
		return -1;
	}
	Py_XSETREF(c->proxy, info);
	/* An AF_UNIX source (a client of a unix-socket frontend) is no
	 * address: its path, raw bytes the proxy copied, stays in
	 * proxy["src"], and the socket's addresses are kept, so that
	 * REMOTE_ADDR, the ASGI client and server keep their shapes (a
	 * (host, port) tuple on TCP) and no path with control bytes reaches
	 * them. It is judged as a unix-socket peer. */
	if (r->local || r->family == AF_UNIX) {
		judge(c, r);                   /* AF_UNSPEC: an unknown client; AF_UNIX: "unix" */
		return 0;
	}
	src = PyDict_GetItemString(info, "src");               /* borrowed */
	if (!src || !PyTuple_Check(src)) {
		PyErr_SetString(PyExc_SystemError, "conn_proxy: a PROXY source without an address");
		return -1;
	}
	ra = Py_NewRef(PyTuple_GET_ITEM(src, 0));
	rp = PyUnicode_FromFormat("%d", (int)r->sport);
	/* the socket's addresses first (made on demand, conn_type.c): its
	 * SERVER_NAME and SERVER_PORT are kept */
	if (!rp || !conn_addr(c)) {
		Py_DECREF(ra);
		Py_XDECREF(rp);
		return -1;
	}
	addr = Py_BuildValue("(OONN)", PyTuple_GET_ITEM(c->addr, 0), PyTuple_GET_ITEM(c->addr, 1),
	                     ra, rp);
	if (!addr)
		return -1;
	Py_SETREF(c->addr, addr);
	Py_SETREF(c->peer, Py_NewRef(src));
	judge(c, r);
	return 0;
}

static void refuse(struct conn *c, const char *reason)
{
	c->srv->proxy_refused++;
	srv_log_refusal(c->srv, c->peer, 0, reason);
	c->proxy_wait = 0;
	if (conn_close_now(c) < 0)
		PyErr_WriteUnraisable((PyObject *)c);
}

ssize_t conn_proxy_read(struct conn *c, const char *buf, size_t len, int eof)
{
	struct pp_result r;
	int rc;

	if (!c->proxy_trusted) {
		rc = pp_signature((const uint8_t *)buf, len);
		if (rc == 1)
			refuse(c, "a PROXY protocol header from a peer not in proxy_allow_from");
		else if (rc == 0 || eof)
			c->proxy_wait = 0;            /* not a header: the codec's bytes */
		return 0;
	}
	rc = pp_parse((const uint8_t *)buf, len, c->srv->proxy_mode, &r);
	if (rc == 0) {
		if (eof && len)
			refuse(c, "a truncated PROXY protocol header");
		return 0;
	}
	if (rc < 0) {
		refuse(c, pp_strerror(rc));
		return 0;
	}
	if (apply(c, &r) < 0)
		return -1;
	c->proxy_wait = 0;
	return rc;
}

void conn_proxy_timeout(struct conn *c)
{
	refuse(c, "no whole PROXY protocol header within header_timeout");
}

/* ---- the Python side ---------------------------------------------------------------------------- */

static const char *const MODES[] = {"off", "v1", "v2", "auto", NULL};

static int mode_of(const char *name)
{
	for (int i = 0; MODES[i]; i++)
		if (strcmp(MODES[i], name) == 0)
			return i;
	PyErr_Format(PyExc_ValueError, "proxy_protocol %R: one of off, v1, v2, auto", name);
	return -1;
}

/* Server.set_proxy(mode, nets, all, unix) */
static PyObject *Server_set_proxy(Server *s, PyObject *args)
{
	const char *name;
	PyObject *nets;
	int all, unix_ok, mode;

	if (!PyArg_ParseTuple(args, "sO!pp:set_proxy", &name, &PyList_Type, &nets, &all, &unix_ok))
		return NULL;
	if ((mode = mode_of(name)) < 0 || netmatch_set(&s->proxy_allow, nets, all, unix_ok,
	                                               "set_proxy") < 0)
		return NULL;
	s->proxy_mode = mode;
	Py_RETURN_NONE;
}

PyMethodDef server_proxy_methods[] = {
	{"set_proxy", (PyCFunction)Server_set_proxy, METH_VARARGS,
	 "set_proxy(mode, nets, all, unix): the PROXY protocol header expected ('off', 'v1', "
	 "'v2', 'auto') from peers in nets ((packed address, prefix bits) pairs), from every "
	 "peer if all, from unix-socket peers if unix; others may not send one. Before the first "
	 "accept."},
	{NULL},
};

/* proxy_parse(data, mode) -> (verdict, info): the parser on its own, for
 * the stream interface (worker/stream.py) and the fuzz oracle */
static PyObject *proxy_parse(PyObject *self, PyObject *args)
{
	Py_buffer b;
	const char *name;
	struct pp_result r;
	int mode, rc;
	PyObject *info;

	(void)self;
	if (!PyArg_ParseTuple(args, "y*s:proxy_parse", &b, &name))
		return NULL;
	if ((mode = mode_of(name)) < 0 || mode == PP_OFF) {
		if (mode == PP_OFF)
			PyErr_SetString(PyExc_ValueError, "proxy_parse: mode 'off' parses nothing");
		PyBuffer_Release(&b);
		return NULL;
	}
	rc = pp_parse(b.buf, (size_t)b.len, mode, &r);
	if (rc > 0)
		info = proxy_info(&r);
	else
		info = rc < 0 ? PyUnicode_FromString(pp_strerror(rc)) : Py_NewRef(Py_None);
	PyBuffer_Release(&b);
	return info ? Py_BuildValue("(iN)", rc, info) : NULL;
}

static PyObject *proxy_signature(PyObject *self, PyObject *arg)
{
	Py_buffer b;
	int rc;

	(void)self;
	if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
		return NULL;
	rc = pp_signature(b.buf, (size_t)b.len);
	PyBuffer_Release(&b);
	return PyLong_FromLong(rc);
}

PyMethodDef proxy_module_methods[] = {
	{"proxy_parse", proxy_parse, METH_VARARGS,
	 "proxy_parse(data, mode) -> (verdict, info): mode 'v1', 'v2' or 'auto'; verdict > 0: "
	 "the header's length, info its dict (version, local, src, dst, alpn, authority, "
	 "unique_id, ssl); 0: more bytes needed (info None); < 0: refused (info the reason)."},
	{"proxy_signature", proxy_signature, METH_O,
	 "proxy_signature(data): 1 data begins with a PROXY protocol signature, 0 it cannot, "
	 "-1 a prefix of one so far."},
	{NULL},
};
