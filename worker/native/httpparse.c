/* sockherd HTTP/1.1 request parsing on llhttp: see httpparse.h for what is
 * checked where. Callers: one thread per hp_parser at a time (a connection's
 * owner); nothing here is shared between parsers but the static settings. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "httpscan.h"

static struct hp_parser *P(llhttp_t *ll)
{
	return ll->data;
}

/* Records why the request is refused. Data callbacks then return HPE_USER,
 * the others -1; either way llhttp_execute stops with an error and
 * settle() answers with p->status rather than llhttp's generic 400. */
static int refuse(struct hp_parser *p, int status, const char *reason)
{
	if (!p->status) {
		p->status = status;
		p->reason = reason;
	}
	return HPE_USER;
}

/* Appends to the head buffer. Its size is bounded by the limits checked
 * before each append (line + header bytes), so growth is too. */
static int put(struct hp_parser *p, const char *at, size_t n)
{
	if (!n)
		return 0;
	if ((size_t)p->head_len + n > p->head_cap) {
		size_t cap = p->head_cap ? p->head_cap : 1024;
		char *head;

		while (cap < (size_t)p->head_len + n)
			cap *= 2;
		if (cap > UINT32_MAX || !(head = realloc(p->head, cap)))
			return refuse(p, 500, "out of memory for the request head");
		p->head = head;
		p->head_cap = (uint32_t)cap;
	}
	memcpy(p->head + p->head_len, at, n);
	p->head_len += (uint32_t)n;
	return 0;
}

static int on_message_begin(llhttp_t *ll)
{
	struct hp_parser *p = P(ll);

	p->head_len = p->url_len = p->nfields = 0;
	p->in_field = p->in_value = 0;
	p->field_bytes = 0;
	p->hosts = p->te_fields = p->content_types = 0;
	p->version_done = 0;
	p->host = -1;
	p->length = -1;
	p->body_seen = 0;
	p->state = HP_HEAD;
	p->started = 1;
	return 0;
}

static int on_url(llhttp_t *ll, const char *at, size_t n)
{
	struct hp_parser *p = P(ll);

	/* the scanner counts the whole line; this bounds what is kept of it
	 * before the scanner sees the bytes (after llhttp) */
	if (n > p->lim.line || p->url_len + n > p->lim.line)
		return refuse(p, 414, "request line too long");
	p->url_len += (uint32_t)n;
	return put(p, at, n);
}

static int on_version_complete(llhttp_t *ll)
{
	struct hp_parser *p = P(ll);

	if (ll->http_major != 1 || ll->http_minor > 1) {
		refuse(p, 505, "HTTP version not supported");
		return -1;
	}
	p->version_done = 1;
	return 0;
}

/* A field's name and value: bounded here as they are kept, before the
 * scanner counts the whole line (whitespace included) after llhttp. */
static int field_data(struct hp_parser *p, size_t n)
{
	if (n > p->lim.field_size || (p->field_bytes += (uint32_t)n) > p->lim.field_size)
		return refuse(p, 431, "request header field too large");
	return 0;
}

static int on_header_field(llhttp_t *ll, const char *at, size_t n)
{
	struct hp_parser *p = P(ll);

	if (!p->in_field && p->state != HP_BODY)
		p->field_bytes = 0;                 /* a new field starts */
	if (field_data(p, n))
		return HPE_USER;
	if (p->state == HP_BODY) {
		/* a trailer: only its name matters (is it forbidden?) */
		for (size_t i = 0; i < n; i++, p->trailer_len++)
			if (p->trailer_len < sizeof(p->trailer))
				p->trailer[p->trailer_len] = at[i];
		return 0;
	}
	if (!p->in_field) {
		struct hp_field *f;

		if (p->nfields >= p->lim.fields)
			return refuse(p, 431, "too many request header fields");
		if (p->nfields == p->cap_fields) {
			uint32_t cap = p->cap_fields ? 2 * p->cap_fields : 32;
			void *fields = realloc(p->fields, sizeof(*f) * cap);

			if (!fields)
				return refuse(p, 500, "out of memory for the request head");
			p->fields = fields;
			p->cap_fields = cap;
		}
		f = &p->fields[p->nfields++];
		f->name = p->head_len;
		f->name_len = f->value = f->value_len = 0;
		p->in_field = 1;
	}
	p->fields[p->nfields - 1].name_len += (uint32_t)n;
	return put(p, at, n);
}

static int is_name(const char *s, uint32_t len, const char *name)
{
	return len == strlen(name) && !strncasecmp(s, name, len);
}

static int on_header_field_complete(llhttp_t *ll)
{
	struct hp_parser *p = P(ll);

	if (p->state == HP_BODY) {
		uint32_t len = p->trailer_len;

		p->trailer_len = 0;
		p->field_bytes = 0;
		if (!len) {
			/* ": v": as in the head, a field name is a token (5.1) */
			refuse(p, 400, "empty field name in trailers");
			return -1;
		}
		if (len <= sizeof(p->trailer) &&
		    (is_name(p->trailer, len, "content-length") ||
		     is_name(p->trailer, len, "transfer-encoding") ||
		     is_name(p->trailer, len, "host"))) {
			refuse(p, 400, "framing or routing field in trailers");
			return -1;
		}
		return 0;
	}
	/* no name data for this field (or only an empty span): ": v" */
	if (!p->in_field || !p->fields[p->nfields - 1].name_len) {
		refuse(p, 400, "empty field name");
		return -1;
	}
	p->in_field = 0;
	{
		const struct hp_field *f = &p->fields[p->nfields - 1];

		if (is_name(p->head + f->name, f->name_len, "host")) {
			if (++p->hosts > 1) {
				refuse(p, 400, "repeated Host field");
				return -1;
			}
			p->host = (int)p->nfields - 1;
		}
		else if (is_name(p->head + f->name, f->name_len, "transfer-encoding"))
			p->te_fields++;
		else if (is_name(p->head + f->name, f->name_len, "content-type") &&
		         ++p->content_types > 1) {
			/* joined with a comma it is no media type at all, and which
			 * one a proxy or the app would take is anyone's guess */
			refuse(p, 400, "repeated Content-Type field");
			return -1;
		}
	}
	return 0;
}

static int on_header_value(llhttp_t *ll, const char *at, size_t n)
{
	struct hp_parser *p = P(ll);
	struct hp_field *f;

	if (field_data(p, n))
		return HPE_USER;
	if (p->state == HP_BODY)
		return 0;                   /* trailer values are dropped */
	f = &p->fields[p->nfields - 1];
	if (!p->in_value) {
		f->value = p->head_len;
		p->in_value = 1;
	}
	f->value_len += (uint32_t)n;
	return put(p, at, n);
}

static int on_header_value_complete(llhttp_t *ll)
{
	P(ll)->in_value = 0;
	P(ll)->field_bytes = 0;             /* the next field counts from 0 */
	return 0;
}

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
static int ascii_alnum(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

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

int hp_absolute(const struct hp_parser *p, uint32_t *host, uint32_t *host_len, uint32_t *path)
{
	const char *t = p->head, *end = p->head + p->url_len, *a, *e, *at;

	if (!p->url_len || t[0] == '/' || t[0] == '*')
		return 0;                        /* (llhttp took "x://" of any length) */
	a = memchr(t, ':', p->url_len);
	if (!a || end - a < 3 || a[1] != '/' || a[2] != '/')
		return 0;
	a += 3;                                  /* llhttp took only "scheme://" */
	for (e = a; e < end && *e != '/' && *e != '?' && *e != '#'; e++)
		;
	/* userinfo is not part of the host (RFC 3986 3.2.1) */
	for (at = e; at > a && at[-1] != '@'; at--)
		;
	if (at > a)
		a = at;
	*host = (uint32_t)(a - t);
	*host_len = (uint32_t)(e - a);
	*path = (uint32_t)(e - t);
	return 1;
}

static int on_headers_complete(llhttp_t *ll)
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

static int on_body(llhttp_t *ll, const char *at, size_t n)
{
	struct hp_parser *p = P(ll);

	/* the framing between the last data and this one (chunked only) */
	if (p->scan.gap) {
		size_t gap = (size_t)(at - p->scan.gap);

		if (hp_scan_body(p, p->scan.gap, gap) < gap)
			return HPE_USER;
		p->scan.gap = at + n;
	}
	p->body_seen += n;
	if (p->lim.body && p->body_seen + p->scan.extra > p->lim.body)
		return refuse(p, 413, "request body too large");
	if (n)
		memcpy(p->out + p->out_len, at, n);   /* hp_body: room for all input */
	p->out_len += n;
	return 0;
}

static int on_message_complete(llhttp_t *ll)
{
	struct hp_parser *p = P(ll);

	/* an upgrade (or CONNECT): what follows is another protocol, never a
	 * request; llhttp says so only after this pause, so note it now */
	if (ll->upgrade)
		p->upgrade = 1;
	p->state = HP_DONE;
	return HPE_PAUSED;              /* the next request waits for hp_next() */
}

static const llhttp_settings_t settings = {
	.on_message_begin = on_message_begin,
	.on_url = on_url,
	.on_version_complete = on_version_complete,
	.on_header_field = on_header_field,
	.on_header_field_complete = on_header_field_complete,
	.on_header_value = on_header_value,
	.on_header_value_complete = on_header_value_complete,
	.on_headers_complete = on_headers_complete,
	.on_body = on_body,
	.on_message_complete = on_message_complete,
};

int hp_init(struct hp_parser *p, const struct hp_limits *lim)
{
	memset(p, 0, sizeof(*p));
	llhttp_init(&p->ll, HTTP_REQUEST, &settings);
	p->ll.data = p;
	p->lim = *lim;
	p->length = -1;
	p->state = HP_HEAD;
	return 0;
}

void hp_free(struct hp_parser *p)
{
	free(p->head);
	free(p->fields);
	p->head = NULL;
	p->fields = NULL;
	p->head_cap = p->cap_fields = 0;
}

/* Whether the method llhttp refused at s is a token (RFC 9110 5.6.2) up
 * to its SP, as far as the read goes: a method llhttp's table lacks.
 * Its bytes before s matched a known method's prefix: letters. */
static int token_method(const char *s, const char *end)
{
	static const char tspecial[] = "!#$%&'*+-.^_`|~";

	for (; s < end && *s != ' '; s++)
		if (!ascii_alnum(*s) && (!*s || !strchr(tspecial, *s)))
			return 0;
	return 1;
}

/* Turns llhttp_execute's answer into our state; returns bytes consumed. */
static size_t settle(struct hp_parser *p, const char *data, size_t len, llhttp_errno_t e)
{
	const char *pos;
	size_t all = len;

	if (e == HPE_OK)
		return len;
	pos = llhttp_get_error_pos(&p->ll);
	len = pos && pos >= data && pos <= data + len ? (size_t)(pos - data) : len;
	switch (e) {
	case HPE_PAUSED:
		llhttp_resume(&p->ll);
		return len;
	case HPE_PAUSED_UPGRADE:
		/* what follows belongs to another protocol: this request is the
		 * connection's last */
		p->upgrade = 1;
		p->state = HP_DONE;
		return len;
	case HPE_PAUSED_H2_UPGRADE:
		refuse(p, 505, "HTTP/2 is not served on this connection");
		break;
	case HPE_INVALID_VERSION:
		/* llhttp says so too for a bad byte after a good version
		 * ("HTTP/1.1\rX"): that is syntax, not a version to support */
		if (p->version_done)
			refuse(p, 400, "expected CRLF after the HTTP version");
		else
			refuse(p, 505, "HTTP version not supported");
		break;
	case HPE_INVALID_METHOD:
		/* a token llhttp has no name for is a method we do not implement
		 * (RFC 9110 9.1: 501), anything else a malformed line */
		if (p->status)
			break;
		if (token_method(data + len, data + all))
			refuse(p, 501, "method not implemented");
		else
			refuse(p, 400, "invalid method");
		break;
	default:
		if (!p->status)
			refuse(p, 400, llhttp_get_error_reason(&p->ll));
		break;
	}
	p->state = HP_ERROR;
	return len;
}

/* The scanner found a fault within the used bytes: the request ends
 * there, whatever llhttp made of them. */
static size_t scanned(struct hp_parser *p, size_t used, size_t ok)
{
	if (ok < used) {
		p->state = HP_ERROR;
		return ok;
	}
	return used;
}

size_t hp_head(struct hp_parser *p, const char *data, size_t len)
{
	size_t used;

	if (p->state != HP_HEAD || !len)
		return 0;
	/* the header timer runs from the first byte, an empty line's included:
	 * llhttp begins the message only at the method */
	p->started = 1;
	used = settle(p, data, len, llhttp_execute(&p->ll, data, len));
	return scanned(p, used, hp_scan_head(p, data, used));
}

size_t hp_body(struct hp_parser *p, const char *data, size_t len, char *out, size_t *out_len)
{
	size_t used;

	*out_len = 0;
	if (p->state != HP_BODY || !len)
		return 0;
	if (p->scan.where == SC_HEAD_DONE)
		hp_scan_body_start(p);     /* the head was scanned: the body is next */
	p->out = out;
	p->out_len = 0;
	p->scan.gap = hp_chunked(p) ? data : NULL;
	used = settle(p, data, len, llhttp_execute(&p->ll, data, len));
	if (p->scan.gap && p->state != HP_ERROR && p->scan.gap <= data + used)
		used = scanned(p, used, (size_t)(p->scan.gap - data) +
		               hp_scan_body(p, p->scan.gap, (size_t)(data + used - p->scan.gap)));
	*out_len = p->out_len;
	p->out = NULL;
	p->scan.gap = NULL;
	return used;
}

int hp_next(struct hp_parser *p)
{
	if (p->state != HP_DONE || p->upgrade || !llhttp_should_keep_alive(&p->ll))
		return -1;
	p->state = HP_HEAD;
	p->head_len = p->url_len = p->nfields = 0;
	p->started = 0;
	memset(&p->scan, 0, sizeof(p->scan));
	return 0;
}

void hp_trim(struct hp_parser *p)
{
	if (p->state != HP_HEAD || p->started)
		return;
	hp_free(p);
}

int hp_keep_alive(const struct hp_parser *p)
{
	return !p->upgrade && llhttp_should_keep_alive(&p->ll);
}

int hp_chunked(const struct hp_parser *p)
{
	return !!(p->ll.flags & F_CHUNKED);
}

int64_t hp_content_length(const struct hp_parser *p)
{
	return p->length;
}

/* ---- percent-decoding --------------------------------------------------------------------------- */

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c |= 0x20;
	return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

size_t hp_unquote(const char *s, size_t n, char *out)
{
	size_t k = 0;

	for (size_t i = 0; i < n; i++) {
		int hi, lo;

		if (s[i] == '%' && i + 2 < n && (hi = hexval((unsigned char)s[i + 1])) >= 0 &&
		    (lo = hexval((unsigned char)s[i + 2])) >= 0) {
			out[k++] = (char)(hi << 4 | lo);
			i += 2;
		}
		else
			out[k++] = s[i];
	}
	return k;
}
