"""RFC 6455 5.2 framing, after Autobahn's cases 1 (payload lengths at each
encoding's edges, text and binary echoed whole), 2 and 3 (RSV bits must be
0 without an extension: 1002), 4 (reserved opcodes: 1002) and 5.1 (a
client frame not masked: 1002)."""
from __future__ import annotations

import socket

import pytest

from rfc6455_client import BINARY, CLOSE, PING, TEXT, Client, close_frame, exchange, frame

pytestmark = pytest.mark.timeout(60)

LENGTHS = [0, 125, 126, 65535, 65536]          # 7-bit, 16-bit and 64-bit encodings' edges


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("opcode", [TEXT, BINARY], ids=["text", "binary"])
def test_payload_lengths_echoed(ws_server, opcode, n):
    _, addr = ws_server
    payload = (b"*" if opcode == TEXT else bytes(range(256))) * n
    payload = payload[:n]
    o = exchange(addr, frame(opcode, payload), wait=1)
    assert o.messages == [(opcode, payload)] and o.close == 1000 and o.eof


@pytest.mark.parametrize("rsv", range(1, 8))
@pytest.mark.parametrize("opcode", [TEXT, BINARY, PING], ids=["text", "binary", "ping"])
def test_rsv_bits_are_1002(ws_server, opcode, rsv):
    _, addr = ws_server
    o = exchange(addr, frame(opcode, b"rsv set", rsv=rsv), frame(TEXT, b"after"))
    assert o.frames == [] and o.close == 1002 and o.eof


@pytest.mark.parametrize("opcode", [3, 4, 5, 6, 7, 11, 12, 13, 14, 15])
def test_reserved_opcodes_are_1002(ws_server, opcode):
    _, addr = ws_server
    o = exchange(addr, frame(opcode, b"reserved"), frame(TEXT, b"after"))
    assert o.messages == [] and o.close == 1002 and o.eof


@pytest.mark.parametrize("opcode", [TEXT, BINARY, PING, CLOSE], ids=["text", "binary", "ping",
                                                                     "close"])
def test_unmasked_client_frame_is_1002(ws_server, opcode):
    _, addr = ws_server
    payload = b"\x03\xe8" if opcode == CLOSE else b"no mask"
    o = exchange(addr, frame(opcode, payload, masked=False), frame(TEXT, b"after"))
    assert o.messages == [] and o.close == 1002 and o.eof


def test_64_bit_length_with_its_top_bit_set_is_1002(ws_server):
    """5.2: the 64-bit length's most significant bit MUST be 0."""
    _, addr = ws_server
    head = bytes((0x82, 0x80 | 127)) + (1 << 63 | 5).to_bytes(8, "big") + b"\0\0\0\0"
    o = exchange(addr, head + b"hello", close=False)
    assert o.messages == [] and o.close == 1002 and o.eof


def test_frames_sent_one_byte_at_a_time(ws_server):
    """Autobahn's "chopped" cases: a frame's header and payload arrive in
    1-byte writes (TCP_NODELAY: each its own segment, mostly)."""
    _, addr = ws_server
    c = Client(addr)
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for data in (frame(TEXT, "chopped κόσμε".encode()), frame(PING, b"chopped ping"),
                 frame(BINARY, bytes(300))):
        for i in range(len(data)):
            c.send(data[i:i + 1])
    o = c.outcome(messages=2)
    o = c.send(close_frame()).outcome(o)
    assert o.messages == [(TEXT, "chopped κόσμε".encode()), (BINARY, bytes(300))]
    assert o.pongs == [b"chopped ping"] and o.close == 1000 and o.eof


@pytest.mark.parametrize("n, width", [(0, 16), (125, 16), (5, 64), (125, 64), (126, 64),
                                      (65535, 64)])
@pytest.mark.parametrize("opcode", [TEXT, BINARY], ids=["text", "binary"])
def test_data_frame_length_not_minimally_encoded_is_1002(ws_server, opcode, n, width):
    """5.2: "the minimal number of bytes MUST be used to encode the length":
    a data frame's length in the 16-bit form below 126 or in the 64-bit
    form below 65536 fails the connection with 1002 and a reason that
    names the rule (the finding: such frames were accepted and echoed;
    control frames were already refused)."""
    server, addr = ws_server
    o = exchange(addr, frame(opcode, b"*" * n, width=width), frame(TEXT, b"after"))
    assert o.messages == [] and o.close == 1002 and o.eof
    if server == "sockherd":
        assert b"not minimally encoded" in o.reason, o.reason
