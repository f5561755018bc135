/* sockherd HTTP/1.1 request parsing: collecting the head. llhttp's
 * callbacks for the target, the version and the field lines copy them into
 * hp_parser.head, bounded by the limits as they come (414, 431) and with
 * the counts httpcheck.c judges (Host, Transfer-Encoding, Content-Type);
 * a trailer's name is checked here, its value dropped. Callers: llhttp,
 * inside httpparse.c's llhttp_execute (the settings there name these), on
 * a connection's hp_parser, one thread at a time. */
#include <stdlib.h>
#include <string.h>

#include "httpcallbacks.h"

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

int hp_on_url(llhttp_t *ll, const char *at, size_t n)
{
	struct hp_parser *p = P(ll);

	/* the scanner counts the whole line; this bounds what is kept of it
	 * before the scanner sees the bytes (after llhttp) */
	if (n > p->lim.line || p->url_len + n > p->lim.line)
		return refuse(p, 414, "request line too long");
	p->url_len += (uint32_t)n;
	return put(p, at, n);
}

int hp_on_version_complete(llhttp_t *ll)
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

int hp_on_header_field(llhttp_t *ll, const char *at, size_t n)
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

int hp_on_header_field_complete(llhttp_t *ll)
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

int hp_on_header_value(llhttp_t *ll, const char *at, size_t n)
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

int hp_on_header_value_complete(llhttp_t *ll)
{
	P(ll)->in_value = 0;
	P(ll)->field_bytes = 0;             /* the next field counts from 0 */
	return 0;
}
