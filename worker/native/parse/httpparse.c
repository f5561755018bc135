/* sockherd HTTP/1.1 request parsing on llhttp: see httpparse.h for what is
 * checked. This file runs llhttp: its settings, a request's begin and end
 * and the body's bytes (chunked framing handed to the scanner), and turns
 * llhttp's answer into hp_parser's state. The head's callbacks are below
 * it: httpfields.c collects the head, httpcheck.c checks it; httpscan.c
 * re-reads the raw bytes after each llhttp_execute; httptarget.c reads the
 * target. Callers: one thread per hp_parser at a time (a connection's
 * owner); nothing here is shared between parsers but the static settings. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "httpcallbacks.h"
#include "httpscan.h"

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
	.on_url = hp_on_url,
	.on_version_complete = hp_on_version_complete,
	.on_header_field = hp_on_header_field,
	.on_header_field_complete = hp_on_header_field_complete,
	.on_header_value = hp_on_header_value,
	.on_header_value_complete = hp_on_header_value_complete,
	.on_headers_complete = hp_on_headers_complete,
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
