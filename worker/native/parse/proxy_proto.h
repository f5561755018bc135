/* The PROXY protocol (HAProxy's doc/proxy-protocol.txt), versions 1 and 2:
 * a header a proxy sends ahead of a connection's own bytes, naming the
 * client it accepted. A pure parser: bytes in, a verdict out, no I/O, no
 * Python, no allocation (the fuzz target and its oracle drive it alone,
 * bench/fuzz_proxy.sh).
 *
 * It reads only the header's bytes: the verdict says how many there were,
 * and what follows them (the first request, or a stream's data) is the
 * caller's to hand to the protocol above. Views into the input (TLV
 * values, unix paths) stay valid as long as the input does.
 */
#ifndef SOCKHERD_PROXY_PROTO_H
#define SOCKHERD_PROXY_PROTO_H

#include <stddef.h>
#include <stdint.h>

/* what a listener expects (the proxy_protocol setting) */
enum { PP_OFF = 0, PP_V1 = 1, PP_V2 = 2, PP_AUTO = 3 };

/* v1: a line of at most 107 bytes, CRLF included (the spec's bound) */
#define PP_V1_MAX 107
/* v2: 16 bytes, then `len` more; len bounded here (the spec allows 65535:
 * no proxy sends near that, and a header is held whole before it counts) */
#define PP_V2_HEAD 16
#define PP_V2_MAX_LEN 2048

/* Verdicts below 0: why a header is refused (pp_strerror names them). */
enum {
	PP_E_MISSING = 1,     /* the bytes are not a PROXY header of the versions expected */
	PP_E_V1_TOO_LONG,     /* no CRLF within 107 bytes */
	PP_E_V1_SYNTAX,       /* not "PROXY TCP4|TCP6 src dst sport dport" or "PROXY UNKNOWN..." */
	PP_E_V1_ADDRESS,      /* an address that is not its family's */
	PP_E_V1_PORT,         /* a port that is not 0..65535 without leading zeros */
	PP_E_V2_VERSION,      /* version nibble not 2 */
	PP_E_V2_COMMAND,      /* command not LOCAL or PROXY */
	PP_E_V2_FAMILY,       /* family or transport not one of the spec's (or a datagram one) */
	PP_E_V2_TOO_LONG,     /* len past PP_V2_MAX_LEN */
	PP_E_V2_SHORT,        /* len shorter than the family's addresses */
	PP_E_V2_TLV,          /* a TLV past the header's end, or a known one of a bad length, twice */
	PP_E_V2_CRC,          /* a CRC32C TLV that does not match */
	PP_E_ERRORS
};

/* a view of bytes inside the input; n == 0 with p NULL: absent */
struct pp_bytes {
	const uint8_t *p;
	size_t n;
};

/* The SSL TLV (0x20) of v2: the client's flags, the verify result and the
 * sub-TLVs a proxy that ended TLS tells. */
struct pp_ssl {
	int present;
	uint8_t client;                      /* PP2_CLIENT_SSL 1, CERT_CONN 2, CERT_SESS 4 */
	uint32_t verify;                     /* 0: the client's certificate verified */
	struct pp_bytes version, cn, cipher, sig_alg, key_alg;
};

struct pp_result {
	int version;                         /* 1 or 2 */
	/* 1: keep the socket's own peer (v2 LOCAL: the proxy's health check;
	 * v1 UNKNOWN; v2 UNSPEC) */
	int local;
	int family;                          /* AF_INET, AF_INET6, AF_UNIX, or AF_UNSPEC when local */
	uint8_t src[16], dst[16];            /* AF_INET: the first 4 bytes */
	uint16_t sport, dport;
	struct pp_bytes src_path, dst_path;  /* AF_UNIX: up to the first NUL */
	struct pp_bytes alpn, authority, unique_id;
	struct pp_ssl ssl;
	int crc_checked;                     /* a CRC32C TLV was there, and matched */
};

/* Parses the header at the start of buf[0 .. len) as `mode` (PP_V1, PP_V2
 * or PP_AUTO: whichever the first byte announces). Returns the header's
 * length (> 0, *r filled), 0 if more bytes are needed (a prefix of a
 * valid header so far, as far as the rules below look), or -PP_E_*.
 * Incremental rules, so that any split of the bytes gives one verdict:
 * v2 checks its signature byte by byte, the rest once 16 bytes are here,
 * then waits for all len bytes; v1 checks "PROXY " byte by byte, then
 * waits for its LF (at most 107 bytes) and checks the line whole. */
int pp_parse(const uint8_t *buf, size_t len, int mode, struct pp_result *r);

/* For a peer that may not send a header: whether buf begins with either
 * version's signature ("PROXY " or v2's 12 bytes): 1 yes, 0 no (the
 * bytes are the protocol's above), -1 a prefix of one so far. */
int pp_signature(const uint8_t *buf, size_t len);

/* the reason of a -PP_E_* verdict, a static string */
const char *pp_strerror(int verdict);

/* CRC32C (Castagnoli) of buf, as the v2 CRC TLV carries it */
uint32_t pp_crc32c(const uint8_t *buf, size_t len);

#endif /* SOCKHERD_PROXY_PROTO_H */
