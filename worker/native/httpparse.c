/* sockherd HTTP/1.1 request parsing on llhttp: see httpparse.h for what is
 * checked where. Callers: one thread per hp_parser at a time (a connection's
 * owner); nothing here is shared between parsers but the static settings. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "httpparse.h"

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
	p->line_bytes = p->field_bytes = 0;
	p->hosts = 0;
	p->length = -1;
	p->body_seen = 0;
	p->state = HP_HEAD;
	p->started = 1;
	return 0;
}

static int on_method(llhttp_t *ll, const char *at, size_t n)
{
	struct hp_parser *p = P(ll);

	(void)at;
	p->line_bytes += (uint32_t)n;
	if (p->line_bytes > p->lim.line)
		return refuse(p, 414, "request line too long");
	return 0;
}

static int on_url(llhttp_t *ll, const char *at, size_t n)
{
	struct hp_parser *p = P(ll);

	if (n > p->lim.line || (p->line_bytes += (uint32_t)n) > p->lim.line)
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
	return 0;
}

static int field_data(struct hp_parser *p, size_t n)
{
	if (n > p->lim.header_bytes || (p->field_bytes += (uint32_t)n) > p->lim.header_bytes)
		return refuse(p, 431, "request header fields too large");
	return 0;
}

static int on_header_field(llhttp_t *ll, const char *at, size_t n)
{
	struct hp_parser *p = P(ll);

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

		if (p->nfields >= p->lim.headers)
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
	if (is_name(p->head + p->fields[p->nfields - 1].name,
	            p->fields[p->nfields - 1].name_len, "host") && ++p->hosts > 1) {
		refuse(p, 400, "repeated Host field");
		return -1;
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
	return 0;
}

static int on_headers_complete(llhttp_t *ll)
{
	struct hp_parser *p = P(ll);
	int has_length = !!(ll->flags & F_CONTENT_LENGTH);

	if (ll->http_minor == 1 && !p->hosts) {
		refuse(p, 400, "missing Host field");
		return -1;
	}
	if (ll->http_minor == 0 && (ll->flags & F_TRANSFER_ENCODING)) {
		refuse(p, 400, "Transfer-Encoding in an HTTP/1.0 request");
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

	p->body_seen += n;
	if (p->lim.body && p->body_seen > p->lim.body)
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
	.on_method = on_method,
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

/* Turns llhttp_execute's answer into our state; returns bytes consumed. */
static size_t settle(struct hp_parser *p, const char *data, size_t len, llhttp_errno_t e)
{
	const char *pos;

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
		refuse(p, 505, "HTTP version not supported");
		break;
	default:
		if (!p->status)
			refuse(p, 400, llhttp_get_error_reason(&p->ll));
		break;
	}
	p->state = HP_ERROR;
	return len;
}

/* Whether the head bytes data[0 .. len) hold an obsolete line folding: a
 * line starting with SP or HTAB (the request line cannot: llhttp refuses
 * it). llhttp in strict mode still joins such a line onto the field above
 * it; RFC 9112 5.2 lets a server refuse it, and a proxy in front may have
 * read it as a field of its own. Scanned on the raw bytes, across calls. */
static int folded(struct hp_parser *p, const char *data, size_t len)
{
	const char *end = data + len, *lf;

	if (len && p->prev_lf && (data[0] == ' ' || data[0] == '\t'))
		return 1;
	for (const char *s = data; (lf = memchr(s, '\n', (size_t)(end - s))); s = lf + 1)
		if (lf + 1 < end && (lf[1] == ' ' || lf[1] == '\t'))
			return 1;
	p->prev_lf = len && end[-1] == '\n';
	return 0;
}

size_t hp_head(struct hp_parser *p, const char *data, size_t len)
{
	size_t used;

	if (p->state != HP_HEAD || !len)
		return 0;
	used = settle(p, data, len, llhttp_execute(&p->ll, data, len));
	if (p->state != HP_ERROR && folded(p, data, used)) {
		refuse(p, 400, "obsolete line folding");
		p->state = HP_ERROR;
	}
	return used;
}

size_t hp_body(struct hp_parser *p, const char *data, size_t len, char *out, size_t *out_len)
{
	size_t used;

	*out_len = 0;
	if (p->state != HP_BODY || !len)
		return 0;
	p->out = out;
	p->out_len = 0;
	used = settle(p, data, len, llhttp_execute(&p->ll, data, len));
	*out_len = p->out_len;
	p->out = NULL;
	return used;
}

int hp_next(struct hp_parser *p)
{
	if (p->state != HP_DONE || p->upgrade || !llhttp_should_keep_alive(&p->ll))
		return -1;
	p->state = HP_HEAD;
	p->head_len = p->url_len = p->nfields = 0;
	p->prev_lf = 0;
	p->started = 0;
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
