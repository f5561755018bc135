/* The comma-separated lists of a parsed head's fields (RFC 9110 5.6.1):
 * Transfer-Encoding (httpparse.c), Connection, Upgrade, TE and
 * Sec-WebSocket-Protocol (the ASGI adapter) are read element by element
 * here, one way. Pure functions of the parser's head; any thread that may
 * read the parser may call them. */
#include <string.h>
#include <strings.h>

#include "httpparse.h"

int hp_list_next(const char **s, const char *end, const char **item, size_t *len)
{
	const char *v = *s, *comma, *e;

	if (v >= end)
		return 0;
	comma = memchr(v, ',', (size_t)(end - v));
	e = comma ? comma : end;
	while (v < e && (*v == ' ' || *v == '\t'))
		v++;
	while (e > v && (e[-1] == ' ' || e[-1] == '\t'))
		e--;
	*item = v;
	*len = (size_t)(e - v);
	*s = comma ? comma + 1 : end;
	return 1;
}

int hp_has_token(const struct hp_parser *p, const char *name, const char *token)
{
	size_t nl = strlen(name), tl = strlen(token);

	for (uint32_t i = 0; i < p->nfields; i++) {
		const struct hp_field *f = &p->fields[i];
		const char *v = p->head + f->value, *end = v + f->value_len, *item;
		size_t len;

		if (f->name_len != nl || strncasecmp(p->head + f->name, name, nl))
			continue;
		while (hp_list_next(&v, end, &item, &len))
			if (len == tl && !strncasecmp(item, token, tl))
				return 1;
	}
	return 0;
}
