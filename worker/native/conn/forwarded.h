/* Trusted proxy headers (issue 24 §1): which peers may say who the client
 * is (forwarded_allow_ips), and what such a peer's X-Forwarded-For,
 * Forwarded (RFC 7239), scheme headers (secure_scheme_headers) and, when
 * forwarder_headers names them, X-Forwarded-Host / -Port / -Prefix mean.
 *
 * Two moments, two costs:
 *  - at accept (conn_type.c's conn_trust_peer), once per connection: is the
 *    peer in the allow list? (fwd_trusts, fwd_trust.c: a few prefix
 *    compares). The answer is the connection's `trusted` bit. With the
 *    setting empty it is never set.
 *  - per request head, only on a trusted connection: one pass over the
 *    field names (fwd_read, fwd_fields.c), then, if a forwarding field was
 *    there, its values parsed. An untrusted connection's requests never
 *    look.
 *
 * What fwd_read finds is put where each app looks by its adapter
 * (wsgi_forwarded.c: fwd_environ; asgi_forwarded.c: fwd_scope). Parsing
 * is conservative: a
 * value that does not parse is ignored as a whole (the request is served
 * as if it were absent) and reported to the Server's fwd log callable
 * (worker logs it at debug), never an error of the request.
 *
 * Layering: the rules are the connection layer's (fwd_trust.c: the
 * peer's address); the field reading is the codec's (fwd_fields.c: the
 * parsed head, fwd_syntax.c: the values' syntax); each adapter has its
 * own file; none calls up.
 */
#ifndef SOCKHERD_FORWARDED_H
#define SOCKHERD_FORWARDED_H

#include <stdint.h>

#include "netmatch.h"     /* forwarded_allow_ips: the peers trusted */

/* a secure_scheme_headers entry: the field name (lower-case) and the value
 * (compared without case) that means https; any other value means http */
struct fwd_scheme {
	char *name, *value;
	size_t name_len, value_len;
};

enum { FWD_HOST = 1, FWD_PORT = 2, FWD_PREFIX = 4 };     /* forwarder_headers */

struct fwd_rules {
	unsigned on : 1;                   /* some peer may be trusted at all */
	struct netmatch allow;             /* forwarded_allow_ips */
	int nscheme;
	struct fwd_scheme *scheme;
	unsigned forwarder;                /* FWD_* bits */
	PyObject *log;                     /* log(peer, field, value) for an ignored value, or NULL */
};


struct conn;

/* ---- fwd_trust.c (connection layer) ---- */
/* Whether the rules trust a peer of this address (netmatch_peer on the
 * allow list; an address of the chain: netmatch_addr). Pure. */
struct sockaddr;      /* <sys/socket.h>'s send() would clash with asgi_call.c's */
int fwd_trusts(const struct fwd_rules *r, const struct sockaddr *sa, unsigned len);
void fwd_free(struct fwd_rules *r);
/* Server.set_forwarded (the worker's settings, worker/forwarded.py) */
extern PyMethodDef fwd_server_methods[];

#endif /* SOCKHERD_FORWARDED_H */
