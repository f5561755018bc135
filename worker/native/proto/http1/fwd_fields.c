/* Trusted proxy headers, the codec's part: the forwarding fields of a
 * trusted connection's request head read (fwd_read), and the helpers the
 * adapters put what they say with (wsgi_forwarded.c, asgi_forwarded.c).
 * forwarded.h says when each part runs and what it costs.
 *
 * The client is the rightmost address not itself trusted: each proxy
 * appends the address it received from, so everything right of the first
 * untrusted entry was written by a proxy we trust, and everything left of
 * it may be the client's own invention. With every entry trusted ("*"),
 * the leftmost is the client. The same walk serves X-Forwarded-For and
 * RFC 7239's for=; the Forwarded element it stops at also gives proto=
 * and host= (what the proxy that met the client saw). Forwarded wins over
 * the X-Forwarded-* fields, attribute by attribute.
 *
 * Repeated fields are one list in order (RFC 9110 5.3); a single-valued
 * field (a scheme header, -Host, -Port, -Prefix) takes its rightmost
 * value: the one the nearest proxy wrote, after whatever the client sent.
 *
 * May call: fwd_trust.c (the allow list), fwd_syntax.c (what each value
 * may look like, parsed); the codec's parsed head (h1.h)
 * is read, never called; Python only for the log callable.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <strings.h>

#include "h1.h"
#include "fwd_syntax.h"

/* ---- reading a head ---------------------------------------------------------------------------- */

/* the fields a trusted head may carry, by kind */
enum { F_FORWARDED, F_XFF, F_HOST, F_PORT, F_PREFIX, F_KINDS };

struct seen {
	int last[F_KINDS];                 /* index of the last field of the kind, -1 none */
	int scheme_last[8];                /* ... of each secure_scheme_headers entry */
};

static int field_is(const struct hp_parser *hp, const struct hp_field *f, const char *name, size_t n)
{
	return f->name_len == n && !strncasecmp(hp->head + f->name, name, n);
}

static void value_of(const struct hp_parser *hp, int i, const char **s, size_t *n)
{
	*s = hp->head + hp->fields[i].value;
	*n = hp->fields[i].value_len;
	fwd_trim(s, n);
}

/* An ignored value: reported to the log callable (peer, field, value). */
static int malformed(struct conn *c, const char *field, const char *v, size_t n)
{
	PyObject *log = c->srv->fwd.log, *r;

	if (!log)
		return 0;
	r = PyObject_CallFunction(log, "Osy#", c->peer, field, v, (Py_ssize_t)n);
	Py_XDECREF(r);
	return r ? 0 : -1;
}

/* The rightmost untrusted node of a list walked from the right: the
 * X-Forwarded-For fields (last field first, each right to left). 1 found,
 * 0 none or malformed (reported), -1 error. */
static int walk_xff(struct conn *c, const struct hp_parser *hp, struct fwd_node *out)
{
	const struct fwd_rules *r = &c->srv->fwd;
	int found = 0;

	for (int i = (int)hp->nfields; i-- > 0;) {
		const char *s, *e;
		size_t n;

		if (!field_is(hp, &hp->fields[i], "x-forwarded-for", 15))
			continue;
		value_of(hp, i, &s, &n);
		for (e = s + n; e > s;) {
			const char *b = e;
			size_t len;

			while (b > s && b[-1] != ',')
				b--;
			len = (size_t)(e - b);
			e = b > s ? b - 1 : s;
			fwd_trim(&b, &len);
			if (!len)
				continue;              /* an empty list element (RFC 9110 5.6.1) */
			if (!fwd_parse_node(b, len, 1, out)) {
				value_of(hp, i, &s, &n);
				return malformed(c, "X-Forwarded-For", s, n) < 0 ? -1 : 0;
			}
			found = 1;
			if (!out->family || !netmatch_addr(&r->allow, out->family, out->addr))
				return 1;
		}
	}
	return found;                       /* every entry trusted: the leftmost is out */
}

/* The Forwarded fields' element the walk stops at (as walk_xff: last
 * field first, each right to left, fwd_prev_element). What is left of the
 * element we stop at is never read, so that a client's own part, however
 * broken, cannot undo what the trusted proxies right of it appended (RFC
 * 7239's recipe: the proxy adds its element after the client's field). A
 * malformed element, or one past FWD_MAX_ELEMENTS, is where the list ends
 * for us: the client is then the leftmost good element's (as when every
 * hop is trusted). 1 found (*chosen, *node), 0 none, -1 error. */
static int walk_forwarded(struct conn *c, const struct hp_parser *hp, struct fwd_element *chosen,
                          struct fwd_node *node)
{
	const struct fwd_rules *r = &c->srv->fwd;
	int count = 0;

	for (int i = (int)hp->nfields; i-- > 0;) {
		const char *s;
		size_t n;
		int more = 1;

		if (!field_is(hp, &hp->fields[i], "forwarded", 9))
			continue;
		value_of(hp, i, &s, &n);
		while (more) {
			struct fwd_element el;
			struct fwd_node at;
			size_t end = n;
			int rc = fwd_prev_element(s, &n, &more, &el);

			if (rc == FWD_EL_EMPTY)
				continue;
			if (rc == FWD_EL_BAD || count == FWD_MAX_ELEMENTS ||
			    (el.for_ && !fwd_parse_node(el.for_, el.for_len, 0, &at)))
				/* the element as far as it goes: what it starts with is unknown */
				return malformed(c, "Forwarded", s, end) < 0 ? -1 : count > 0;
			if (!el.for_)
				memset(&at, 0, sizeof(at));
			*chosen = el;
			*node = at;
			count++;
			if (!at.family || !netmatch_addr(&r->allow, at.family, at.addr))
				return 1;              /* no for=, unknown, obfuscated: untrusted */
		}
	}
	return count > 0;                   /* every hop trusted: the leftmost */
}

/* "http" / "https" (any case): 0 / 1, else -1 */
static int proto_of(const char *s, size_t n)
{
	if (n == 4 && !strncasecmp(s, "http", 4))
		return 0;
	if (n == 5 && !strncasecmp(s, "https", 5))
		return 1;
	return -1;
}

/* secure_scheme_headers: 1 / 0 as they agree, -1 none present or they
 * disagree (gunicorn refuses the request then; we ignore them), -2 error */
static int scheme_headers(struct conn *c, const struct hp_parser *hp, const struct seen *seen)
{
	const struct fwd_rules *r = &c->srv->fwd;
	int https = -1;

	for (int k = 0; k < r->nscheme; k++) {
		const char *s;
		size_t n;
		int says;

		if (seen->scheme_last[k] < 0)
			continue;
		value_of(hp, seen->scheme_last[k], &s, &n);
		fwd_rightmost(&s, &n);
		says = n == r->scheme[k].value_len && !strncasecmp(s, r->scheme[k].value, n);
		if (https >= 0 && says != https) {
			value_of(hp, seen->scheme_last[k], &s, &n);
			return malformed(c, r->scheme[k].name, s, n) < 0 ? -2 : -1;
		}
		https = says;
	}
	return https;
}

int fwd_read(struct conn *c, struct fwd_found *f)
{
	const struct fwd_rules *r = &c->srv->fwd;
	const struct hp_parser *hp = ((Parser *)c->parser)->hp;
	struct seen seen;
	struct fwd_element el;
	struct fwd_node node;
	int any = 0, rc;
	const char *s;
	size_t n;

	memset(f, 0, sizeof(*f));
	f->https = -1;
	f->server_port = -1;
	for (int k = 0; k < F_KINDS; k++)
		seen.last[k] = -1;
	for (int k = 0; k < 8; k++)
		seen.scheme_last[k] = -1;
	/* one pass over the names: most heads have none of these */
	for (uint32_t i = 0; i < hp->nfields; i++) {
		const struct hp_field *fd = &hp->fields[i];

		if (fd->name_len < 9)
			continue;
		if (field_is(hp, fd, "forwarded", 9))
			seen.last[F_FORWARDED] = (int)i, any = 1;
		else if (field_is(hp, fd, "x-forwarded-for", 15))
			seen.last[F_XFF] = (int)i, any = 1;
		else if ((r->forwarder & FWD_HOST) && field_is(hp, fd, "x-forwarded-host", 16))
			seen.last[F_HOST] = (int)i, any = 1;
		else if ((r->forwarder & FWD_PORT) && field_is(hp, fd, "x-forwarded-port", 16))
			seen.last[F_PORT] = (int)i, any = 1;
		else if ((r->forwarder & FWD_PREFIX) && field_is(hp, fd, "x-forwarded-prefix", 18))
			seen.last[F_PREFIX] = (int)i, any = 1;
		for (int k = 0; k < r->nscheme; k++)
			if (field_is(hp, fd, r->scheme[k].name, r->scheme[k].name_len))
				seen.scheme_last[k] = (int)i, any = 1;
	}
	if (!any)
		return 0;
	memset(&el, 0, sizeof(el));
	if (seen.last[F_FORWARDED] >= 0) {
		if ((rc = walk_forwarded(c, hp, &el, &node)) < 0)
			return -1;
		if (rc && node.family) {
			f->family = node.family;
			memcpy(f->addr, node.addr, sizeof(f->addr));
			f->port = node.port;
		}
		if (rc && el.proto && (f->https = proto_of(el.proto, el.proto_len)) < 0 &&
		    malformed(c, "Forwarded", el.proto, el.proto_len) < 0)
			return -1;
		if (rc && el.host && (r->forwarder & FWD_HOST)) {
			if (fwd_host_ok(el.host, el.host_len))
				f->host = el.host, f->host_len = el.host_len;
			else if (malformed(c, "Forwarded", el.host, el.host_len) < 0)
				return -1;
		}
		if (!rc)
			memset(&el, 0, sizeof(el));
	}
	/* Forwarded's for= wins; X-Forwarded-For only when it gave none */
	if (!el.for_ && seen.last[F_XFF] >= 0) {
		if ((rc = walk_xff(c, hp, &node)) < 0)
			return -1;
		if (rc && node.family) {
			f->family = node.family;
			memcpy(f->addr, node.addr, sizeof(f->addr));
			f->port = node.port;
		}
	}
	if (f->https < 0 && (f->https = scheme_headers(c, hp, &seen)) == -2)
		return -1;
	if (!f->host && seen.last[F_HOST] >= 0) {
		value_of(hp, seen.last[F_HOST], &s, &n);
		fwd_rightmost(&s, &n);
		if (fwd_host_ok(s, n))
			f->host = s, f->host_len = n;
		else if (malformed(c, "X-Forwarded-Host", s, n) < 0)
			return -1;
	}
	if (seen.last[F_PORT] >= 0) {
		value_of(hp, seen.last[F_PORT], &s, &n);
		fwd_rightmost(&s, &n);
		if ((f->server_port = fwd_port_num(s, n)) < 0 && malformed(c, "X-Forwarded-Port", s, n) < 0)
			return -1;
	}
	if (seen.last[F_PREFIX] >= 0) {
		value_of(hp, seen.last[F_PREFIX], &s, &n);
		fwd_rightmost(&s, &n);
		if (fwd_prefix_ok(s, &n))
			f->prefix = s, f->prefix_len = n;
		else if (malformed(c, "X-Forwarded-Prefix", s, n) < 0)
			return -1;
	}
	return f->family || f->https >= 0 || f->host || f->server_port > 0 || f->prefix_len;
}


/* ---- what the adapters put it with ------------------------------------------------------------- */

PyObject *fwd_addr_str(const struct fwd_found *f)
{
	char buf[INET6_ADDRSTRLEN];

	if (!inet_ntop(f->family, f->addr, buf, sizeof(buf))) {
		PyErr_SetFromErrno(PyExc_OSError);
		return NULL;
	}
	return PyUnicode_FromString(buf);
}

int fwd_prepend(PyObject *d, PyObject *key, const struct fwd_found *f)
{
	PyObject *old = PyDict_GetItemWithError(d, key), *pre;    /* borrowed */
	int rc;

	if (!old && PyErr_Occurred())
		return -1;
	pre = PyUnicode_DecodeLatin1(f->prefix, (Py_ssize_t)f->prefix_len, NULL);
	if (pre && old && PyUnicode_Check(old))
		Py_SETREF(pre, PyUnicode_Concat(pre, old));
	if (!pre)
		return -1;
	rc = PyDict_SetItem(d, key, pre);
	Py_DECREF(pre);
	return rc;
}
