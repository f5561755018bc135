/* sockherd HTTP/1.1 request parsing: the raw line scanner, httpparse.c's
 * second reader.
 *
 * llhttp's callbacks see spans of the method, target, names and values,
 * never the line ends, the whitespace around values, the empty lines
 * before a request, or a chunk-size line's leading zeros; and llhttp 8.1
 * takes a bare LF for CRLF in places (httpparse.h lists them). So the
 * bytes llhttp consumed are scanned again here, line by line, after each
 * llhttp_execute: each LF must follow a CR, each line counts toward its
 * limit, and the request line's shape is checked. The state (hp_parser's
 * scan) carries across calls: a read may end anywhere. A refusal records
 * the status and reason in the parser and returns the offset of the byte
 * at fault, which httpparse.c reports as consumed.
 */
#ifndef SOCKHERD_HTTPSCAN_H
#define SOCKHERD_HTTPSCAN_H

#include "httpparse.h"

/* which line is being scanned (hp_parser.scan.where) */
enum { SC_REQLINE, SC_FIELDS, SC_HEAD_DONE, SC_SIZE, SC_DATA, SC_DATA_END, SC_TRAILER, SC_DONE };

/* The head's bytes data[0 .. len): len, or the offset of a fault. */
size_t hp_scan_head(struct hp_parser *p, const char *data, size_t len);

/* From the first body byte of a chunked request on. */
void hp_scan_body_start(struct hp_parser *p);

/* A chunked body's framing bytes data[0 .. len) (never chunk data): len,
 * or the offset of a fault. */
size_t hp_scan_body(struct hp_parser *p, const char *data, size_t len);

#endif /* SOCKHERD_HTTPSCAN_H */
