/* sockherd HTTP/1.1 request parsing: llhttp (strict mode, never lenient)
 * plus the checks RFC 9112/9110 ask for that llhttp leaves to its caller,
 * or that llhttp 8.1 gets wrong even in strict mode.
 *
 * One hp_parser per connection. Plain C, no Python: the worker's extension
 * (wsgi_environ.c) builds environ from what it collects, and the native fuzz
 * and sanitizer tests drive it directly.
 *
 * llhttp 8.1 strict still accepts, and we refuse (400): a bare LF ending
 * the request line, an empty line before it, or the head; a bare LF
 * ending the last chunk's trailer section ("0\r\n\n", "0\r\nX: 1\r\n\n":
 * it served the bytes after it as a new request; RFC 9112 2.2, 7.1);
 * doubled spaces in the request line and a request line without a
 * version (HTTP/0.9, then served with headers and no Host check; 3);
 * an empty Transfer-Encoding (beside Content-Length it framed by the
 * length; 6.1); obsolete line folding in the head and in trailers (5.2:
 * llhttp joins the line to the field above). These are found on the raw
 * bytes by a line scanner (httpscan.c) that re-reads what
 * llhttp consumed: its callbacks never see line ends, whitespace, empty
 * lines or the leading zeros of a chunk size.
 *
 * What else it adds to llhttp (each answered with a status and the
 * connection closed):
 *   - every byte before the app sees the body counts toward a limit
 *     (scanned raw): the request line, leading empty lines included,
 *     toward lim.line (414); each field line, whitespace included, toward
 *     lim.field_size and the field lines toward lim.fields (431), trailer
 *     lines too; a declared or received body past lim.body (413), where
 *     chunk extensions and leading zeros of chunk sizes count as body;
 *   - a version other than HTTP/1.0 and 1.1, and the HTTP/2 preface (505);
 *   - a missing or repeated Host on HTTP/1.1, a Host that is not one
 *     host[:port] (a list, letters in the port), an absolute-form target
 *     not of http(s) or without a valid host (400);
 *   - Transfer-Encoding with Content-Length, on HTTP/1.0, empty, or not
 *     ending in chunked (400); a coding other than chunked before it (501:
 *     we decode none, RFC 9112 6.1);
 *   - a "*" target with a method other than OPTIONS, and a target of
 *     "*" and more bytes, which llhttp takes (400, RFC 9112 3.2.4);
 *   - an empty field name in trailers (400, 5.1);
 *   - Content-Length, Transfer-Encoding or Host in chunked trailers (400);
 *     other trailer fields are dropped, never merged into the head.
 * llhttp itself refuses bad or overflowing lengths (a sign, a list, two
 * fields) and chunk sizes (a sign, whitespace), a bare LF after a field
 * line, a chunk-size line or chunk data, chunked twice, bare CR, NUL,
 * CR or LF in a quoted chunk extension, whitespace before a colon, invalid
 * methods and field names (the tests in test_http_smuggling.py keep
 * every one of these as a guard).
 */
#ifndef SOCKHERD_HTTPPARSE_H
#define SOCKHERD_HTTPPARSE_H

#include <stddef.h>
#include <stdint.h>

#include "llhttp.h"

struct hp_limits {
	uint32_t line;           /* the request line, CRLF excluded, leading empty lines included */
	uint32_t field_size;     /* one field line (head or trailer), its CRLF included */
	uint32_t fields;         /* field lines of the head and trailers together */
	uint64_t body;           /* body bytes, chunk padding included; 0: no limit */
};

/* One field line of the head: offsets into hp_parser.head. */
struct hp_field {
	uint32_t name, name_len, value, value_len;
};

enum hp_state {
	HP_HEAD,     /* reading a request head */
	HP_BODY,     /* head complete; body bytes (if any) follow */
	HP_DONE,     /* request complete; hp_next() starts the next one */
	HP_ERROR,    /* status and reason say why; the connection must close */
};

struct hp_parser {
	llhttp_t ll;
	struct hp_limits lim;
	enum hp_state state;
	int status;              /* HP_ERROR: the status to answer (400, 413, ...) */
	const char *reason;      /* HP_ERROR: why (static or llhttp's) */
	/* the head being parsed: the target, then field names and values */
	char *head;
	uint32_t head_len, head_cap;
	uint32_t url_len;        /* the target is head[0 .. url_len) */
	struct hp_field *fields;
	uint32_t nfields, cap_fields;
	int in_value;            /* the last field data was a value */
	uint32_t field_bytes;    /* name and value of the field being collected */
	int hosts;               /* Host fields seen */
	int host;                /* index of the Host field */
	int te_fields;           /* Transfer-Encoding fields seen */
	int content_types;       /* Content-Type fields seen */
	int upgrade;             /* llhttp stopped at an upgrade: no request follows */
	int in_field;            /* a field name is being collected */
	int started;             /* a byte of the current request arrived */
	int version_done;        /* the request line's version was read whole */
	int64_t length;          /* Content-Length, -1 if none (set with the head) */
	char trailer[20];        /* a trailer field's name, enough to recognise */
	uint32_t trailer_len;    /* the three forbidden ones (its full length) */
	/* body bytes parsed by the current hp_body call */
	char *out;
	size_t out_len, out_cap;
	uint64_t body_seen;
	/* the raw line scanner: the head, then a chunked body's framing */
	struct {
		uint8_t where;       /* SC_* in httpparse.c: which line is being scanned */
		uint8_t cr;          /* the last byte was CR */
		uint8_t sp;          /* request line: SPs seen */
		uint8_t after_sp;    /* request line: the last byte was SP */
		uint8_t sig;         /* chunk-size line: a significant digit was seen */
		uint8_t digits;      /* chunk-size line: still in its leading hex digits */
		uint8_t ext;         /* chunk-size line: where in an extension (EXT_* in httpscan.c) */
		uint32_t zeros;      /* chunk-size line: leading zeros */
		uint32_t lines;      /* trailer lines */
		uint64_t len;        /* bytes of this line, CR and LF excluded */
		uint64_t extra;      /* chunk extensions and padding: count as body */
		const char *gap;     /* hp_body: the first byte not scanned yet */
	} scan;
};

/* Sets p up for a connection's first request; 0 or -ENOMEM. */
int hp_init(struct hp_parser *p, const struct hp_limits *lim);
void hp_free(struct hp_parser *p);

/* Parses data while state is HP_HEAD. Returns the bytes consumed: all of
 * them, or those up to the end of the head (state HP_BODY, or HP_DONE for a
 * request without a body), or up to an error (HP_ERROR). */
size_t hp_head(struct hp_parser *p, const char *data, size_t len);

/* Parses body bytes while state is HP_BODY, copying the body (chunked
 * framing removed) to out, which has room for at least len bytes. Returns
 * the bytes of data consumed; *out_len receives the body bytes written.
 * Stops at the end of the request (HP_DONE) or an error (HP_ERROR). */
size_t hp_body(struct hp_parser *p, const char *data, size_t len, char *out, size_t *out_len);

/* After HP_DONE: ready for the next request on the connection. 0, or -1 if
 * none may follow (an upgrade, or the last request asked to close). */
int hp_next(struct hp_parser *p);

/* Frees the head buffers between requests (HP_HEAD with nothing parsed):
 * they are allocated again by the next request. */
void hp_trim(struct hp_parser *p);

/* The request's framing, valid from HP_BODY on. */
int hp_keep_alive(const struct hp_parser *p);
int hp_chunked(const struct hp_parser *p);
/* Content-Length, or -1 for none (chunked, or no body). */
int64_t hp_content_length(const struct hp_parser *p);

/* httptarget.c: from HP_BODY on, whether the target is in absolute-form
 * (RFC 9112 3.2.2); if so *host, *host_len receive its authority
 * (userinfo dropped) and *path the offset where its path, query or
 * fragment starts, all into p->head. */
int hp_absolute(const struct hp_parser *p, uint32_t *host, uint32_t *host_len, uint32_t *path);

/* Percent-decodes s[0 .. n) into out (room for n bytes); an invalid
 * escape stays as it is. Returns the bytes written. (The adapters' paths:
 * WSGI's PATH_INFO, ASGI's path.) */
size_t hp_unquote(const char *s, size_t n, char *out);

/* httplist.c: a field's comma-separated list (RFC 9110 5.6.1). The next
 * element of *s .. end, its OWS trimmed (it may be empty: the caller
 * skips those), *s moved past its comma: 1, or 0 at the list's end. */
int hp_list_next(const char **s, const char *end, const char **item, size_t *len);
/* Whether some field named name lists token (names and tokens compared
 * case-insensitively: Connection: upgrade, TE: trailers). */
int hp_has_token(const struct hp_parser *p, const char *name, const char *token);

#endif /* SOCKHERD_HTTPPARSE_H */
