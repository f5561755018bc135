/* permessage-deflate (RFC 7692) for the WebSocket codec, no I/O and no
 * Python: the client's offers parsed and one accepted (7.1), a compressed
 * message inflated once whole (7.2.2), a server message deflated (7.2.1).
 * Off unless the ws_per_message_deflate setting turns it on (issue 23):
 * compression costs memory per connection and CPU per message, and lets a
 * client send a small message that inflates to a large one.
 *
 * Negotiation. Sec-WebSocket-Extensions lists offers in the client's order
 * of preference; the first permessage-deflate offer we can honour wins.
 * An offer is declined (the next one tried) when a parameter is unknown,
 * given twice, has a value it may not have (the *_no_context_takeover
 * ones take none), lacks one it needs (server_max_window_bits), or has a
 * window size that is not a decimal 8-15 without a leading zero; also
 * server_max_window_bits=8, which zlib cannot honour: its raw deflate
 * refuses a 256-byte window (deflateInit2 with windowBits -8). A syntax
 * error declines the offer it is in; parsing goes on after the next comma.
 * Our answer names exactly what we accepted:
 *   server_no_context_takeover   offered: echoed, our deflater starts
 *                                afresh for each message (and is freed
 *                                between them: no memory while idle)
 *   client_no_context_takeover   offered: echoed, our inflater likewise
 *   server_max_window_bits=N     offered: echoed, we deflate with a window
 *                                of at most 2^N (we use 2^12 anyway)
 *   client_max_window_bits[=N]   a hint we may ignore (7.1.2.2): we inflate
 *                                with the largest window (2^15), which
 *                                reads data deflated with any smaller one
 *
 * Inflating. The compressed message is reassembled by ws_frame.c (its
 * compressed size bounded by max_size as any message), then inflated in
 * steps into a buffer that grows by doubling up to max_size + 1 bytes: a
 * message that inflates past max_size fails with 1009 having cost at most
 * that much memory, whatever ratio the client's bomb has. Data zlib
 * refuses fails with 1007: RFC 6455 7.4.1's "data within a message that
 * was not consistent with the type of the message" (a compressed message
 * that does not inflate); Node's ws answers an inflate error with 1007
 * too, Python's websockets with 1002.
 *
 * Memory when on: zlib's state, allocated at a connection's first
 * compressed message each way: the inflater ~7 KiB + its 32 KiB window,
 * the deflater ~6 KiB + 32 KiB (window 2^12, memLevel 5, as websockets
 * chooses). Kept between messages under context takeover (the default),
 * freed after each message without it; all of it behind one pointer of
 * the parser (struct ws_pmd_state, ws_pmd_attach at the upgrade). Off (the
 * default): that pointer, NULL, and nothing else.
 *
 * May call: zlib.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zlib.h>

#include "ws.h"

#define INFLATE_BITS 15                    /* reads any client window */
#define DEFLATE_BITS 12                    /* ours: a smaller window, less memory */
#define DEFLATE_MEMLEVEL 5
#define ZCHUNK (1u << 30)                  /* zlib's counts are unsigned int */

/* ---- negotiation ------------------------------------------------------------------------------ */

static int tchar(char ch)
{
	return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
	       (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

static const char *ows(const char *s, const char *e)
{
	while (s < e && (*s == ' ' || *s == '\t'))
		s++;
	return s;
}

/* A window size value (token or quoted-string, unquoted into buf): a
 * decimal 8-15, no leading zero (RFC 7692 7.1.2.1). *s moves past it.
 * The size, 0 if not one, -1 on a syntax error. */
static int window_value(const char **s, const char *e)
{
	char buf[4];
	size_t n = 0;

	if (*s < e && **s == '"') {
		const char *p = *s + 1;

		for (; p < e && *p != '"'; p++) {
			if (*p == '\\' && ++p == e)
				return -1;
			if (n < sizeof(buf))
				buf[n] = *p;
			n++;
		}
		if (p == e)
			return -1;                 /* unterminated */
		*s = p + 1;
	}
	else {
		const char *p = *s;

		while (p < e && tchar(*p)) {
			if (n < sizeof(buf))
				buf[n] = *p;
			n++;
			p++;
		}
		if (p == *s)
			return -1;
		*s = p;
	}
	if (n == 1 && buf[0] >= '8' && buf[0] <= '9')
		return buf[0] - '0';
	if (n == 2 && buf[0] == '1' && buf[1] >= '0' && buf[1] <= '5')
		return 10 + buf[1] - '0';
	return 0;
}

/* One extension of the list at *s: 1 a permessage-deflate offer we take
 * (into *pmd), 0 anything else; *s moves to its end (the comma or e). */
static int one_offer(const char **sp, const char *e, struct ws_pmd *pmd)
{
	const char *s = ows(*sp, e), *name = s;
	struct ws_pmd got = {.on = 1};
	int ok, seen = 0;                          /* bits: the parameters met */

	while (s < e && tchar(*s))
		s++;
	ok = s - name == 18 && !strncasecmp(name, "permessage-deflate", 18);
	if (s == name)
		ok = 0;                            /* no extension token */
	for (s = ows(s, e); s < e && *s != ','; s = ows(s, e)) {
		const char *pn;
		size_t pl;
		int bit, v = 0, has_value;

		if (*s != ';')
			goto syntax;
		s = ows(s + 1, e);
		pn = s;
		while (s < e && tchar(*s))
			s++;
		pl = (size_t)(s - pn);
		if (!pl)
			goto syntax;
		s = ows(s, e);
		has_value = s < e && *s == '=';
		if (has_value) {
			s = ows(s + 1, e);
			v = window_value(&s, e);
			if (v < 0)
				goto syntax;
		}
		if (pl == 26 && !strncasecmp(pn, "server_no_context_takeover", 26)) {
			bit = 1;
			ok = ok && !has_value;
			got.server_no_takeover = 1;
		}
		else if (pl == 26 && !strncasecmp(pn, "client_no_context_takeover", 26)) {
			bit = 2;
			ok = ok && !has_value;
			got.client_no_takeover = 1;
		}
		else if (pl == 22 && !strncasecmp(pn, "server_max_window_bits", 22)) {
			bit = 4;
			/* a value is required; 8: zlib's raw deflate cannot (above) */
			ok = ok && has_value && v >= 9;
			got.server_bits = (uint8_t)v;
		}
		else if (pl == 22 && !strncasecmp(pn, "client_max_window_bits", 22)) {
			bit = 8;
			ok = ok && (!has_value || v);  /* a hint: no value, or a valid one */
		}
		else
			bit = ok = 0;                  /* unknown: declined */
		if (seen & bit)
			ok = 0;                        /* twice */
		seen |= bit;
	}
	*sp = s;
	if (ok)
		*pmd = got;
	return ok;
syntax:
	/* the offer is declined; the list goes on after the next comma
	 * outside a quoted string */
	for (int q = 0; s < e && (q || *s != ','); s++) {
		if (*s == '"')
			q = !q;
		else if (q && *s == '\\' && s + 1 < e)
			s++;
	}
	*sp = s;
	return 0;
}

int ws_pmd_offers(const char *s, size_t n, struct ws_pmd *pmd)
{
	const char *e = s + n;

	while (s < e) {
		if (*s == ',' || *s == ' ' || *s == '\t') {
			s++;                           /* empty list elements are allowed */
			continue;
		}
		if (one_offer(&s, e, pmd))
			return 1;
	}
	return 0;
}

size_t ws_pmd_answer(const struct ws_pmd *pmd, char *out)
{
	int n = snprintf(out, WS_PMD_ANSWER_MAX, "permessage-deflate%s%s", pmd->server_no_takeover ?
	                 "; server_no_context_takeover" : "", pmd->client_no_takeover ?
	                 "; client_no_context_takeover" : "");

	if (pmd->server_bits)
		n += snprintf(out + n, WS_PMD_ANSWER_MAX - (size_t)n, "; server_max_window_bits=%d",
		              pmd->server_bits);
	return (size_t)n;
}

/* ---- inflating a client's message ------------------------------------------------------------- */

static int fail(struct ws_parser *p, int code, const char *reason)
{
	p->fail_code = code;
	p->fail_reason = reason;
	return WS_FAIL;
}

static void inflater_free(struct ws_pmd_state *pmd)
{
	if (pmd->inflater) {
		inflateEnd(pmd->inflater);
		free(pmd->inflater);
		pmd->inflater = NULL;
	}
}

static void deflater_free(struct ws_pmd_state *pmd)
{
	if (pmd->deflater) {
		deflateEnd(pmd->deflater);
		free(pmd->deflater);
		pmd->deflater = NULL;
	}
}

int ws_pmd_attach(struct ws_parser *p, const struct ws_pmd *neg)
{
	struct ws_pmd_state *pmd = calloc(1, sizeof(*pmd));

	if (!pmd)
		return -1;
	pmd->neg = *neg;
	ws_pmd_free(p);
	p->pmd = pmd;
	return 0;
}

void ws_pmd_free(struct ws_parser *p)
{
	if (p->pmd) {
		inflater_free(p->pmd);
		deflater_free(p->pmd);
		free(p->pmd);
		p->pmd = NULL;
	}
}

int ws_inflate_msg(struct ws_parser *p)
{
	static const uint8_t tail[4] = {0x00, 0x00, 0xff, 0xff};
	struct ws_pmd_state *pmd = p->pmd;
	z_stream *z = pmd->inflater;
	size_t limit = p->max_size && p->max_size < SIZE_MAX ? (size_t)p->max_size : SIZE_MAX - 1;
	const uint8_t *in = (const uint8_t *)p->msg;
	size_t in_left = p->msg_len, len = 0, cap;
	int tail_fed = 0, rc = 0;
	uint8_t *out;

	if (!z) {
		if (!(z = calloc(1, sizeof(*z))))
			return fail(p, 1011, "out of memory inflating a message");
		if (inflateInit2(z, -INFLATE_BITS) != Z_OK) {
			free(z);
			return fail(p, 1011, "out of memory inflating a message");
		}
		pmd->inflater = z;
	}
	/* a first guess, never past the bound: the buffer doubles as needed */
	cap = in_left < (SIZE_MAX >> 3) ? in_left * 4 : SIZE_MAX;
	if (cap < 1024)
		cap = 1024;
	if (cap > limit + 1)
		cap = limit + 1;
	if (!(out = malloc(cap)))
		return fail(p, 1011, "out of memory inflating a message");
	z->avail_in = 0;
	for (;;) {
		int r;

		if (!z->avail_in) {
			if (in_left) {
				z->next_in = (Bytef *)in;
				z->avail_in = in_left < ZCHUNK ? (uInt)in_left : ZCHUNK;
				in += z->avail_in;
				in_left -= z->avail_in;
			}
			else if (!tail_fed) {
				/* 7.2.2: the sender removed the sync flush's tail */
				z->next_in = (Bytef *)tail;
				z->avail_in = 4;
				tail_fed = 1;
			}
		}
		if (len == cap) {
			size_t ncap = cap > (limit + 1) / 2 ? limit + 1 : cap * 2;
			uint8_t *m;

			if (cap > limit) {
				rc = fail(p, 1009, "message larger than the maximum size once inflated");
				break;
			}
			if (!(m = realloc(out, ncap))) {
				rc = fail(p, 1011, "out of memory inflating a message");
				break;
			}
			out = m;
			cap = ncap;
		}
		z->next_out = out + len;
		z->avail_out = cap - len < ZCHUNK ? (uInt)(cap - len) : ZCHUNK;
		r = inflate(z, Z_SYNC_FLUSH);
		len = (size_t)(z->next_out - out);
		if (len > limit) {
			rc = fail(p, 1009, "message larger than the maximum size once inflated");
			break;
		}
		if (r == Z_STREAM_END) {
			/* the client ended its stream (a final block: 7.2.3.4):
			 * what follows, the tail included, is not data; its next
			 * message starts a new stream */
			inflateReset(z);
			break;
		}
		if (r == Z_MEM_ERROR) {
			rc = fail(p, 1011, "out of memory inflating a message");
			break;
		}
		if (r != Z_OK && r != Z_BUF_ERROR) {
			rc = fail(p, 1007, "compressed message that does not inflate (invalid deflate data)");
			break;
		}
		if (!z->avail_in && !in_left && tail_fed && z->avail_out)
			break;                     /* all in, and room was left: all out */
	}
	if (rc) {
		free(out);
		return rc;
	}
	if (pmd->neg.client_no_takeover)
		inflater_free(pmd);                /* client_no_context_takeover */
	free(p->msg);
	p->msg = (char *)out;
	p->msg_len = len;
	p->msg_cap = cap;
	return 0;
}

/* ---- deflating a server message --------------------------------------------------------------- */

int ws_deflate_msg(struct ws_pmd_state *pmd, const uint8_t *data, size_t n, uint8_t **outp,
                   size_t *outlen)
{
	z_stream *z = pmd->deflater;
	size_t len = 0, cap, left = n;
	uint8_t *out;

	if (!z) {
		int sb = pmd->neg.server_bits, bits = sb && sb < DEFLATE_BITS ? sb : DEFLATE_BITS;

		if (!(z = calloc(1, sizeof(*z))))
			return -1;
		if (deflateInit2(z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -bits, DEFLATE_MEMLEVEL,
		                 Z_DEFAULT_STRATEGY) != Z_OK) {
			free(z);
			return -1;
		}
		pmd->deflater = z;
	}
	cap = n / 2 + 64;
	if (!(out = malloc(cap)))
		return -1;
	z->next_in = (Bytef *)data;
	z->avail_in = 0;
	for (;;) {
		if (!z->avail_in && left) {
			z->avail_in = left < ZCHUNK ? (uInt)left : ZCHUNK;
			left -= z->avail_in;
		}
		if (len == cap) {
			uint8_t *m = realloc(out, cap * 2);

			if (!m) {
				free(out);
				return -1;
			}
			out = m;
			cap *= 2;
		}
		z->next_out = out + len;
		z->avail_out = cap - len < ZCHUNK ? (uInt)(cap - len) : ZCHUNK;
		/* Z_SYNC_FLUSH (7.2.1): the message ends on a byte boundary
		 * with an empty stored block, whose 4 bytes we drop below */
		deflate(z, left ? Z_NO_FLUSH : Z_SYNC_FLUSH);
		len = (size_t)(z->next_out - out);
		if (!z->avail_in && !left && z->avail_out)
			break;
	}
	if (len >= 4 && !memcmp(out + len - 4, "\x00\x00\xff\xff", 4))
		len -= 4;
	if (pmd->neg.server_no_takeover)
		deflater_free(pmd);                    /* server_no_context_takeover */
	*outp = out;
	*outlen = len;
	return 0;
}
