/* An allow list of peers (netmatch.h): set from Python, matched at
 * accept and, for forwarded_allow_ips, against each address of a
 * forwarding chain (fwd_fields.c).
 *
 * May call: nothing of the extension (the connection layer's bottom).
 */
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

#include "netmatch.h"

static int net_has(const struct net_cidr *n, const unsigned char *a)
{
	unsigned full = n->bits / 8, rest = n->bits % 8;

	if (memcmp(n->addr, a, full))
		return 0;
	return !rest || !((n->addr[full] ^ a[full]) & (0xffu << (8 - rest)) & 0xffu);
}

/* scope: the interface index a peer's link-local address came on
 * (sin6_scope_id), 0 for none known; a network with a zone (fe80::1%eth0)
 * allows its addresses on that interface only, else the same fe80::1 of
 * any other link would be trusted (issue 35 §24) */
static int match(const struct netmatch *m, int fam, const unsigned char *a, unsigned scope)
{
	static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

	if (m->all)
		return 1;
	if (fam == AF_INET6 && !memcmp(a, mapped, 12)) {
		fam = AF_INET;                   /* a dual-stack socket's v4 peer */
		a += 12;
	}
	for (int i = 0; i < m->nnets; i++)
		if (m->nets[i].family == fam && net_has(&m->nets[i], a) &&
		    (!m->nets[i].scope || m->nets[i].scope == scope))
			return 1;
	return 0;
}

int netmatch_addr(const struct netmatch *m, int fam, const unsigned char *a)
{
	return match(m, fam, a, 0);
}

int netmatch_peer(const struct netmatch *m, const struct sockaddr *sa, unsigned len)
{
	if (sa->sa_family == AF_UNIX)
		return m->all || m->unix_peers;
	if (sa->sa_family == AF_UNSPEC)
		return m->all;                   /* a client a PROXY header did not name (conn_proxy.c) */
	if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in))
		return match(m, AF_INET, (const unsigned char *)&((const struct sockaddr_in *)sa)->sin_addr, 0);
	if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6))
		return match(m, AF_INET6, (const unsigned char *)&((const struct sockaddr_in6 *)sa)->sin6_addr,
		             ((const struct sockaddr_in6 *)sa)->sin6_scope_id);
	return 0;
}

void netmatch_free(struct netmatch *m)
{
	PyMem_Free(m->nets);
	memset(m, 0, sizeof(*m));
}

int netmatch_set(struct netmatch *out, PyObject *nets, int all, int unix_peers, const char *who)
{
	struct netmatch m = {.all = all != 0, .unix_peers = unix_peers != 0};
	Py_ssize_t n;

	if (!PyList_Check(nets)) {
		PyErr_Format(PyExc_TypeError, "%s: nets must be a list of (packed address, prefix length)",
		             who);
		return -1;
	}
	n = PyList_GET_SIZE(nets);
	if (n > NETMATCH_MAX) {
		PyErr_Format(PyExc_ValueError, "%s: %zd networks, at most %d", who, n, NETMATCH_MAX);
		return -1;
	}
	if (!(m.nets = PyMem_Calloc((size_t)n + 1, sizeof(*m.nets)))) {
		PyErr_NoMemory();
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		struct net_cidr *net = &m.nets[i];
		PyObject *addr;
		unsigned bits, scope = 0;
		Py_ssize_t alen;

		if (!PyTuple_Check(PyList_GET_ITEM(nets, i))) {
			PyErr_Format(PyExc_TypeError, "%s: network %zd is not a tuple", who, i);
			goto fail;
		}
		if (!PyArg_ParseTuple(PyList_GET_ITEM(nets, i), "SI|I", &addr, &bits, &scope))
			goto fail;
		alen = PyBytes_GET_SIZE(addr);
		if ((alen != 4 && alen != 16) || bits > 8 * (unsigned)alen || (scope && alen != 16)) {
			PyErr_Format(PyExc_ValueError, "%s: network %zd is not (4 or 16 address bytes, a "
			             "prefix length within them[, an IPv6 zone's interface index])", who, i);
			goto fail;
		}
		net->family = alen == 4 ? AF_INET : AF_INET6;
		net->bits = bits;
		net->scope = scope;
		memcpy(net->addr, PyBytes_AS_STRING(addr), (size_t)alen);
		m.nnets++;
	}
	netmatch_free(out);
	*out = m;
	return 0;
fail:
	PyMem_Free(m.nets);
	return -1;
}
