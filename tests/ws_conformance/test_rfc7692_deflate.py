"""RFC 7692 permessage-deflate against a real master and worker started with
--ws-per-message-deflate, after the Autobahn test suite's sections 12
(compressed messages of many sizes echoed, text and binary) and 13 (the
same under each negotiation variant: context takeover kept or not, window
sizes offered), with the websockets library as the client, plus raw-frame
cases: the 101's exact answer, fragmented compressed messages, a
decompression bomb past ws_max_size (1009), RSV1 misuse (1002), data that
does not inflate (1007), and the default (off): the offer ignored.

Issue 23's "per-message-deflate (RFC 7692) optional and off by default":
before, no offer was taken and RSV1 always failed the connection."""
from __future__ import annotations

import zlib

import pytest
import websockets.sync.client as wsc
from websockets.extensions.permessage_deflate import ClientPerMessageDeflateFactory

from rfc6455_client import BINARY, CONT, PING, TEXT, Client, close_frame, frame

pytestmark = pytest.mark.timeout(120)

OFFER = "Sec-WebSocket-Extensions: permessage-deflate"
TAIL = b"\x00\x00\xff\xff"


def url(addr):
    return f"ws://{addr[0]}:{addr[1]}/echo"


def deflated(data: bytes, c=None) -> bytes:
    c = c or zlib.compressobj(wbits=-15)
    return (c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH))[:-4]


def inflated(payload: bytes, d=None) -> bytes:
    return (d or zlib.decompressobj(-15)).decompress(payload + TAIL)


# ---- Autobahn 12: compressed messages echoed, text and binary, many sizes ------------------------

@pytest.mark.parametrize("n", [16, 64, 256, 1024, 4096, 16384, 65536, 131072, 1 << 20])
@pytest.mark.parametrize("opcode", [TEXT, BINARY], ids=["text", "binary"])
def test_compressed_messages_echoed(ws_deflate_server, opcode, n):
    _, addr = ws_deflate_server
    with wsc.connect(url(addr), compression="deflate", max_size=None) as ws:
        assert "permessage-deflate" in ws.response.headers["Sec-WebSocket-Extensions"]
        for i in range(5):
            if opcode == TEXT:
                msg = (f"{i} Ελληνικά and ascii, compressible text " * (n // 40 + 1))[:n]
            else:
                msg = (bytes(range(256)) * (n // 256 + 1))[:n - 1] + bytes([i])
            ws.send(msg)
            assert ws.recv(timeout=30) == msg


# ---- Autobahn 13: the negotiation's variants ---------------------------------------------------------

VARIANTS = [
    {},
    {"client_no_context_takeover": True},
    {"server_no_context_takeover": True},
    {"server_no_context_takeover": True, "client_no_context_takeover": True},
    {"client_max_window_bits": 9},
    {"client_max_window_bits": 15},
    {"server_max_window_bits": 9},
    {"server_max_window_bits": 15},
    {"server_max_window_bits": 10, "client_max_window_bits": 10,
     "server_no_context_takeover": True, "client_no_context_takeover": True},
]


@pytest.mark.parametrize("params", VARIANTS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items())
                         or "default")
def test_negotiation_variants_round_trip(ws_deflate_server, params):
    """websockets checks the answer against its offer (it refuses one that
    names what it did not offer) and inflates what we send with the window
    it asked for: forty messages each way under every variant."""
    server, addr = ws_deflate_server
    ext = ClientPerMessageDeflateFactory(**params)
    with wsc.connect(url(addr), extensions=[ext]) as ws:
        answer = ws.response.headers["Sec-WebSocket-Extensions"]
        if server == "sockherd":
            for name in ("server_no_context_takeover", "client_no_context_takeover"):
                assert (name in answer) == bool(params.get(name)), answer
            if "server_max_window_bits" in params:
                assert f"server_max_window_bits={params['server_max_window_bits']}" in answer
        for i in range(40):
            msg = f"message {i}: " + "some words that repeat, " * (i % 7 + 1) * 10
            ws.send(msg if i % 2 else msg.encode())
            assert ws.recv(timeout=10) == (msg if i % 2 else msg.encode())


def test_the_answer_names_exactly_what_was_accepted(ws_deflate_server):
    """Several offers: the first one with a parameter we do not know is
    declined, the second one answered with its parameters echoed."""
    server, addr = ws_deflate_server
    if server != "sockherd":
        pytest.skip("the exact answer is sockherd's choice")
    c = Client(addr, headers=(OFFER + "; x_unknown, permessage-deflate; "
                              "client_no_context_takeover; server_max_window_bits=11; "
                              "client_max_window_bits",))
    assert c.status == 101
    assert c.headers["sec-websocket-extensions"] == \
        "permessage-deflate; client_no_context_takeover; server_max_window_bits=11"
    c.send(frame(TEXT, deflated(b"x" * 500), rsv=4))
    o = c.outcome(messages=1)
    assert o.compressed == [True] and inflated(o.messages[0][1]) == b"x" * 500


def test_fragmented_compressed_message(ws_deflate_server):
    """RSV1 on the first fragment only, the compressed bytes cut anywhere,
    a ping between fragments answered first."""
    _, addr = ws_deflate_server
    c = Client(addr, headers=(OFFER,))
    text = ("fragments of a compressed message, ✓ " * 300).encode()
    z = deflated(text)
    parts = [z[:7], z[7:len(z) // 2], z[len(z) // 2:]]
    c.send(frame(TEXT, parts[0], fin=False, rsv=4), frame(CONT, parts[1], fin=False),
           frame(PING, b"in between"), frame(CONT, parts[2]))
    o = c.outcome(messages=1)
    assert o.pongs == [b"in between"]
    payload = o.messages[0][1]
    assert (inflated(payload) if o.compressed[0] else payload) == text


def test_context_takeover_kept_across_client_messages(ws_deflate_server):
    _, addr = ws_deflate_server
    c = Client(addr, headers=(OFFER,))
    comp, d = zlib.compressobj(wbits=-15), zlib.decompressobj(-15)
    msgs = [b"the very same sentence, once more " * 20 for _ in range(3)]
    c.send(*(frame(BINARY, deflated(m, comp), rsv=4) for m in msgs))
    o = c.outcome(messages=3)
    got = [inflated(p, d) if z else p for (op, p), z in zip(o.messages, o.compressed)]
    assert got == msgs


def test_decompression_bomb_is_1009(ws_deflate_server):
    """64 KiB that inflate to 64 MiB, past the default ws_max_size (16
    MiB): the connection fails with 1009, not with the worker's memory."""
    server, addr = ws_deflate_server
    c = Client(addr, headers=(OFFER,))
    comp = zlib.compressobj(9, wbits=-15)
    bomb = b"".join(comp.compress(bytes(1 << 20)) for _ in range(64)) + comp.flush(zlib.Z_SYNC_FLUSH)
    c.send(frame(BINARY, bomb[:-4], rsv=4))
    o = c.outcome()
    assert o.messages == [] and o.close == 1009 and o.eof
    if server == "sockherd":
        assert o.reason == b"message larger than the maximum size once inflated"


@pytest.mark.parametrize("frames, reason", [
    ([frame(TEXT, b"a", fin=False, rsv=4), frame(CONT, b"b", rsv=4)],
     b"RSV1 set on a continuation frame"),
    ([frame(PING, b"p", rsv=4)], b"RSV1 set on a control frame"),
    ([frame(TEXT, b"a", rsv=2)], b"RSV2 or RSV3 set (permessage-deflate uses RSV1 only)"),
], ids=["continuation", "control", "rsv2"])
def test_rsv_misuse_is_1002(ws_deflate_server, frames, reason):
    server, addr = ws_deflate_server
    c = Client(addr, headers=(OFFER,))
    o = c.send(*frames, frame(TEXT, b"after")).outcome()
    assert o.messages == [] and o.close == 1002 and o.eof
    if server == "sockherd":
        assert o.reason == reason


def test_data_that_does_not_inflate_is_1007(ws_deflate_server):
    """The pick (ws_deflate.c says why): RFC 6455's 1007, as Node's ws;
    Python's websockets says 1002."""
    server, addr = ws_deflate_server
    c = Client(addr, headers=(OFFER,))
    o = c.send(frame(BINARY, b"\xff\xff\xff\xff", rsv=4)).outcome()
    assert o.messages == [] and o.eof
    if server == "sockherd":
        assert o.close == 1007
    else:
        assert o.close in (1002, 1007)


def test_off_by_default_the_offer_is_ignored(ws_server):
    """Without --ws-per-message-deflate: no Sec-WebSocket-Extensions in the
    101, messages go out plain, RSV1 is a 1002."""
    server, addr = ws_server
    if server != "sockherd":
        pytest.skip("uvicorn's is on by default")
    c = Client(addr, headers=(OFFER + "; client_max_window_bits",))
    assert c.status == 101 and "sec-websocket-extensions" not in c.headers
    c.send(frame(TEXT, b"z" * 300))
    o = c.outcome(messages=1)
    assert o.messages == [(TEXT, b"z" * 300)] and o.compressed == [False]
    o = c.send(frame(TEXT, deflated(b"z" * 300), rsv=4), close_frame()).outcome(o)
    assert o.close == 1002 and o.reason == b"RSV bits set without a negotiated extension"
