/* The WebSocket frame codec (RFC 6455 section 5), no I/O and no Python:
 * the client's frames parsed incrementally from whatever bytes arrived,
 * data messages reassembled (fragments joined, text checked as UTF-8 as
 * its bytes come, so a code point split across fragments is fine and a
 * bad one fails at once), control frames handed out between fragments,
 * and the server's frame headers (unmasked, FIN set: we never fragment).
 *
 * Why native (issue 23; docs/websocket.md has the figures): the engine's
 * layers are connection I/O -> protocol codec -> app adapter, all C on
 * the request path (DESIGN.md section 5); a frame parsed in Python
 * (wsproto, or websockets' Frame.parse) costs a generator step, slicing
 * and an unmask per frame in the interpreter. Measured on 1 KiB masked
 * frames (bench/ws_frame_bench.py) this codec parses one in a small
 * fraction of what either maintained codec takes; the echo benchmark
 * spends its CPU in the app and the loop, not here.
 *
 * The failures and their close codes (section 7.4.1), each decided once
 * the frame's whole header is in (never earlier: a parser fed byte by
 * byte decides exactly as one fed everything at once):
 *   1002  RSV bits without a negotiated extension, an unknown opcode, a
 *         fragmented or longer than 125 bytes control frame (or one whose
 *         length of at most 125 uses the 16- or 64-bit form), an unmasked
 *         frame, a 64-bit length with its top bit set, a data frame's
 *         length not minimally encoded (the 16-bit form below 126, the
 *         64-bit form below 65536), a continuation
 *         with no message started, a new data frame inside a fragmented
 *         message, a close payload of 1 byte or with a code no peer may
 *         send (1005, 1006, 1015, < 1000, 1016-2999, >= 5000)
 *         and, with permessage-deflate negotiated (pmd), RSV1 on a
 *         continuation or control frame or RSV2 / RSV3 set
 *   1007  text (or a close reason) that is not UTF-8; a compressed
 *         message that does not inflate
 *   1009  a message longer than max_size (once inflated too)
 *
 * A compressed message (RSV1 on its first frame) is reassembled as any
 * other, its compressed bytes bounded by max_size, and inflated once
 * whole (ws_deflate.c says how a bomb is bounded); its text is checked as
 * UTF-8 then, not as its bytes come.
 *
 * May call: ws_deflate.c (inflating); nothing of the engine (ws.h is all
 * it knows).
 */
#include <stdlib.h>
#include <string.h>

#include "ws.h"

/* a message buffer kept from one message to the next of a burst (an idle
 * connection holds none: ws_trim frees it when no input waits) */
#define WS_KEEP_BUFFER (16u << 10)

void ws_init(struct ws_parser *p, uint64_t max_size)
{
	memset(p, 0, sizeof(*p));
	p->max_size = max_size;
	p->hneed = 2;
}

void ws_free(struct ws_parser *p)
{
	ws_pmd_free(p);
	free(p->ctl);
	p->ctl = NULL;
	p->ctl_len = 0;
	free(p->msg);
	p->msg = NULL;
	p->msg_cap = p->msg_len = 0;
}

void ws_trim(struct ws_parser *p)
{
	if (p->ctl && !(p->in_payload && p->opcode >= 0x8)) {
		free(p->ctl);
		p->ctl = NULL;
		p->ctl_len = 0;
	}
	if (p->msg && (!p->msg_op || p->delivered) && !p->fail_code) {
		/* no message being reassembled (or the last one handed out:
		 * ws_parse starts anew from msg_len 0 anyway) */
		p->delivered = 0;
		p->msg_op = 0;
		p->msg_len = 0;
		free(p->msg);
		p->msg = NULL;
		p->msg_cap = 0;
	}
}

void ws_let_go(struct ws_parser *p)
{
	if (p->delivered && p->msg_cap > WS_KEEP_BUFFER) {
		free(p->msg);
		p->msg = NULL;
		p->msg_cap = p->msg_len = 0;
	}
}

/* ---- UTF-8, incrementally --------------------------------------------------------------------- */

/* Checks s[0 .. n) going on from u: 0 valid so far, -1 not UTF-8. */
static int utf8_feed(struct ws_utf8 *u, const uint8_t *s, size_t n)
{
	size_t i = 0;

	while (i < n) {
		uint8_t b = s[i];

		if (!u->need) {
			/* ASCII runs 8 bytes at a time: the common text */
			if (b < 0x80) {
				uint64_t w;

				i++;
				while (i + 8 <= n) {
					memcpy(&w, s + i, 8);
					if (w & 0x8080808080808080ull)
						break;
					i += 8;
				}
				continue;
			}
			u->lo = 0x80;
			u->hi = 0xBF;
			if (b >= 0xC2 && b <= 0xDF)
				u->need = 1;
			else if (b >= 0xE0 && b <= 0xEF) {
				u->need = 2;
				if (b == 0xE0)
					u->lo = 0xA0;              /* overlong */
				else if (b == 0xED)
					u->hi = 0x9F;              /* surrogates */
			}
			else if (b >= 0xF0 && b <= 0xF4) {
				u->need = 3;
				if (b == 0xF0)
					u->lo = 0x90;              /* overlong */
				else if (b == 0xF4)
					u->hi = 0x8F;              /* past U+10FFFF */
			}
			else
				return -1;
		}
		else {
			if (b < u->lo || b > u->hi)
				return -1;
			u->need--;
			u->lo = 0x80;
			u->hi = 0xBF;
		}
		i++;
	}
	return 0;
}

int ws_utf8_valid(const uint8_t *s, size_t n)
{
	struct ws_utf8 u = {0};

	return utf8_feed(&u, s, n) == 0 && !u.need;
}

int ws_close_code_ok(int code)
{
	return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) ||
	       (code >= 3000 && code <= 4999);
}

/* ---- parsing ---------------------------------------------------------------------------------- */

static int fail(struct ws_parser *p, int code, const char *reason)
{
	p->fail_code = code;
	p->fail_reason = reason;
	return WS_FAIL;
}

/* out[0 .. n) = in[0 .. n) unmasked, the key's position going on from
 * *mpos: 8 bytes at a time with the key repeated from there */
static void unmask(uint8_t *out, const uint8_t *in, size_t n, const uint8_t mask[4], uint8_t *mpos)
{
	size_t i = 0;
	unsigned m = *mpos;

	if (n >= 16) {
		uint8_t k[8];
		uint64_t key, w;

		for (int j = 0; j < 8; j++)
			k[j] = mask[(m + (unsigned)j) & 3];
		memcpy(&key, k, 8);
		for (; i + 8 <= n; i += 8) {
			memcpy(&w, in + i, 8);
			w ^= key;
			memcpy(out + i, &w, 8);
		}
	}
	for (; i < n; i++)
		out[i] = in[i] ^ mask[(m + i) & 3];
	*mpos = (uint8_t)((m + n) & 3);
}

/* The header hdr[0 .. hneed) is whole: the frame's checks, then its
 * payload is what comes next. WS_MORE, or WS_FAIL. */
static int frame_start(struct ws_parser *p)
{
	const uint8_t *h = p->hdr;
	uint8_t op = h[0] & 0x0F, len7 = h[1] & 0x7F;
	int control = op >= 0x8;
	uint64_t len = len7;
	size_t at = 2;

	if (h[0] & (p->pmd ? 0x30 : 0x70))
		return fail(p, 1002, p->pmd ? "RSV2 or RSV3 set (permessage-deflate uses RSV1 only)"
		                            : "RSV bits set without a negotiated extension");
	if (op != WS_OP_CONT && op != WS_OP_TEXT && op != WS_OP_BINARY && op != WS_OP_CLOSE &&
	    op != WS_OP_PING && op != WS_OP_PONG)
		return fail(p, 1002, "unknown opcode");
	if (control && !(h[0] & 0x80))
		return fail(p, 1002, "fragmented control frame");
	/* RFC 7692 6: RSV1 marks a compressed message on its first frame,
	 * and only there */
	if ((h[0] & 0x40) && control)
		return fail(p, 1002, "RSV1 set on a control frame");
	if ((h[0] & 0x40) && op == WS_OP_CONT)
		return fail(p, 1002, "RSV1 set on a continuation frame");
	if (len7 == 126) {
		len = (uint64_t)h[2] << 8 | h[3];
		at = 4;
	}
	else if (len7 == 127) {
		len = 0;
		for (int i = 0; i < 8; i++)
			len = len << 8 | h[2 + i];
		at = 10;
	}
	/* a control frame's payload is at most 125 bytes, so its length is
	 * always the 7-bit form (5.5); an extended form that says <= 125
	 * breaks the minimal-encoding rule (5.2) instead: the reason says
	 * which (the header is whole here, its extended length read) */
	if (control && len > 125)
		return fail(p, 1002, "control frame longer than 125 bytes");
	if (control && len7 > 125)
		return fail(p, 1002, "control frame length not in the 7-bit form (not minimally encoded)");
	if (!(h[1] & 0x80))
		return fail(p, 1002, "unmasked client frame");
	if (len >> 63)
		return fail(p, 1002, "64-bit payload length with its top bit set");
	/* 5.2: "the minimal number of bytes MUST be used to encode the
	 * length"; a data frame's length too (control frames: above) */
	if (len7 == 126 && len < 126)
		return fail(p, 1002, "payload length in the 16-bit form below 126 (not minimally encoded)");
	if (len7 == 127 && len < 65536)
		return fail(p, 1002, "payload length in the 64-bit form below 65536 (not minimally encoded)");
	if (!control) {
		if (op == WS_OP_CONT && !p->msg_op)
			return fail(p, 1002, "continuation frame without a message started");
		if (op != WS_OP_CONT && p->msg_op)
			return fail(p, 1002, "new data frame inside a fragmented message");
		if (p->max_size && len > p->max_size - p->msg_len)
			return fail(p, 1009, "message larger than the maximum size");
		if (op != WS_OP_CONT) {
			p->msg_op = op;
			if (p->pmd)
				p->pmd->msg_deflated = (h[0] & 0x40) != 0;
			p->utf8 = (struct ws_utf8){0};
		}
	}
	else
		p->ctl_len = 0;
	memcpy(p->mask, h + at, 4);
	p->mpos = 0;
	p->opcode = op;
	p->fin = h[0] >> 7;
	p->left = len;
	p->in_payload = 1;
	return WS_MORE;
}

/* The frame's payload is whole: its event, or WS_MORE (a fragment). */
static int frame_end(struct ws_parser *p)
{
	p->in_payload = 0;
	switch (p->opcode) {
	case WS_OP_PING:
		return WS_PING;
	case WS_OP_PONG:
		return WS_PONG;
	case WS_OP_CLOSE:
		if (p->ctl_len == 0) {
			p->close_code = 1005;              /* none given */
			return WS_CLOSE;
		}
		if (p->ctl_len == 1)
			return fail(p, 1002, "close frame with a 1-byte payload");
		p->close_code = p->ctl[0] << 8 | p->ctl[1];
		if (!ws_close_code_ok(p->close_code))
			return fail(p, 1002, "close frame with an invalid close code");
		if (!ws_utf8_valid(p->ctl + 2, p->ctl_len - 2u))
			return fail(p, 1007, "close reason that is not UTF-8");
		return WS_CLOSE;
	}
	if (!p->fin)
		return WS_MORE;
	if (ws_msg_deflated(p)) {
		/* whole: inflated, then text checked as UTF-8 (its compressed
		 * bytes were not) */
		if (ws_inflate_msg(p) == WS_FAIL)
			return WS_FAIL;
		if (p->msg_op == WS_OP_TEXT && !ws_utf8_valid((const uint8_t *)p->msg, p->msg_len))
			return fail(p, 1007, "text message that is not UTF-8");
	}
	else if (p->msg_op == WS_OP_TEXT && p->utf8.need)
		return fail(p, 1007, "text message that is not UTF-8 (truncated sequence)");
	p->delivered = 1;
	return p->msg_op == WS_OP_TEXT ? WS_TEXT : WS_BINARY;
}

int ws_parse(struct ws_parser *p, const uint8_t *data, size_t len, size_t *used)
{
	size_t i = 0;
	int ev;

	*used = 0;
	if (p->fail_code)
		return WS_FAIL;
	if (p->ctl && !(p->in_payload && p->opcode >= 0x8)) {
		/* the last control frame's payload was handed out */
		free(p->ctl);
		p->ctl = NULL;
		p->ctl_len = 0;
	}
	if (p->delivered) {
		/* the last call handed a message out: the next frame starts a
		 * new one; a big message's buffer is not kept for an idle
		 * connection (a few KiB each is the bound, issue 23) */
		p->delivered = 0;
		p->msg_op = 0;
		p->msg_len = 0;
		if (p->msg_cap > WS_KEEP_BUFFER) {
			free(p->msg);
			p->msg = NULL;
			p->msg_cap = 0;
		}
	}
	for (;;) {
		if (!p->in_payload) {
			while (p->hlen < p->hneed && i < len) {
				p->hdr[p->hlen++] = data[i++];
				if (p->hlen == 2) {
					uint8_t l7 = p->hdr[1] & 0x7F;

					p->hneed = (uint8_t)(2 + (l7 == 126 ? 2 : l7 == 127 ? 8 : 0) +
					                     (p->hdr[1] & 0x80 ? 4 : 0));
				}
			}
			if (p->hlen < p->hneed) {
				*used = i;
				return WS_MORE;
			}
			/* a control frame with a payload: its buffer (frame_start
			 * refuses one past 125 bytes before any is stored) */
			if ((p->hdr[0] & 0x08) && (p->hdr[1] & 0x7F) && !p->ctl &&
			    !(p->ctl = malloc(125))) {
				*used = i;
				return -1;
			}
			p->hlen = 0;
			p->hneed = 2;
			if (frame_start(p) == WS_FAIL) {
				*used = i;
				return WS_FAIL;
			}
		}
		if (p->left) {
			size_t n = len - i < p->left ? len - i : (size_t)p->left;

			if (p->opcode >= 0x8) {
				unmask(p->ctl + p->ctl_len, data + i, n, p->mask, &p->mpos);
				p->ctl_len = (uint8_t)(p->ctl_len + n);
			}
			else if (n) {
				uint8_t *at;

				if (p->msg_cap - p->msg_len < n) {
					size_t cap = p->msg_cap ? p->msg_cap : 256;
					char *m;

					while (cap - p->msg_len < n)
						cap *= 2;
					if (!(m = realloc(p->msg, cap))) {
						*used = i;
						return -1;
					}
					p->msg = m;
					p->msg_cap = cap;
				}
				at = (uint8_t *)p->msg + p->msg_len;
				unmask(at, data + i, n, p->mask, &p->mpos);
				p->msg_len += n;
				if (p->msg_op == WS_OP_TEXT && !ws_msg_deflated(p) &&
				    utf8_feed(&p->utf8, at, n) < 0) {
					*used = i + n;
					return fail(p, 1007, "text message that is not UTF-8");
				}
			}
			i += n;
			p->left -= n;
			if (p->left) {
				*used = i;
				return WS_MORE;
			}
		}
		ev = frame_end(p);
		if (ev != WS_MORE) {
			*used = i;
			return ev;
		}
		if (i == len) {
			*used = i;
			return WS_MORE;
		}
	}
}

size_t ws_frame_head(uint8_t *out, int opcode, uint64_t len)
{
	out[0] = (uint8_t)(0x80 | opcode);          /* (RSV1 with it, if given) */
	if (len < 126) {
		out[1] = (uint8_t)len;
		return 2;
	}
	if (len < 65536) {
		out[1] = 126;
		out[2] = (uint8_t)(len >> 8);
		out[3] = (uint8_t)len;
		return 4;
	}
	out[1] = 127;
	for (int i = 0; i < 8; i++)
		out[2 + i] = (uint8_t)(len >> (56 - 8 * i));
	return 10;
}
