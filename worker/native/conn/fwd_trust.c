/* Trusted proxy headers, the connection layer's part: the rules
 * (Server.set_forwarded) and whether a peer's address is trusted
 * (fwd_trusts, once per connection: conn_type.c's conn_trust_peer). forwarded.h
 * says when each part runs and what it costs; fwd_fields.c reads a trusted
 * request's fields.
 *
 * May call: netmatch.c (the allow list).
 */
#include <string.h>

#include "server.h"

/* ---- the rules ------------------------------------------------------------------------------- */

int fwd_trusts(const struct fwd_rules *r, const struct sockaddr *sa, unsigned len)
{
	return r->on && netmatch_peer(&r->allow, sa, len);
}

void fwd_free(struct fwd_rules *r)
{
	for (int i = 0; i < r->nscheme; i++) {
		PyMem_Free(r->scheme[i].name);
		PyMem_Free(r->scheme[i].value);
	}
	PyMem_Free(r->scheme);
	netmatch_free(&r->allow);
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
	if (PyList_GET_SIZE(scheme) > 8) {
		PyErr_SetString(PyExc_ValueError, "set_forwarded: at most 8 scheme headers");
		return NULL;
	}
	memset(&r, 0, sizeof(r));
	r.scheme = PyMem_Calloc((size_t)PyList_GET_SIZE(scheme) + 1, sizeof(*r.scheme));
	if (!r.scheme) {
		PyErr_NoMemory();
		goto fail;
	}
	if (netmatch_set(&r.allow, nets, all, unix_peers, "set_forwarded") < 0)
		goto fail;
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
	r.on = all || unix_peers || r.allow.nnets;
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
void conn_trust_peer(struct conn *c, const struct sockaddr *sa, unsigned len)
{
	c->trusted = fwd_trusts(&c->srv->fwd, sa, len) != 0;
}
