"""A straightforward RFC 6455 model of what a server must make of a
client's byte stream: the reference the native frame codec
(worker/native/proto/ws/ws_frame.c, its Python face WsParser) is compared with,
frame by frame and message by message (test_ws_frame_fuzz.py).

Written for clarity, not speed: whole-input parsing, every check in the
order the RFC lists them, as the codec decides them once a frame's whole
header is in. With deflate (permessage-deflate negotiated, RFC 7692) RSV1
marks a compressed message, inflated by Python's zlib once whole (reset:
client_no_context_takeover, a fresh inflater per message). Events: ("text", str), ("binary", bytes), ("ping" | "pong",
bytes), ("close", code, reason), ("fail", code) (the codec's fail also
carries its reason; the oracle compares the code)."""
from __future__ import annotations

import os
import struct
import zlib

OPCODES = {0x0, 0x1, 0x2, 0x8, 0x9, 0xA}


def close_code_ok(code: int) -> bool:
    return 1000 <= code <= 1003 or 1007 <= code <= 1014 or 3000 <= code <= 4999


def utf8_prefix_ok(data: bytes) -> bool:
    """Whether data could still become valid UTF-8 (a truncated last
    sequence is fine, anything else wrong is not)."""
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError as exc:
        return exc.reason == "unexpected end of data" and exc.end == len(data)


TAIL = b"\x00\x00\xff\xff"


def parse(data: bytes, max_size: int, *, deflate: bool = False,
          reset: bool = False) -> list[tuple]:
    events: list[tuple] = []
    i = 0
    msg_op = 0
    msg = bytearray()
    deflated = False
    inflater = zlib.decompressobj(-15)

    def fail(code):
        events.append(("fail", code))
        return events

    while True:
        if len(data) - i < 2:
            return events
        b0, b1 = data[i], data[i + 1]
        l7 = b1 & 0x7F
        ext = 2 if l7 == 126 else 8 if l7 == 127 else 0
        masked = b1 >> 7
        hlen = 2 + ext + (4 if masked else 0)
        if len(data) - i < hlen:
            return events
        fin, op = b0 >> 7, b0 & 0x0F
        control = op >= 8
        if b0 & (0x30 if deflate else 0x70):
            return fail(1002)
        if op not in OPCODES:
            return fail(1002)
        if control and not fin:
            return fail(1002)
        if b0 & 0x40 and (control or op == 0):
            return fail(1002)                   # RSV1: a message's first frame only
        if control and l7 > 125:
            return fail(1002)
        if not masked:
            return fail(1002)
        n = l7
        if l7 == 126:
            n = struct.unpack_from("!H", data, i + 2)[0]
        elif l7 == 127:
            n = struct.unpack_from("!Q", data, i + 2)[0]
            if n >> 63:
                return fail(1002)
        if l7 == 126 and n < 126 or l7 == 127 and n < 65536:
            return fail(1002)                   # 5.2: not minimally encoded
        if not control:
            if op == 0 and not msg_op:
                return fail(1002)
            if op != 0 and msg_op:
                return fail(1002)
            if n > max_size - len(msg):
                return fail(1009)
            if op:
                msg_op, msg, deflated = op, bytearray(), bool(b0 & 0x40)
        key = data[i + hlen - 4:i + hlen]
        i += hlen
        raw = data[i:i + n]
        payload = bytes(b ^ key[k & 3] for k, b in enumerate(raw))
        if not control:
            msg += payload
            if msg_op == 1 and not deflated and not utf8_prefix_ok(bytes(msg)):
                return fail(1007)
        if len(raw) < n:
            return events
        i += n
        if op == 0x9:
            events.append(("ping", payload))
        elif op == 0xA:
            events.append(("pong", payload))
        elif op == 0x8:
            if not payload:
                events.append(("close", 1005, ""))
            elif len(payload) == 1:
                return fail(1002)
            else:
                code = struct.unpack_from("!H", payload)[0]
                if not close_code_ok(code):
                    return fail(1002)
                try:
                    reason = payload[2:].decode("utf-8")
                except UnicodeDecodeError:
                    return fail(1007)
                events.append(("close", code, reason))
        elif fin:
            if deflated:
                # inflated whole, at most max_size + 1 bytes made
                limit = max_size or (1 << 62)
                try:
                    msg = inflater.decompress(bytes(msg) + TAIL, limit + 1)
                except zlib.error:
                    return fail(1007)
                if len(msg) > limit:
                    return fail(1009)
                if reset or inflater.eof:
                    inflater = zlib.decompressobj(-15)
            if msg_op == 1:
                try:
                    events.append(("text", bytes(msg).decode("utf-8")))
                except UnicodeDecodeError:
                    return fail(1007)
            else:
                events.append(("binary", bytes(msg)))
            msg_op, msg = 0, bytearray()


def frame(op: int, payload: bytes = b"", *, fin: bool = True, mask: bool = True, rsv: int = 0,
          key: bytes | None = None, length: str = "min", random: bool = False) -> bytes:
    """A client frame, as a test wants it (rsv bits, no mask, a length in
    a longer encoding than needed: length "16" or "64")."""
    n = len(payload)
    b0 = (0x80 if fin else 0) | (rsv & 7) << 4 | op
    mbit = 0x80 if mask else 0
    if length == "64" or n > 0xFFFF:
        head = struct.pack("!BBQ", b0, mbit | 127, n)
    elif length == "16" or n > 125:
        head = struct.pack("!BBH", b0, mbit | 126, n)
    else:
        head = struct.pack("!BB", b0, mbit | n)
    if not mask:
        return head + payload
    # a fixed default key: test ids built from frames stay the same in
    # every pytest-xdist worker (random=True for a fresh one)
    key = (os.urandom(4) if random else b"\x37\xfa\x21\x3d") if key is None else key
    return head + key + bytes(b ^ key[k & 3] for k, b in enumerate(payload))


def close_payload(code: int, reason: bytes = b"") -> bytes:
    return struct.pack("!H", code) + reason
