/* sockherd HTTP/1.1 request parsing: llhttp (strict mode, never lenient)
 * plus the checks RFC 9112/9110 ask for that llhttp leaves to its caller.
 *
 * One hp_parser per connection. Plain C, no Python: the worker's extension
 * (httpmodule.c) builds environ from what it collects, and the native fuzz
 * and sanitizer tests drive it directly.
 *
 * What it adds to llhttp (each answered with a status and the connection
 * closed):
 *   - a request line past lim.line (414), field lines past lim.header_bytes
 *     or lim.headers (431), a declared or received body past lim.body (413);
 *   - a version other than HTTP/1.0 and 1.1, and the HTTP/2 preface (505);
 *   - a missing or repeated Host on HTTP/1.1 (400);
 *   - Transfer-Encoding on HTTP/1.0 (400);
 *   - Content-Length, Transfer-Encoding or Host in chunked trailers (400);
 *     other trailer fields are dropped, never merged into the head.
 * llhttp itself refuses Content-Length with Transfer-Encoding, a
 * Transfer-Encoding not ending in chunked, bad or overflowing lengths and
 * chunk sizes, a missing CRLF after chunk data, bare CR or LF, NUL,
 * whitespace before a colon, obsolete line folding, invalid methods and
 * field names.
 */
#ifndef SOCKHERD_HTTPPARSE_H
#define SOCKHERD_HTTPPARSE_H

#include <stddef.h>
#include <stdint.h>

#include "llhttp.h"

struct hp_limits {
	uint32_t line;           /* method SP request-target (bytes) */
	uint32_t header_bytes;   /* field names and values together */
	uint32_t headers;        /* field lines */
	uint64_t body;           /* body bytes; 0: no limit */
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
	uint32_t line_bytes, field_bytes;
	int hosts;               /* Host fields seen */
	int upgrade;             /* llhttp stopped at an upgrade: no request follows */
	int in_field;            /* a field name is being collected */
	int prev_lf;             /* the last head byte scanned was LF (fold check) */
	int started;             /* a byte of the current request arrived */
	int64_t length;          /* Content-Length, -1 if none (set with the head) */
	char trailer[20];        /* a trailer field's name, enough to recognise */
	uint32_t trailer_len;    /* the three forbidden ones (its full length) */
	/* body bytes parsed by the current hp_body call */
	char *out;
	size_t out_len, out_cap;
	uint64_t body_seen;
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

#endif /* SOCKHERD_HTTPPARSE_H */
