/* sockherd HTTP/1.1 request parsing: reading the request target. Its
 * form (absolute-form, and where its authority and path are: httpcheck.c
 * checks it, the adapters route by it) and the percent-decoding of its
 * path (the adapters' PATH_INFO and path). Pure functions of the parser's
 * head or of bytes; any thread that may read the parser may call them. */
#include <string.h>

#include "httpparse.h"

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
