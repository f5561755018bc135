/* sockherd HTTP/1.1 request parsing: the raw line scanner (see
 * httpscan.h). Callers: httpparse.c, on a connection's hp_parser, one
 * thread at a time. */
#include <string.h>

#include "httpscan.h"

/* Refuses at a scanned byte: the scanner sees bytes llhttp already took,
 * so its finding comes first in the input and replaces llhttp's. */
static int scan_refuse(struct hp_parser *p, int status, const char *reason)
{
	p->status = status;
	p->reason = reason;
	return 1;
}

/* What byte c is to the line it is in: a CR LF pair is the only line end
 * (RFC 9112 2.2); a CR is held until the LF it must precede. */
enum { LINE_BYTE, LINE_CR, LINE_END, LINE_BARE };

static int line_byte(struct hp_parser *p, unsigned char c)
{
	if (c == '\n') {
		if (!p->scan.cr)
			return LINE_BARE;
		p->scan.cr = 0;
		return LINE_END;
	}
	if (p->scan.cr)
		return LINE_BARE;
	if (c == '\r') {
		p->scan.cr = 1;
		return LINE_CR;
	}
	return LINE_BYTE;
}

/* The bytes of a head line before its CRLF, s[0 .. n), maybe a part of
 * it (a read may end anywhere). llhttp refused a CR anywhere else, and a
 * control byte, so only the spaces, the line's start and its length are
 * left to check. 0, or refused. */
static int head_line_bytes(struct hp_parser *p, const char *s, size_t n)
{
	if (!n)
		return 0;
	if (p->scan.where == SC_REQLINE) {
		/* RFC 9112 3: method SP request-target SP HTTP-version */
		const char *q = s, *e = s + n, *sp;

		/* llhttp skips a CR before the method (and refuses one after
		 * it): any CR here is bare */
		if (memchr(s, '\r', n))
			return scan_refuse(p, 400, "bare CR in the request line (CRLF ends a line)");
		while ((sp = memchr(q, ' ', (size_t)(e - q)))) {
			int after_sp = sp > s ? sp[-1] == ' ' : p->scan.after_sp;

			if ((sp == s && !p->scan.len) || after_sp || ++p->scan.sp > 2)
				return scan_refuse(p, 400, "request line: one space between its three parts");
			q = sp + 1;
		}
		p->scan.after_sp = s[n - 1] == ' ';
		if ((p->scan.len += n) + p->scan.extra > p->lim.line)
			return scan_refuse(p, 414, "request line too long");
	}
	else if (p->scan.where == SC_FIELDS) {
		if (!p->scan.len && (s[0] == ' ' || s[0] == '\t'))
			/* obs-fold, or whitespace before the first field: a proxy
			 * may read either as a field of its own (5.2, 2.2) */
			return scan_refuse(p, 400, "obsolete line folding");
		if ((p->scan.len += n) + 2 > p->lim.field_size)      /* its CRLF too, as gunicorn counts */
			return scan_refuse(p, 431, "request header field too large");
	}
	return 0;
}

/* A head line's CRLF. 0, or refused. */
static int head_line_end(struct hp_parser *p)
{
	p->scan.cr = 0;
	if (p->scan.where == SC_REQLINE) {
		if (!p->scan.len) {
			/* an empty line before the request line (RFC 9112 2.2):
			 * one is ignored (a client's stray CRLF after a body),
			 * its bytes counted toward the line; a second is no
			 * client's habit but a padding or a probe (gunicorn
			 * refuses it too) */
			if (p->scan.extra)
				return scan_refuse(p, 400, "more than one empty line before the request line");
			if ((p->scan.extra += 2) > p->lim.line)
				return scan_refuse(p, 414, "request line too long (empty lines before it included)");
			return 0;
		}
		if (p->scan.sp != 2)
			return scan_refuse(p, 400, "request line without an HTTP version");
		p->scan.where = SC_FIELDS;
	}
	else if (p->scan.where == SC_FIELDS && !p->scan.len)
		p->scan.where = SC_HEAD_DONE;
	p->scan.len = 0;
	return 0;
}

/* The request head, a line at a time (memchr: the hot path). Returns the
 * bytes scanned, len unless refused. */
size_t hp_scan_head(struct hp_parser *p, const char *data, size_t len)
{
	static const char *bare = "bare LF or CR in the request head (CRLF ends a line)";
	size_t i = 0;

	while (i < len) {
		const char *lf;
		size_t end, n;
		int cr;

		if (p->scan.cr) {
			/* the last read ended on a CR: its LF comes first */
			if (data[i] != '\n')
				return scan_refuse(p, 400, bare), i;
			if (head_line_end(p))
				return i;
			i++;
			continue;
		}
		lf = memchr(data + i, '\n', len - i);
		end = lf ? (size_t)(lf - data) : len;
		n = end - i;
		cr = n && data[end - 1] == '\r';
		if (head_line_bytes(p, data + i, n - (size_t)cr))
			return i;
		if (!lf) {
			p->scan.cr = (uint8_t)cr;
			return len;
		}
		if (!cr)
			return scan_refuse(p, 400, bare), end;
		if (head_line_end(p))
			return end;
		i = end + 1;
	}
	return len;
}

/* where a chunk-size line is in its extensions (scan.ext) */
enum { EXT_NONE, EXT_NAME_WANTED, EXT_NAME, EXT_VALUE_WANTED, EXT_VALUE, EXT_QUOTED };

/* Starts a line of the chunked framing. */
static void scan_line(struct hp_parser *p, int where)
{
	p->scan.where = (uint8_t)where;
	p->scan.cr = 0;
	p->scan.len = 0;
	p->scan.sig = 0;
	p->scan.digits = 1;
	p->scan.zeros = 0;
	p->scan.ext = EXT_NONE;
}

/* A chunk extension's byte c (RFC 9112 7.1.1: ";" name ["=" value], the
 * value a token or a quoted-string; llhttp refused whitespace and bad
 * bytes already). An empty name or value is refused: llhttp takes it, a
 * proxy may not. So is a quote after a token's first byte (`a=x"y"`,
 * `a=0""`): llhttp enters a quoted string there, and the value is then
 * neither a token nor a quoted-string (the fuzz's finding). 0, or
 * refused. */
static int ext_byte(struct hp_parser *p, unsigned char c)
{
	static const char *empty = "empty chunk extension name or value";
	uint8_t *e = &p->scan.ext;

	if (*e == EXT_QUOTED) {
		if (c == '"')
			*e = EXT_VALUE;
		return 0;
	}
	if (c == ';' || c == '=') {
		if (*e == EXT_NAME_WANTED || *e == EXT_VALUE_WANTED || (c == '=' && *e != EXT_NAME))
			return scan_refuse(p, 400, empty);
		*e = c == ';' ? EXT_NAME_WANTED : EXT_VALUE_WANTED;
	}
	else if (*e == EXT_NAME_WANTED)
		*e = EXT_NAME;
	else if (*e == EXT_VALUE_WANTED)
		*e = c == '"' ? EXT_QUOTED : EXT_VALUE;
	else if (c == '"')
		return scan_refuse(p, 400, "a quote inside a chunk extension's token");
	return 0;
}

void hp_scan_body_start(struct hp_parser *p)
{
	scan_line(p, SC_SIZE);
	p->scan.extra = 0;               /* held the head's empty lines */
	p->scan.lines = 0;
}

/* A chunked body's framing: the bytes hp_body consumed that are not chunk
 * data (on_body's spans are skipped). Chunk extensions, whitespace and
 * leading zeros of a size are body bytes for lim.body (scan.extra): only
 * the size's significant digits and the CRLFs are free (RFC 9112 7.1).
 * Trailer lines count as field lines. Returns the bytes scanned. */
size_t hp_scan_body(struct hp_parser *p, const char *data, size_t len)
{
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)data[i];
		int kind;

		if (p->scan.where == SC_DATA)
			scan_line(p, SC_DATA_END);        /* the data's CRLF */
		kind = line_byte(p, c);
		if (kind == LINE_BARE)
			return scan_refuse(p, 400, "bare LF or CR in the chunked framing (CRLF ends a line)"), i;
		if (kind == LINE_CR)
			continue;
		if (kind == LINE_END) {
			switch (p->scan.where) {
			case SC_SIZE:
				if (p->scan.ext == EXT_NAME_WANTED || p->scan.ext == EXT_VALUE_WANTED ||
				    p->scan.ext == EXT_QUOTED)
					return scan_refuse(p, 400, "empty or unterminated chunk extension"), i;
				scan_line(p, p->scan.sig ? SC_DATA : SC_TRAILER);
				break;
			case SC_DATA_END:
				scan_line(p, SC_SIZE);
				break;
			case SC_TRAILER:
				if (!p->scan.len) {
					scan_line(p, SC_DONE);
					break;
				}
				if (++p->scan.lines + p->nfields > p->lim.fields)
					return scan_refuse(p, 431, "too many request header and trailer fields"), i;
				scan_line(p, SC_TRAILER);
				break;
			}
			continue;
		}
		p->scan.len++;
		if (p->scan.where == SC_SIZE) {
			int hex = (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');

			if (p->scan.digits && hex && c == '0' && !p->scan.sig) {
				/* one zero is the last chunk's size; more are padding */
				if (++p->scan.zeros > 1)
					p->scan.extra++;
			}
			else if (p->scan.digits && hex) {
				if (!p->scan.sig && p->scan.zeros)
					p->scan.extra++;          /* the first zero was padding too */
				p->scan.sig = 1;
			}
			else {
				p->scan.digits = 0;
				p->scan.extra++;              /* an extension, or whitespace */
				if (ext_byte(p, c))
					return i;
			}
			if (p->lim.body && p->body_seen + p->scan.extra > p->lim.body)
				return scan_refuse(p, 413, "request body too large (chunk extensions and padding count)"), i;
		}
		else if (p->scan.where == SC_TRAILER) {
			if (p->scan.len == 1 && (c == ' ' || c == '\t'))
				/* llhttp joins it to the trailer above, a proxy may not */
				return scan_refuse(p, 400, "obsolete line folding"), i;
			if (p->scan.len + 2 > p->lim.field_size)
				return scan_refuse(p, 431, "request trailer field too large"), i;
		}
	}
	return len;
}
