/* sockherd HTTP/1.1 request parsing: checking the head once llhttp read it
 * whole (httpparse.h lists what): the HTTP version, Host, the form of the
 * target, Transfer-Encoding against Content-Length and the body limit; then
 * the pause before a body. Caller: llhttp, inside httpparse.c's
 * llhttp_execute (on_headers_complete in its settings), one thread per
 * hp_parser at a time. */
#include <string.h>
#include <strings.h>

#include "httpcallbacks.h"

/* The field's value without the OWS llhttp leaves after it. */
static const char *field_value(const struct hp_parser *p, const struct hp_field *f, uint32_t *len)
{
	const char *v = p->head + f->value;
	uint32_t n = f->value_len;

	while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
		n--;
	*len = n;
	return v;
}

/* RFC 9112 6.1, 6.3: the Transfer-Encoding fields as one list. llhttp
 * frames by it when it ends in chunked (whatever comes before) and lets an
 * empty one stand beside Content-Length. We decode chunked only: it must
 * be there exactly once and last, with nothing before it (else 501, as 6.1
 * says for a coding the server does not understand). Empty list elements
 * are ignored (RFC 9110 5.6.1). 0, or refused. */
static int check_transfer_encoding(struct hp_parser *p)
{
	int tokens = 0, chunked = 0, last_chunked = 0;

	for (uint32_t i = 0; i < p->nfields; i++) {
		const struct hp_field *f = &p->fields[i];
		const char *v = p->head + f->value, *end = v + f->value_len, *item;
		size_t len;

		if (!is_name(p->head + f->name, f->name_len, "transfer-encoding"))
			continue;
		while (hp_list_next(&v, end, &item, &len))
			if (len) {
				tokens++;
				last_chunked = is_name(item, (uint32_t)len, "chunked");
				chunked += last_chunked;
			}
	}
	if (!tokens)
		return refuse(p, 400, "empty Transfer-Encoding");
	if (!last_chunked)
		return refuse(p, 400, "Transfer-Encoding does not end in chunked");
	if (chunked > 1)
		return refuse(p, 400, "Transfer-Encoding applies chunked more than once");
	if (tokens > 1)
		return refuse(p, 501, "transfer coding not implemented (only chunked is decoded)");
	return 0;
}

/* RFC 9112 3.2 (RFC 3986 3.2.2, 3.2.3): Host is one uri-host [":" port],
 * uri-host an IP-literal in brackets or a reg-name. Anything else is
 * refused, the comma first: "a, b" is two Host values joined, read by
 * some as the first, by others as the last. An empty Host is allowed
 * (3.2), so is an empty port (RFC 3986: port = *DIGIT). */
static int valid_host(const char *v, uint32_t len)
{
	static const char reg[] = "-._~%!$&'()*+;=";          /* ALPHA DIGIT besides */
	static const char literal[] = "-._~%!$&'()*+;=:";      /* v6, IPvFuture */
	const char *end = v + len, *s = v;

	if (s < end && *s == '[') {
		for (s++; s < end && *s != ']'; s++)
			if (!ascii_alnum(*s) && (!*s || !strchr(literal, *s)))
				return 0;
		if (s == end)
			return 0;                            /* no closing bracket */
		s++;
	}
	else
		for (; s < end && *s != ':'; s++)
			if (!ascii_alnum(*s) && (!*s || !strchr(reg, *s)))
				return 0;
	if (s < end && *s++ != ':')
		return 0;
	for (; s < end; s++)
		if (*s < '0' || *s > '9')
			return 0;
	return 1;
}

int hp_on_headers_complete(llhttp_t *ll)
{
	struct hp_parser *p = P(ll);
	int has_length = !!(ll->flags & F_CONTENT_LENGTH);
	uint32_t host, host_len, path;

	if (ll->http_major != 1) {
		/* HTTP/0.9 (llhttp takes a line without a version for one) */
		refuse(p, 400, "request line without an HTTP version");
		return -1;
	}
	if (ll->http_minor == 1 && !p->hosts) {
		refuse(p, 400, "missing Host field");
		return -1;
	}
	if (p->host >= 0) {
		uint32_t len;
		const char *v = field_value(p, &p->fields[p->host], &len);

		if (!valid_host(v, len)) {
			refuse(p, 400, "Host is not one host[:port]");
			return -1;
		}
	}
	if (p->url_len && p->head[0] == '*') {
		/* llhttp takes bytes after the "*" ("*x", "*?q", a path): the
		 * asterisk-form is "*" alone (3.2.4), else no form at all */
		if (p->url_len != 1) {
			refuse(p, 400, "a request-target starting with * is \"*\" alone");
			return -1;
		}
		if (ll->method != HTTP_OPTIONS) {
			refuse(p, 400, "a * request-target is for OPTIONS only");
			return -1;
		}
	}
	if (hp_absolute(p, &host, &host_len, &path)) {
		/* the URI of an origin server is http or https (RFC 9110 4.2),
		 * its host never empty there (4.2.1) */
		if (strncasecmp(p->head, "http://", 7) && strncasecmp(p->head, "https://", 8)) {
			refuse(p, 400, "absolute-form request-target of a scheme other than http(s)");
			return -1;
		}
		if (!host_len || !valid_host(p->head + host, host_len)) {
			refuse(p, 400, "absolute-form request-target without a valid host");
			return -1;
		}
		if (memchr(p->head, '@', host)) {
			/* RFC 9110 4.2.4: userinfo in an http(s) URI is an error (it
			 * serves to mislead about which host is meant) */
			refuse(p, 400, "userinfo in an absolute-form request-target");
			return -1;
		}
	}
	if (p->te_fields) {
		if (ll->http_minor == 0) {
			refuse(p, 400, "Transfer-Encoding in an HTTP/1.0 request");
			return -1;
		}
		if (has_length) {
			refuse(p, 400, "Transfer-Encoding with Content-Length");
			return -1;
		}
		if (check_transfer_encoding(p))
			return -1;
	}
	p->length = has_length ? (int64_t)ll->content_length : -1;
	if (p->lim.body && has_length && ll->content_length > p->lim.body) {
		refuse(p, 413, "request body too large");
		return -1;
	}
	p->state = HP_BODY;
	/* a request with a body stops here, so the caller can answer before
	 * any of it is read (100-continue, a 413); one without goes straight
	 * on to on_message_complete, which stops there */
	if ((ll->flags & F_CHUNKED) || (has_length && ll->content_length))
		return HPE_PAUSED;
	return 0;
}
