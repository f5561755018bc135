/* The PROXY protocol parser (proxy_proto.h says what it takes and gives).
 *
 * Strict where the spec says "must" and where leniency would let two
 * readers of one header disagree (bench/fuzz_proxy.sh compares this parser
 * with a Python reference on every input): single spaces in v1, ports
 * without leading zeros, addresses of the announced family only, v2's
 * command, family and transport from the spec's lists, a length that
 * covers the family's addresses, TLVs that end exactly at the header's
 * end, a CRC32C TLV that matches. Unknown TLV types are skipped (the spec
 * lets a receiver ignore what it does not know).
 *
 * May call: libc only (inet_pton).
 */
#include <arpa/inet.h>
#include <string.h>
#include <sys/socket.h>

#include "proxy_proto.h"

static const uint8_t V2_SIG[12] = {0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49,
                                   0x54, 0x0A};
static const char V1_SIG[] = "PROXY ";
#define V1_SIG_LEN 6

/* v2 TLV types (the spec's PP2_TYPE_*) */
enum {
	T_ALPN = 0x01, T_AUTHORITY = 0x02, T_CRC32C = 0x03, T_NOOP = 0x04, T_UNIQUE_ID = 0x05,
	T_SSL = 0x20, T_SSL_VERSION = 0x21, T_SSL_CN = 0x22, T_SSL_CIPHER = 0x23,
	T_SSL_SIG_ALG = 0x24, T_SSL_KEY_ALG = 0x25,
};
#define UNIQUE_ID_MAX 128

static const char *const REASONS[PP_E_ERRORS] = {
	[0] = "no error",
	[PP_E_MISSING] = "no PROXY protocol header",
	[PP_E_V1_TOO_LONG] = "PROXY v1 header longer than 107 bytes",
	[PP_E_V1_SYNTAX] = "malformed PROXY v1 header",
	[PP_E_V1_ADDRESS] = "PROXY v1 header with a bad address",
	[PP_E_V1_PORT] = "PROXY v1 header with a bad port",
	[PP_E_V2_VERSION] = "PROXY v2 header of an unknown version",
	[PP_E_V2_COMMAND] = "PROXY v2 header with an unknown command",
	[PP_E_V2_FAMILY] = "PROXY v2 header with an unsupported family or transport",
	[PP_E_V2_TOO_LONG] = "PROXY v2 header longer than 2048 bytes",
	[PP_E_V2_SHORT] = "PROXY v2 header shorter than its addresses",
	[PP_E_V2_TLV] = "PROXY v2 header with a malformed TLV",
	[PP_E_V2_CRC] = "PROXY v2 header whose CRC32C does not match",
};

const char *pp_strerror(int verdict)
{
	int e = -verdict;

	return e > 0 && e < PP_E_ERRORS ? REASONS[e] : "unknown PROXY protocol verdict";
}

/* ---- CRC32C: bitwise, reflected polynomial 0x82F63B78 (a header is at
 * most 2064 bytes, once per connection: no table needed) ---- */
uint32_t pp_crc32c(const uint8_t *buf, size_t len)
{
	uint32_t crc = 0xFFFFFFFFu;

	for (size_t i = 0; i < len; i++) {
		crc ^= buf[i];
		for (int k = 0; k < 8; k++)
			crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
	}
	return ~crc;
}

/* ---- signatures ---- */

/* 1 buf begins with sig, 0 it cannot, -1 a prefix of it so far */
static int starts(const uint8_t *buf, size_t len, const uint8_t *sig, size_t n)
{
	size_t k = len < n ? len : n;

	if (memcmp(buf, sig, k) != 0)
		return 0;
	return len >= n ? 1 : -1;
}

int pp_signature(const uint8_t *buf, size_t len)
{
	int a = starts(buf, len, (const uint8_t *)V1_SIG, V1_SIG_LEN);
	int b = starts(buf, len, V2_SIG, sizeof(V2_SIG));

	if (a == 1 || b == 1)
		return 1;
	return a == -1 || b == -1 ? -1 : 0;
}

/* ---- version 1 ---- */

/* "0".."65535", no sign, no leading zero */
static int v1_port(const char *s, size_t n, uint16_t *out)
{
	unsigned long v = 0;

	if (n == 0 || n > 5 || (n > 1 && s[0] == '0'))
		return -1;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (unsigned long)(s[i] - '0');
	}
	if (v > 65535)
		return -1;
	*out = (uint16_t)v;
	return 0;
}

static int v1_addr(int family, const char *s, size_t n, uint8_t *out)
{
	char text[64];

	if (n == 0 || n >= sizeof(text) || memchr(s, '\0', n))
		return -1;
	memcpy(text, s, n);
	text[n] = '\0';
	return inet_pton(family, text, out) == 1 ? 0 : -1;
}

/* the line buf[0 .. n) without its CRLF, "PROXY " checked already */
static int v1_line(const uint8_t *buf, size_t n, struct pp_result *r)
{
	const char *s = (const char *)buf + V1_SIG_LEN, *end = (const char *)buf + n;
	const char *f[4];
	size_t fl[4];
	int family;

	if (end - s >= 7 && memcmp(s, "UNKNOWN", 7) == 0 && (end - s == 7 || s[7] == ' ')) {
		r->local = 1;                      /* the rest, whatever it is, is ignored */
		r->family = AF_UNSPEC;
		return 0;
	}
	if (end - s < 5 || s[4] != ' ' || (memcmp(s, "TCP4", 4) != 0 && memcmp(s, "TCP6", 4) != 0))
		return -PP_E_V1_SYNTAX;
	family = s[3] == '4' ? AF_INET : AF_INET6;
	s += 5;
	/* exactly four fields, one space apart */
	for (int i = 0; i < 4; i++) {
		const char *sp = memchr(s, ' ', (size_t)(end - s));

		if ((i < 3) != (sp != NULL))
			return -PP_E_V1_SYNTAX;
		f[i] = s;
		fl[i] = (size_t)((sp ? sp : end) - s);
		if (fl[i] == 0)
			return -PP_E_V1_SYNTAX;
		s = sp ? sp + 1 : end;
	}
	if (v1_addr(family, f[0], fl[0], r->src) < 0 || v1_addr(family, f[1], fl[1], r->dst) < 0)
		return -PP_E_V1_ADDRESS;
	if (v1_port(f[2], fl[2], &r->sport) < 0 || v1_port(f[3], fl[3], &r->dport) < 0)
		return -PP_E_V1_PORT;
	r->family = family;
	return 0;
}

static int v1(const uint8_t *buf, size_t len, struct pp_result *r)
{
	int sig = starts(buf, len, (const uint8_t *)V1_SIG, V1_SIG_LEN);
	size_t look = len < PP_V1_MAX ? len : PP_V1_MAX;
	const uint8_t *lf;
	size_t n;
	int rc;

	if (sig == 0)
		return -PP_E_MISSING;
	if (sig < 0)
		return 0;
	lf = memchr(buf, '\n', look);
	if (!lf)
		return len >= PP_V1_MAX ? -PP_E_V1_TOO_LONG : 0;
	n = (size_t)(lf - buf);                /* the LF's index: the line is buf[0 .. n-1) */
	if (buf[n - 1] != '\r' || memchr(buf, '\r', n - 1))
		return -PP_E_V1_SYNTAX;
	r->version = 1;
	rc = v1_line(buf, n - 1, r);
	return rc < 0 ? rc : (int)(n + 1);
}

/* ---- version 2 ---- */

/* a TLV's value as a view; a second one of the same type is malformed */
static int once(struct pp_bytes *b, const uint8_t *p, size_t n)
{
	if (b->p)
		return -1;
	b->p = p;
	b->n = n;
	return 0;
}

static int ssl_tlv(const uint8_t *p, size_t n, struct pp_ssl *ssl)
{
	size_t i = 5;

	if (n < 5 || ssl->present)
		return -1;
	ssl->present = 1;
	ssl->client = p[0];
	ssl->verify = (uint32_t)p[1] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 8 | p[4];
	while (i < n) {
		size_t vl;
		const uint8_t *v;
		struct pp_bytes *into = NULL;

		if (n - i < 3)
			return -1;
		vl = (size_t)p[i + 1] << 8 | p[i + 2];
		if (n - i - 3 < vl)
			return -1;
		v = p + i + 3;
		switch (p[i]) {
		case T_SSL_VERSION: into = &ssl->version; break;
		case T_SSL_CN: into = &ssl->cn; break;
		case T_SSL_CIPHER: into = &ssl->cipher; break;
		case T_SSL_SIG_ALG: into = &ssl->sig_alg; break;
		case T_SSL_KEY_ALG: into = &ssl->key_alg; break;
		default: break;
		}
		if (into && once(into, v, vl) < 0)
			return -1;
		i += 3 + vl;
	}
	return 0;
}

/* The TLVs of buf[from .. total): each whole, known ones of valid sizes. */
static int v2_tlvs(const uint8_t *buf, size_t from, size_t total, struct pp_result *r)
{
	size_t i = from;
	size_t crc_at = 0;

	while (i < total) {
		size_t vl;
		const uint8_t *v;
		int bad = 0;

		if (total - i < 3)
			return -PP_E_V2_TLV;
		vl = (size_t)buf[i + 1] << 8 | buf[i + 2];
		if (total - i - 3 < vl)
			return -PP_E_V2_TLV;
		v = buf + i + 3;
		switch (buf[i]) {
		case T_ALPN: bad = once(&r->alpn, v, vl); break;
		case T_AUTHORITY: bad = once(&r->authority, v, vl); break;
		case T_UNIQUE_ID: bad = vl > UNIQUE_ID_MAX || once(&r->unique_id, v, vl); break;
		case T_CRC32C:
			bad = vl != 4 || crc_at;
			crc_at = i + 3;
			break;
		case T_SSL: bad = ssl_tlv(v, vl, &r->ssl); break;
		default: break;                    /* NOOP and unknown types: skipped */
		}
		if (bad)
			return -PP_E_V2_TLV;
		i += 3 + vl;
	}
	if (crc_at) {
		/* over the whole header with the CRC's own 4 bytes as zeros */
		uint8_t copy[PP_V2_HEAD + PP_V2_MAX_LEN];
		uint32_t want = (uint32_t)buf[crc_at] << 24 | (uint32_t)buf[crc_at + 1] << 16 |
		                (uint32_t)buf[crc_at + 2] << 8 | buf[crc_at + 3];

		memcpy(copy, buf, total);
		memset(copy + crc_at, 0, 4);
		if (pp_crc32c(copy, total) != want)
			return -PP_E_V2_CRC;
		r->crc_checked = 1;
	}
	return 0;
}

/* a unix path of the v2 block: up to its first NUL */
static struct pp_bytes path_of(const uint8_t *p)
{
	const uint8_t *nul = memchr(p, '\0', 108);

	return (struct pp_bytes){p, nul ? (size_t)(nul - p) : 108};
}

static int v2(const uint8_t *buf, size_t len, struct pp_result *r)
{
	int sig = starts(buf, len, V2_SIG, sizeof(V2_SIG));
	size_t body, total, need;
	uint8_t cmd, fam, proto;

	if (sig == 0)
		return -PP_E_MISSING;
	if (len < PP_V2_HEAD)
		return 0;
	if (buf[12] >> 4 != 2)
		return -PP_E_V2_VERSION;
	cmd = buf[12] & 0x0F;
	if (cmd > 1)
		return -PP_E_V2_COMMAND;
	body = (size_t)buf[14] << 8 | buf[15];
	if (body > PP_V2_MAX_LEN)
		return -PP_E_V2_TOO_LONG;
	fam = buf[13] >> 4;
	proto = buf[13] & 0x0F;
	/* LOCAL: "the family is ignored" (the spec), and so is the rest */
	if (cmd == 1) {
		/* a stream server takes TCP (1) over INET, INET6, UNIX, or UNSPEC/UNSPEC */
		if (!(buf[13] == 0x00 || ((fam >= 1 && fam <= 3) && proto == 1)))
			return -PP_E_V2_FAMILY;
	}
	total = PP_V2_HEAD + body;
	if (len < total)
		return 0;
	r->version = 2;
	if (cmd == 0) {
		r->local = 1;
		r->family = AF_UNSPEC;
		return (int)total;
	}
	switch (fam) {
	case 1: need = 12; break;
	case 2: need = 36; break;
	case 3: need = 216; break;
	default: need = 0; break;
	}
	if (body < need)
		return -PP_E_V2_SHORT;
	{
		const uint8_t *a = buf + PP_V2_HEAD;
		int rc;

		switch (fam) {
		case 1:
			r->family = AF_INET;
			memcpy(r->src, a, 4);
			memcpy(r->dst, a + 4, 4);
			r->sport = (uint16_t)(a[8] << 8 | a[9]);
			r->dport = (uint16_t)(a[10] << 8 | a[11]);
			break;
		case 2:
			r->family = AF_INET6;
			memcpy(r->src, a, 16);
			memcpy(r->dst, a + 16, 16);
			r->sport = (uint16_t)(a[32] << 8 | a[33]);
			r->dport = (uint16_t)(a[34] << 8 | a[35]);
			break;
		case 3:
			r->family = AF_UNIX;
			r->src_path = path_of(a);
			r->dst_path = path_of(a + 108);
			break;
		default:
			r->local = 1;                  /* UNSPEC: the addresses are the socket's */
			r->family = AF_UNSPEC;
			break;
		}
		rc = v2_tlvs(buf, PP_V2_HEAD + need, total, r);
		if (rc < 0)
			return rc;
	}
	return (int)total;
}

int pp_parse(const uint8_t *buf, size_t len, int mode, struct pp_result *r)
{
	memset(r, 0, sizeof(*r));
	if (len == 0)
		return 0;
	if (mode == PP_AUTO)
		mode = buf[0] == V2_SIG[0] ? PP_V2 : PP_V1;
	return mode == PP_V2 ? v2(buf, len, r) : v1(buf, len, r);
}
