/* sockherd HTTP/1.1 request parsing: the llhttp callbacks that collect
 * the head (httpfields.c) and check it once complete (httpcheck.c), which
 * httpparse.c's llhttp settings name, and the small helpers all three
 * share. Internal to the parser: the rest of the extension includes
 * httpparse.h only.
 *
 * The helpers are static inline: they were static functions of the one
 * httpparse.c, called on every field, and stay free of a call across
 * files. */
#ifndef SOCKHERD_HTTPCALLBACKS_H
#define SOCKHERD_HTTPCALLBACKS_H

#include <string.h>
#include <strings.h>

#include "httpparse.h"

static inline struct hp_parser *P(llhttp_t *ll)
{
	return ll->data;
}

/* Records why the request is refused. Data callbacks then return HPE_USER,
 * the others -1; either way llhttp_execute stops with an error and
 * settle() answers with p->status rather than llhttp's generic 400. */
static inline int refuse(struct hp_parser *p, int status, const char *reason)
{
	if (!p->status) {
		p->status = status;
		p->reason = reason;
	}
	return HPE_USER;
}

static inline int is_name(const char *s, uint32_t len, const char *name)
{
	return len == strlen(name) && !strncasecmp(s, name, len);
}

static inline int ascii_alnum(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* httpfields.c: the target, the version and the field lines (of the head,
 * and the names of trailer fields) as llhttp hands them over */
int hp_on_url(llhttp_t *ll, const char *at, size_t n);
int hp_on_version_complete(llhttp_t *ll);
int hp_on_header_field(llhttp_t *ll, const char *at, size_t n);
int hp_on_header_field_complete(llhttp_t *ll);
int hp_on_header_value(llhttp_t *ll, const char *at, size_t n);
int hp_on_header_value_complete(llhttp_t *ll);

/* httpcheck.c: the head as a whole, once llhttp read it (Host, the
 * target's form, the framing); pauses llhttp before a body */
int hp_on_headers_complete(llhttp_t *ll);

#endif /* SOCKHERD_HTTPCALLBACKS_H */
