/* The WebSocket codec (RFC 6455) of the native engine, beside the HTTP/1
 * codec (h1.h), and the ASGI adapter's websocket side on top of it.
 *
 *   ws_frame.c  the frame codec: client frames parsed incrementally from
 *               a buffer (no I/O, no Python), messages reassembled and
 *               checked (UTF-8 incrementally), server frames serialised
 *   ws_deflate.c  permessage-deflate (RFC 7692): offers negotiated, a
 *               compressed message inflated, a server message deflated
 *   ws_py.c     its Python face (WsParser, ws_frame) for the tests, the
 *               fuzz oracle and the micro-benchmark
 *   asgi_ws.c, asgi_ws_call.c, asgi_ws_frames.c, asgi_ws_send.c (asgi_ws.h)
 *               the ASGI websocket scope on an upgraded HTTP/1
 *               connection: the handshake, receive/send, the close
 *               handshake, the drain's 1001
 *
 * Why a native codec and not a maintained one (wsproto, websockets):
 * docs/websocket.md, measured by bench/ws_frame_bench.py.
 */
#ifndef SOCKHERD_WS_H
#define SOCKHERD_WS_H

#include <stddef.h>
#include <stdint.h>

/* opcodes */
enum { WS_OP_CONT = 0x0, WS_OP_TEXT = 0x1, WS_OP_BINARY = 0x2, WS_OP_CLOSE = 0x8,
       WS_OP_PING = 0x9, WS_OP_PONG = 0xA };

/* what ws_parse found: nothing whole yet (all input used), a message, a
 * control frame, or the connection's failure (fail_code, fail_reason:
 * the close code to send, 1002 / 1007 / 1009) */
enum ws_event { WS_MORE = 0, WS_TEXT, WS_BINARY, WS_PING, WS_PONG, WS_CLOSE, WS_FAIL };

/* the incremental UTF-8 check: continuation bytes still owed and the
 * range the next one must be in (RFC 3629's table, overlongs and
 * surrogates excluded) */
struct ws_utf8 {
	uint8_t need, lo, hi;
};

struct ws_parser {
	uint64_t max_size;                 /* a message's bound (0: none) -> 1009 */
	/* the frame header being read: hdr[0 .. hlen) of hneed */
	uint8_t hdr[14];
	uint8_t hlen, hneed;
	/* the frame whose payload is being read (in_payload) */
	uint8_t in_payload, fin, opcode, mpos;
	uint8_t mask[4];
	uint64_t left;                     /* payload bytes still to come */
	/* the data message being reassembled: msg_op 0 none, else its opcode */
	uint8_t msg_op;
	uint8_t delivered;                 /* msg was handed out: the next call starts anew */
	/* permessage-deflate's whole state (ws_deflate.c), allocated only
	 * when it was negotiated (ws_pmd_attach): NULL for a WebSocket without
	 * it, the default, which then costs one pointer (memory per idle
	 * WebSocket: issue 23) */
	struct ws_pmd_state *pmd;
	char *msg;
	size_t msg_len, msg_cap;
	struct ws_utf8 utf8;
	/* a control frame's payload (<= 125 bytes): allocated for a frame
	 * that has one, freed by the next call (an idle WebSocket holds none:
	 * issue 23); read it through ws_ctl */
	uint8_t *ctl;
	uint8_t ctl_len;
	/* WS_CLOSE: the peer's code (1005: none given) and reason (ctl + 2) */
	int close_code;
	/* WS_FAIL (sticky): the close code we answer and why */
	int fail_code;
	const char *fail_reason;
};

void ws_init(struct ws_parser *p, uint64_t max_size);
void ws_free(struct ws_parser *p);
/* No input waits: the buffers an idle connection need not hold are
 * freed (a control frame's payload already handed out, the message
 * buffer unless a fragmented message is being reassembled); ws_parse
 * allocates again as frames come. */
void ws_trim(struct ws_parser *p);
/* The message ws_parse just handed out has been copied: its buffer, if
 * larger than a burst's (16 KiB), is freed now, not at the next call,
 * which may be long in coming when the app is behind (a message inflated
 * to ws_max_size was held twice per stalled WebSocket: issue 35, point
 * 18). */
void ws_let_go(struct ws_parser *p);
/* Parses data[0 .. len) up to the first event: *used receives the bytes
 * consumed. WS_TEXT / WS_BINARY: the message is msg[0 .. msg_len), valid
 * until the next call (which starts a new one); WS_PING / WS_PONG /
 * WS_CLOSE: the payload is ws_ctl(p)[0 .. ctl_len); WS_FAIL: nothing more is
 * parsed (every later call says WS_FAIL again, using nothing). -1: out of
 * memory (the parser is unchanged past *used). */
int ws_parse(struct ws_parser *p, const uint8_t *data, size_t len, size_t *used);
/* The payload of the control frame ws_parse just handed out (WS_PING,
 * WS_PONG, WS_CLOSE): ctl_len bytes, never NULL. */
static inline const uint8_t *ws_ctl(const struct ws_parser *p)
{
	return p->ctl ? p->ctl : (const uint8_t *)"";
}
/* Whether reason[0 .. n) is whole, valid UTF-8. */
int ws_utf8_valid(const uint8_t *s, size_t n);
/* A close code a peer may send (RFC 6455 7.4, IANA's registry: 1000-1003,
 * 1007-1014, 3000-4999). */
int ws_close_code_ok(int code);
/* A server frame's header (FIN set, unmasked) for a payload of len bytes:
 * written to out (room for 10), its length returned. opcode may carry
 * RSV1 (0x40: a compressed message, permessage-deflate). */
size_t ws_frame_head(uint8_t *out, int opcode, uint64_t len);

/* ---- permessage-deflate (RFC 7692), ws_deflate.c ---- */

/* What was negotiated (on 0: nothing): the two no_context_takeover
 * parameters, the server_max_window_bits offered (0: none) */
struct ws_pmd {
	uint8_t on, server_no_takeover, client_no_takeover, server_bits;
};
/* One WebSocket's permessage-deflate, behind struct ws_parser's pmd: what
 * was negotiated (RSV1 allowed on a message's first frame; neg's
 * client_no_takeover resets the inflater after each message, its
 * server_no_takeover the deflater, server_bits bounds the deflater's
 * window), whether the message being reassembled has RSV1 (inflated once
 * whole), and zlib's two streams, each NULL until a message needs it. */
struct ws_pmd_state {
	struct ws_pmd neg;
	uint8_t msg_deflated;
	void *inflater, *deflater;
};
/* p takes permessage-deflate as negotiated (neg->on set): its state
 * allocated, 0; -1 out of memory (p unchanged). Freed by ws_free. */
int ws_pmd_attach(struct ws_parser *p, const struct ws_pmd *neg);
/* Whether the message being reassembled is a compressed one. */
static inline int ws_msg_deflated(const struct ws_parser *p)
{
	return p->pmd && p->pmd->msg_deflated;
}
#define WS_PMD_ANSWER_MAX 128
/* The first permessage-deflate offer of a Sec-WebSocket-Extensions value
 * s[0 .. n) that we take: 1 (into *pmd), 0 none (*pmd unchanged). */
int ws_pmd_offers(const char *s, size_t n, struct ws_pmd *pmd);
/* Our answer's Sec-WebSocket-Extensions value into out (room for
 * WS_PMD_ANSWER_MAX), its length returned. */
size_t ws_pmd_answer(const struct ws_pmd *pmd, char *out);
/* A whole compressed message msg[0 .. msg_len) replaced by its inflated
 * bytes: 0, or WS_FAIL (1007 not deflate data, 1009 past max_size once
 * inflated, 1011 out of memory). */
int ws_inflate_msg(struct ws_parser *p);
/* The server's side, with pmd's deflater (made at the first message):
 * data[0 .. n) compressed as one message into *out (malloc'd, the caller
 * frees) of *outlen bytes, the sync flush's tail removed: 0, or -1 out
 * of memory. */
int ws_deflate_msg(struct ws_pmd_state *pmd, const uint8_t *data, size_t n, uint8_t **out,
                   size_t *outlen);
/* p's permessage-deflate state freed (zlib's streams with it); p->pmd NULL. */
void ws_pmd_free(struct ws_parser *p);

/* ---- the Python side (ws_py.c): for files that include Python.h ---- */
#ifdef Py_PYTHON_H
extern PyTypeObject WsParserType;
/* the module's functions: ws_frame (ws_py.c) */
extern PyMethodDef ws_module_methods[];
#endif

#endif /* SOCKHERD_WS_H */
