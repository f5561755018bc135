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
 * May call: fwd_trust.c (the allow list); the codec's parsed head (h1.h)
 * is read, never called; Python only for the log callable.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <strings.h>

#include "h1.h"

/* ---- values ---------------------------------------------------------------------------------- */

static int is_ows(char ch) { return ch == ' ' || ch == '\t'; }

/* s[0 .. n) without its leading and trailing OWS */
static void trim(const char **s, size_t *n)
{
	while (*n && is_ows(**s)) {
		(*s)++;
		(*n)--;
	}
	while (*n && is_ows((*s)[*n - 1]))
		(*n)--;
}

/* the rightmost comma-separated element of a field value, trimmed */
static void rightmost(const char **s, size_t *n)
{
	for (size_t i = *n; i-- > 0;)
		if ((*s)[i] == ',') {
			*s += i + 1;
			*n -= i + 1;
			break;
		}
	trim(s, n);
}

/* decimal port 1..65535, all of s; -1 if not one */
static int port_num(const char *s, size_t n)
{
	int v = 0;

	if (!n || n > 5)
		return -1;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (s[i] - '0');
	}
	return v >= 1 && v <= 65535 ? v : -1;
}

/* inet_pton of s[0 .. n) (not NUL-terminated): 1 parsed, 0 not an address */
static int pton(int fam, const char *s, size_t n, unsigned char *out)
{
	char buf[INET6_ADDRSTRLEN + 1];

	if (!n || n >= sizeof(buf))
		return 0;
	memcpy(buf, s, n);
	buf[n] = 0;
	return inet_pton(fam, buf, out) == 1;
}

/* A node: an X-Forwarded-For entry or a for= value. */
struct node {
	int family;                        /* AF_INET(6); 0: "unknown" or obfuscated (RFC 7239 6) */
	unsigned char addr[16];
	int port;                          /* 0 none or obfuscated */
};

static int obfuscated(const char *s, size_t n)
{
	if (n < 2 || s[0] != '_')
		return 0;
	for (size_t i = 1; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
		      (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '_' || s[i] == '-'))
			return 0;
	return 1;
}

/* 1 parsed, 0 malformed. IPv4[:port], [IPv6][:port], "unknown", an
 * obfuscated name; a bare IPv6 only in X-Forwarded-For (bare_v6), which
 * has no brackets by custom, while RFC 7239 requires them. */
static int parse_node(const char *s, size_t n, int bare_v6, struct node *out)
{
	const char *colon;

	memset(out, 0, sizeof(*out));
	if ((n == 7 && !strncasecmp(s, "unknown", 7)) || obfuscated(s, n))
		return 1;
	if (n && s[0] == '[') {
		const char *end = memchr(s, ']', n);
		size_t rest;

		if (!end || !pton(AF_INET6, s + 1, (size_t)(end - s - 1), out->addr))
			return 0;
		out->family = AF_INET6;
		rest = n - (size_t)(end + 1 - s);
		if (!rest)
			return 1;
		if (end[1] != ':')
			return 0;
		if (obfuscated(end + 2, rest - 1))
			return 1;
		return (out->port = port_num(end + 2, rest - 1)) > 0;
	}
	if (pton(AF_INET, s, n, out->addr)) {
		out->family = AF_INET;
		return 1;
	}
	colon = memchr(s, ':', n);
	if (colon && !memchr(colon + 1, ':', n - (size_t)(colon + 1 - s))) {
		if (!pton(AF_INET, s, (size_t)(colon - s), out->addr))
			return 0;
		out->family = AF_INET;
		if (obfuscated(colon + 1, n - (size_t)(colon + 1 - s)))
			return 1;
		return (out->port = port_num(colon + 1, n - (size_t)(colon + 1 - s))) > 0;
	}
	if (bare_v6 && pton(AF_INET6, s, n, out->addr)) {
		out->family = AF_INET6;
		return 1;
	}
	return 0;
}

/* host[:port] as RFC 3986's reg-name or IP-literal: the characters a Host
 * may have, so that nothing else reaches SERVER_NAME or a redirect */
static int host_ok(const char *s, size_t n)
{
	const char *end = s + n, *p = s;

	if (!n || n > 255)
		return 0;
	if (*p == '[') {
		const char *close = memchr(p, ']', n);
		unsigned char a[16];

		if (!close || !pton(AF_INET6, p + 1, (size_t)(close - p - 1), a))
			return 0;
		p = close + 1;
	}
	else {
		for (; p < end && *p != ':'; p++)
			if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
			      *p == '.' || *p == '-' || *p == '_' || *p == '~'))
				return 0;
		if (p == s)
			return 0;
	}
	return p == end || (*p == ':' && port_num(p + 1, (size_t)(end - p - 1)) > 0);
}

/* a path prefix: '/', then path characters (no query, fragment, space,
 * control, backslash, no "." or ".." segment); its trailing '/' off */
static int prefix_ok(const char *s, size_t *n)
{
	if (!*n || s[0] != '/')
		return 0;
	for (size_t i = 0; i < *n; i++) {
		unsigned char ch = (unsigned char)s[i];

		if (ch <= ' ' || ch >= 0x7f || ch == '?' || ch == '#' || ch == '\\' || ch == '"')
			return 0;
		if (ch == '.' && s[i - 1] == '/' &&
		    (i + 1 == *n || s[i + 1] == '/' || (s[i + 1] == '.' && (i + 2 == *n || s[i + 2] == '/'))))
			return 0;
	}
	while (*n && s[*n - 1] == '/')
		(*n)--;
	return 1;
}

/* ---- Forwarded (RFC 7239 4) -------------------------------------------------------------------- */

struct element {
	const char *for_, *proto, *host;
	size_t for_len, proto_len, host_len;
};

#define MAX_ELEMENTS 32                /* hops; a longer chain is ignored */

static int tchar(char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
	       (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

/* One field value's elements appended to el[*count ..): 1, or 0 if
 * malformed (a quoted-pair, which no address or scheme needs, counts as
 * malformed too) or more than MAX_ELEMENTS in all. */
static int parse_forwarded(const char *s, size_t n, struct element *el, int *count)
{
	size_t i = 0;
	int open = 0;                      /* el[*count] has a pair */

	for (;;) {
		const char *name, *val;
		size_t nl, vl;
		const char **slot;
		size_t *slot_len;

		while (i < n && is_ows(s[i]))
			i++;
		if (i == n || s[i] == ',') {
			if (open)
				(*count)++;
			open = 0;
			if (i == n)
				return 1;
			i++;
			continue;
		}
		if (s[i] == ';') {
			i++;
			continue;
		}
		if (!open) {
			if (*count == MAX_ELEMENTS)
				return 0;
			memset(&el[*count], 0, sizeof(el[0]));
			open = 1;
		}
		name = s + i;
		while (i < n && tchar(s[i]))
			i++;
		nl = (size_t)(s + i - name);
		if (!nl || i == n || s[i] != '=')
			return 0;
		i++;
		if (i < n && s[i] == '"') {
			val = s + ++i;
			while (i < n && s[i] != '"') {
				if (s[i] == '\\' || (unsigned char)s[i] < ' ' || s[i] == 0x7f)
					return 0;
				i++;
			}
			if (i == n)
				return 0;
			vl = (size_t)(s + i - val);
			i++;
		}
		else {
			val = s + i;
			while (i < n && tchar(s[i]))
				i++;
			vl = (size_t)(s + i - val);
		}
		while (i < n && is_ows(s[i]))
			i++;
		if (i < n && s[i] != ';' && s[i] != ',')
			return 0;
		if (nl == 3 && !strncasecmp(name, "for", 3))
			slot = &el[*count].for_, slot_len = &el[*count].for_len;
		else if (nl == 5 && !strncasecmp(name, "proto", 5))
			slot = &el[*count].proto, slot_len = &el[*count].proto_len;
		else if (nl == 4 && !strncasecmp(name, "host", 4))
			slot = &el[*count].host, slot_len = &el[*count].host_len;
		else
			continue;                  /* by=, an extension: not ours */
		if (*slot)
			return 0;                  /* a parameter twice in an element (RFC 7239 4) */
		*slot = val;
		*slot_len = vl;
	}
}

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
	trim(s, n);
}

/* An ignored value: reported to the log callable (peer, field, value). */
static int malformed(HttpConn *c, const char *field, const char *v, size_t n)
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
static int walk_xff(HttpConn *c, const struct hp_parser *hp, struct node *out)
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
			trim(&b, &len);
			if (!len)
				continue;              /* an empty list element (RFC 9110 5.6.1) */
			if (!parse_node(b, len, 1, out)) {
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

/* The Forwarded fields' element the walk stops at (as walk_xff): 1 found
 * (*el), 0 none or malformed, -1 error. */
static int walk_forwarded(HttpConn *c, const struct hp_parser *hp, struct element *chosen,
                          struct node *node)
{
	const struct fwd_rules *r = &c->srv->fwd;
	struct element el[MAX_ELEMENTS];
	int count = 0;

	for (uint32_t i = 0; i < hp->nfields; i++) {
		const char *s;
		size_t n;

		if (!field_is(hp, &hp->fields[i], "forwarded", 9))
			continue;
		value_of(hp, (int)i, &s, &n);
		if (!parse_forwarded(s, n, el, &count))
			return malformed(c, "Forwarded", s, n) < 0 ? -1 : 0;
	}
	for (int k = count; k-- > 0;) {
		*chosen = el[k];
		memset(node, 0, sizeof(*node));
		if (el[k].for_ && !parse_node(el[k].for_, el[k].for_len, 0, node))
			return malformed(c, "Forwarded", el[k].for_, el[k].for_len) < 0 ? -1 : 0;
		if (!node->family || !netmatch_addr(&r->allow, node->family, node->addr))
			break;                     /* no for=, unknown, obfuscated: untrusted */
	}
	return count > 0;
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
static int scheme_headers(HttpConn *c, const struct hp_parser *hp, const struct seen *seen)
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
		rightmost(&s, &n);
		says = n == r->scheme[k].value_len && !strncasecmp(s, r->scheme[k].value, n);
		if (https >= 0 && says != https) {
			value_of(hp, seen->scheme_last[k], &s, &n);
			return malformed(c, r->scheme[k].name, s, n) < 0 ? -2 : -1;
		}
		https = says;
	}
	return https;
}

int fwd_read(HttpConn *c, struct fwd_found *f)
{
	const struct fwd_rules *r = &c->srv->fwd;
	const struct hp_parser *hp = ((Parser *)c->parser)->hp;
	struct seen seen;
	struct element el;
	struct node node;
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
			if (host_ok(el.host, el.host_len))
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
		rightmost(&s, &n);
		if (host_ok(s, n))
			f->host = s, f->host_len = n;
		else if (malformed(c, "X-Forwarded-Host", s, n) < 0)
			return -1;
	}
	if (seen.last[F_PORT] >= 0) {
		value_of(hp, seen.last[F_PORT], &s, &n);
		rightmost(&s, &n);
		if ((f->server_port = port_num(s, n)) < 0 && malformed(c, "X-Forwarded-Port", s, n) < 0)
			return -1;
	}
	if (seen.last[F_PREFIX] >= 0) {
		value_of(hp, seen.last[F_PREFIX], &s, &n);
		rightmost(&s, &n);
		if (prefix_ok(s, &n))
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
