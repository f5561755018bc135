/* Trusted proxy headers, the values' syntax: what an X-Forwarded-For
 * entry, a Forwarded element (RFC 7239 4), a host[:port], a port and a
 * path prefix may look like, parsed from bytes. Pure functions of their
 * input (no Python, no connection, no parser); fwd_fields.c, which reads
 * a trusted head's fields, calls them (fwd_syntax.h).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <strings.h>

#include "fwd_syntax.h"

/* ---- values ---------------------------------------------------------------------------------- */

static int is_ows(char ch) { return ch == ' ' || ch == '\t'; }

/* s[0 .. n) without its leading and trailing OWS */
void fwd_trim(const char **s, size_t *n)
{
	while (*n && is_ows(**s)) {
		(*s)++;
		(*n)--;
	}
	while (*n && is_ows((*s)[*n - 1]))
		(*n)--;
}

/* the rightmost comma-separated element of a field value, trimmed */
void fwd_rightmost(const char **s, size_t *n)
{
	for (size_t i = *n; i-- > 0;)
		if ((*s)[i] == ',') {
			*s += i + 1;
			*n -= i + 1;
			break;
		}
	fwd_trim(s, n);
}

/* decimal port 1..65535, all of s; -1 if not one */
int fwd_port_num(const char *s, size_t n)
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
int fwd_parse_node(const char *s, size_t n, int bare_v6, struct fwd_node *out)
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
		return (out->port = fwd_port_num(end + 2, rest - 1)) > 0;
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
		return (out->port = fwd_port_num(colon + 1, n - (size_t)(colon + 1 - s))) > 0;
	}
	if (bare_v6 && pton(AF_INET6, s, n, out->addr)) {
		out->family = AF_INET6;
		return 1;
	}
	return 0;
}

/* host[:port] as RFC 3986's reg-name or IP-literal: the characters a Host
 * may have, so that nothing else reaches SERVER_NAME or a redirect */
int fwd_host_ok(const char *s, size_t n)
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
	return p == end || (*p == ':' && fwd_port_num(p + 1, (size_t)(end - p - 1)) > 0);
}

/* a path prefix: '/', then path characters (no query, fragment, space,
 * control, backslash, no "." or ".." segment, no empty one: "//evil.example"
 * as SCRIPT_NAME makes the app's links protocol-relative, another host's,
 * issue 35 §25); its trailing '/' off first (a proxy's "location /app/") */
int fwd_prefix_ok(const char *s, size_t *n)
{
	if (!*n || s[0] != '/')
		return 0;
	while (*n && s[*n - 1] == '/')
		(*n)--;
	for (size_t i = 0; i < *n; i++) {
		unsigned char ch = (unsigned char)s[i];

		if (ch <= ' ' || ch >= 0x7f || ch == '?' || ch == '#' || ch == '\\' || ch == '"')
			return 0;
		if (ch == '/' && i && s[i - 1] == '/')
			return 0;
		if (ch == '.' && s[i - 1] == '/' &&
		    (i + 1 == *n || s[i + 1] == '/' || (s[i + 1] == '.' && (i + 2 == *n || s[i + 2] == '/'))))
			return 0;
	}
	return 1;
}

/* ---- Forwarded (RFC 7239 4) -------------------------------------------------------------------- */

static int tchar(char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
	       (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

/* The element of s that ends at *n, parsed from its end (RFC 7239 4:
 * pair *( ";" pair ), pair = token "=" ( token / quoted-string )). Read
 * backwards so that whatever stands left of an element, however broken,
 * cannot change how the element itself parses: a proxy appends its
 * element to what the client sent, so the rightmost elements are the
 * trusted ones. A quoted-string is read back to the quote before it; a
 * backslash (a quoted-pair, which no address or scheme needs) or a control
 * byte in it is malformed, so an escaped quote never ends one. */
int fwd_prev_element(const char *s, size_t *n, int *more, struct fwd_element *out)
{
	size_t i = *n;
	int pairs = 0, need_sep = 0;

	memset(out, 0, sizeof(*out));
	for (;;) {
		const char *name, *val, **slot;
		size_t nl, vl, *slot_len;

		while (i && is_ows(s[i - 1]))
			i--;
		if (!i || s[i - 1] == ',') {
			*more = i > 0;
			*n = i ? i - 1 : 0;
			return pairs ? FWD_EL_OK : FWD_EL_EMPTY;
		}
		if (s[i - 1] == ';') {
			i--;
			need_sep = 0;
			continue;
		}
		if (need_sep)
			return FWD_EL_BAD;         /* two pairs with no ';' between */
		if (s[i - 1] == '"') {
			size_t q = i - 1;

			while (q && s[q - 1] != '"') {
				unsigned char ch = (unsigned char)s[q - 1];

				if (ch == '\\' || ch < ' ' || ch == 0x7f)
					return FWD_EL_BAD;
				q--;
			}
			if (!q)
				return FWD_EL_BAD;     /* no opening quote */
			val = s + q;
			vl = i - 1 - q;
			i = q - 1;
		}
		else {
			size_t e = i;

			while (i && tchar(s[i - 1]))
				i--;
			val = s + i;
			vl = e - i;
		}
		if (!i || s[i - 1] != '=')
			return FWD_EL_BAD;
		i--;
		{
			size_t e = i;

			while (i && tchar(s[i - 1]))
				i--;
			name = s + i;
			nl = e - i;
		}
		if (!nl)
			return FWD_EL_BAD;
		need_sep = 1;
		pairs = 1;
		if (nl == 3 && !strncasecmp(name, "for", 3))
			slot = &out->for_, slot_len = &out->for_len;
		else if (nl == 5 && !strncasecmp(name, "proto", 5))
			slot = &out->proto, slot_len = &out->proto_len;
		else if (nl == 4 && !strncasecmp(name, "host", 4))
			slot = &out->host, slot_len = &out->host_len;
		else
			continue;                  /* by=, an extension: not ours */
		if (*slot)
			return FWD_EL_BAD;         /* a parameter twice in an element (RFC 7239 4) */
		*slot = val;
		*slot_len = vl;
	}
}
