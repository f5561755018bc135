/* Trusted proxy headers, the connection layer's part: the rules
 * (Server.set_forwarded) and whether a peer's address is trusted
 * (fwd_trusts, once per connection: conn_type.c's conn_peer). forwarded.h
 * says when each part runs and what it costs; fwd_fields.c reads a trusted
 * request's fields.
 *
 * May call: nothing of the extension (the layer's bottom).
 */
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

#include "engine.h"

/* ---- the rules ------------------------------------------------------------------------------- */

static int net_has(const struct fwd_net *n, const unsigned char *a)
{
	unsigned full = n->bits / 8, rest = n->bits % 8;

	if (memcmp(n->addr, a, full))
		return 0;
	return !rest || !((n->addr[full] ^ a[full]) & (0xffu << (8 - rest)) & 0xffu);
}

/* an address of family fam (4 or 16 bytes at a) in the allow list */
int fwd_addr_trusted(const struct fwd_rules *r, int fam, const unsigned char *a)
{
	static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

	if (r->all)
		return 1;
	if (fam == AF_INET6 && !memcmp(a, mapped, 12)) {
		fam = AF_INET;                   /* a dual-stack socket's v4 peer */
		a += 12;
	}
	for (int i = 0; i < r->nnets; i++)
		if (r->nets[i].family == fam && net_has(&r->nets[i], a))
			return 1;
	return 0;
}

int fwd_trusts(const struct fwd_rules *r, const struct sockaddr *sa, unsigned len)
{
	if (!r->on)
		return 0;
	if (sa->sa_family == AF_UNIX)
		return r->all || r->unix_peers;
	if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in))
		return fwd_addr_trusted(r, AF_INET,
		                    (const unsigned char *)&((const struct sockaddr_in *)sa)->sin_addr);
	if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6))
		return fwd_addr_trusted(r, AF_INET6,
		                    (const unsigned char *)&((const struct sockaddr_in6 *)sa)->sin6_addr);
	return 0;
}

void fwd_free(struct fwd_rules *r)
{
	for (int i = 0; i < r->nscheme; i++) {
		PyMem_Free(r->scheme[i].name);
		PyMem_Free(r->scheme[i].value);
	}
	PyMem_Free(r->scheme);
	PyMem_Free(r->nets);
	Py_CLEAR(r->log);
	memset(r, 0, sizeof(*r));
}

/* ---- Server.set_forwarded ---------------------------------------------------------------------- */

PyDoc_STRVAR(set_forwarded_doc,
"set_forwarded(nets, all, unix, scheme, forwarder, log)\n\n"
"The trusted proxy rules (worker/forwarded.py builds them from the settings):\n"
"nets: (packed address bytes of 4 or 16, prefix length) pairs; all: every\n"
"peer trusted; unix: unix-socket peers trusted; scheme: (lower-case field\n"
"name bytes, value bytes meaning https) pairs, at most 8; forwarder: bits\n"
"1 X-Forwarded-Host, 2 -Port, 4 -Prefix; log: log(peer, field, value) for an\n"
"ignored value, or None. Before the first connection only.");

static char *dup_bytes(PyObject *b, size_t *n)
{
	char *out;

	*n = (size_t)PyBytes_GET_SIZE(b);
	out = PyMem_Malloc(*n + 1);
	if (!out)
		return (char *)PyErr_NoMemory();
	memcpy(out, PyBytes_AS_STRING(b), *n);
	out[*n] = 0;
	return out;
}

static PyObject *Server_set_forwarded(Server *s, PyObject *args)
{
	PyObject *nets, *scheme, *log;
	int all, unix_peers;
	unsigned forwarder;
	struct fwd_rules r;

	if (!PyArg_ParseTuple(args, "O!ppO!IO:set_forwarded", &PyList_Type, &nets, &all, &unix_peers,
	                      &PyList_Type, &scheme, &forwarder, &log))
		return NULL;
	if (s->count) {
		PyErr_SetString(PyExc_RuntimeError, "set_forwarded: connections are open already");
		return NULL;
	}
	if (PyList_GET_SIZE(scheme) > 8 || PyList_GET_SIZE(nets) > 4096) {
		PyErr_SetString(PyExc_ValueError, "at most 8 scheme headers and 4096 networks");
		return NULL;
	}
	memset(&r, 0, sizeof(r));
	r.nets = PyMem_Calloc((size_t)PyList_GET_SIZE(nets) + 1, sizeof(*r.nets));
	r.scheme = PyMem_Calloc((size_t)PyList_GET_SIZE(scheme) + 1, sizeof(*r.scheme));
	if (!r.nets || !r.scheme) {
		PyErr_NoMemory();
		goto fail;
	}
	for (Py_ssize_t i = 0; i < PyList_GET_SIZE(nets); i++) {
		PyObject *addr;
		unsigned bits;
		struct fwd_net *net = &r.nets[r.nnets];

		if (!PyArg_ParseTuple(PyList_GET_ITEM(nets, i), "SI", &addr, &bits))
			goto fail;
		if ((PyBytes_GET_SIZE(addr) != 4 && PyBytes_GET_SIZE(addr) != 16) ||
		    bits > 8 * (unsigned)PyBytes_GET_SIZE(addr)) {
			PyErr_SetString(PyExc_ValueError, "a network: 4 or 16 address bytes, a prefix length "
			                "within them");
			goto fail;
		}
		net->family = PyBytes_GET_SIZE(addr) == 4 ? AF_INET : AF_INET6;
		net->bits = bits;
		memcpy(net->addr, PyBytes_AS_STRING(addr), (size_t)PyBytes_GET_SIZE(addr));
		r.nnets++;
	}
	for (Py_ssize_t i = 0; i < PyList_GET_SIZE(scheme); i++) {
		PyObject *name, *value;
		struct fwd_scheme *e = &r.scheme[r.nscheme];

		if (!PyArg_ParseTuple(PyList_GET_ITEM(scheme, i), "SS", &name, &value))
			goto fail;
		if (!(e->name = dup_bytes(name, &e->name_len)))
			goto fail;
		r.nscheme++;
		if (!(e->value = dup_bytes(value, &e->value_len)))
			goto fail;
	}
	r.all = all;
	r.unix_peers = unix_peers;
	r.on = all || unix_peers || r.nnets;
	r.forwarder = forwarder & (FWD_HOST | FWD_PORT | FWD_PREFIX);
	r.log = log == Py_None ? NULL : Py_NewRef(log);
	fwd_free(&s->fwd);
	s->fwd = r;
	Py_RETURN_NONE;
fail:
	fwd_free(&r);
	return NULL;
}

PyMethodDef fwd_server_methods[] = {
	{"set_forwarded", (PyCFunction)Server_set_forwarded, METH_VARARGS, set_forwarded_doc},
	{NULL},
};

/* c's trust for its peer sa (at accept: conn_type.c; again for the client
 * a PROXY header names: conn_proxy.c). Here, below both, so that neither
 * calls up the layers. */
void conn_peer(HttpConn *c, const struct sockaddr *sa, unsigned len)
{
	c->trusted = fwd_trusts(&c->srv->fwd, sa, len) != 0;
}
