/* Trusted proxy headers, the values' syntax (fwd_syntax.c): the parsers
 * fwd_fields.c reads a trusted head's forwarding fields with. Pure
 * functions of bytes; any thread may call them. Internal to the codec's
 * forwarding part: the adapters include forwarded.h only.
 */
#ifndef SOCKHERD_FWD_SYNTAX_H
#define SOCKHERD_FWD_SYNTAX_H

#include <stddef.h>

/* A node: an X-Forwarded-For entry or a for= value. */
struct fwd_node {
	int family;                        /* AF_INET(6); 0: "unknown" or obfuscated (RFC 7239 6) */
	unsigned char addr[16];
	int port;                          /* 0 none or obfuscated */
};

struct fwd_element {
	const char *for_, *proto, *host;
	size_t for_len, proto_len, host_len;
};

#define FWD_MAX_ELEMENTS 32            /* hops read from the right; further left is not read */

/* s[0 .. n) without its leading and trailing OWS */
void fwd_trim(const char **s, size_t *n);
/* the rightmost comma-separated element of a field value, trimmed */
void fwd_rightmost(const char **s, size_t *n);
/* decimal port 1..65535, all of s; -1 if not one */
int fwd_port_num(const char *s, size_t n);
/* A node's value: 1 parsed into *out, 0 malformed (bare_v6: a bare IPv6
 * allowed, X-Forwarded-For's custom). */
int fwd_parse_node(const char *s, size_t n, int bare_v6, struct fwd_node *out);
/* host[:port] with a Host's characters only: 1 yes, 0 no */
int fwd_host_ok(const char *s, size_t n);
/* a path prefix: 1 (its trailing '/' off *n), 0 not one */
int fwd_prefix_ok(const char *s, size_t *n);
/* The Forwarded element of s that ends at *n, parsed from its end:
 * FWD_EL_OK (*out), FWD_EL_EMPTY (an empty list element) or FWD_EL_BAD
 * (malformed: a quoted-pair, a parameter twice...). After OK or EMPTY,
 * *more says whether a ',' is left of it and *n is that comma's index
 * (what is left to read is s[0 .. *n)). */
enum { FWD_EL_BAD, FWD_EL_OK, FWD_EL_EMPTY };
int fwd_prev_element(const char *s, size_t *n, int *more, struct fwd_element *out);

#endif /* SOCKHERD_FWD_SYNTAX_H */
