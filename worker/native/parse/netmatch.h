/* Allow lists of peers, one way for both settings that have one:
 * forwarded_allow_ips (forwarded.h: whose forwarding fields are believed)
 * and proxy_allow_from (conn_proxy.c: who may send a PROXY header). The
 * settings are parsed in Python (worker/netmatch.py: addresses, CIDR
 * networks, "*", "unix"); the engine gets the networks as (packed
 * address, prefix length) pairs and the two flags, and matches a peer
 * here, at accept, with a few prefix compares.
 *
 * Threads: a list is set before the first connection (the Server's
 * set_forwarded, set_proxy) and only read after, by any loop thread.
 */
#ifndef SOCKHERD_NETMATCH_H
#define SOCKHERD_NETMATCH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define NETMATCH_MAX 4096                  /* networks in one list */

/* one network: family AF_INET (4 bytes of addr) or AF_INET6 (16); scope
 * an IPv6 zone's interface index (fe80::1%eth0), 0 for any interface */
struct net_cidr {
	int family;
	unsigned bits, scope;
	unsigned char addr[16];
};

struct netmatch {
	unsigned all : 1,                      /* "*": every peer */
	         unix_peers : 1;               /* "unix": a unix-socket peer */
	int nnets;
	struct net_cidr *nets;
};

/* *out set from nets (a list of (bytes of 4 or 16, prefix length within
 * them[, interface index of a 16 bytes' zone]), at most NETMATCH_MAX),
 * all and unix_peers; the old list freed.
 * 0, or -1 with a ValueError naming who (the Server method) and *out as
 * it was. */
int netmatch_set(struct netmatch *out, PyObject *nets, int all, int unix_peers, const char *who);
void netmatch_free(struct netmatch *m);
/* Whether m allows an address of family fam (AF_INET: 4 bytes at a,
 * AF_INET6: 16; a v4-mapped one as its IPv4 address), on no known
 * interface (a forwarding field's): a network with a zone never does. Pure. */
int netmatch_addr(const struct netmatch *m, int fam, const unsigned char *a);
/* Whether m allows a peer of this socket address (AF_UNIX: "*" or
 * unix_peers; AF_UNSPEC, an unknown peer: "*" only; AF_INET6 with its
 * sin6_scope_id against a network's zone; another family, or len too
 * short: never). Pure. */
struct sockaddr;
int netmatch_peer(const struct netmatch *m, const struct sockaddr *sa, unsigned len);

#endif /* SOCKHERD_NETMATCH_H */
