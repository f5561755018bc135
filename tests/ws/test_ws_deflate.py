"""permessage-deflate (RFC 7692, worker/native/proto/ws/ws_deflate.c) on the native
engine, in process (the serve_asgi fixture: a real Loop on loopback), so
test_ws_asan.py runs the inflate and deflate paths under the sanitizers:
the negotiation's answer, websockets' client (compression="deflate")
round trips of several sizes with and without context takeover, the app
seeing plain messages, a fragmented compressed message from a raw client,
and the failures: a decompression bomb past ws_max_size (1009), RSV1 on a
continuation or a control frame (1002), data that does not inflate (1007).
Off (the default), an offer is ignored and RSV1 is a 1002.

Issue 23's item "per-message-deflate (RFC 7692) optional and off by
default": before, no offer was ever taken."""
from __future__ import annotations

import struct
import time
import zlib

import pytest
import websockets.sync.client as wsc
from websockets.extensions.permessage_deflate import ClientPerMessageDeflateFactory

from wsclient import RawWs, frame

pytestmark = pytest.mark.timeout(60)

MAX = 1 << 21                                    # ws_max_size here: 2 MiB


def wait_for(pred, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class Echo:
    """The echo app, what it received recorded (seen: (path, message))."""

    def __init__(self):
        self.seen = []

    def disconnects(self, path):
        return [m for p, m in self.seen if p == path and m["type"] == "websocket.disconnect"]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            return
        await receive()
        await send({"type": "websocket.accept"})
        while True:
            m = await receive()
            self.seen.append((scope["path"], m))
            if m["type"] == "websocket.disconnect":
                return
            await send({"type": "websocket.send", **{k: m[k] for k in ("text", "bytes") if k in m}})


@pytest.fixture
def app():
    return Echo()


@pytest.fixture
def on(serve_asgi, app):
    return serve_asgi(app, ws_max_size=MAX, ws_per_message_deflate=True)[1]


@pytest.fixture
def off(serve_asgi, app):
    return serve_asgi(app, ws_max_size=MAX)[1]


def url(addr, path="/echo"):
    return f"ws://{addr[0]}:{addr[1]}{path}"


def deflated(data: bytes, c=None) -> bytes:
    """A message's payload as a client compresses it (7.2.1): raw deflate,
    sync-flushed, its 0x00 0x00 0xff 0xff tail removed."""
    c = c or zlib.compressobj(wbits=-15)
    out = c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)
    assert out.endswith(b"\x00\x00\xff\xff")
    return out[:-4]


def close_of(w: RawWs):
    while (f := w.recv_frame()) is not None and f[0] != 8:
        pass
    assert f is not None, "no close frame"
    return struct.unpack("!H", f[2][:2])[0], f[2][2:]


SIZES = [0, 1, 63, 64, 1000, 70000, 1 << 20]


@pytest.mark.parametrize("n", SIZES)
def test_round_trips_compressed(on, app, n):
    """websockets' client negotiates permessage-deflate and echoes text and
    bytes of each size through it; the app saw the plain messages."""
    text = ("κόσμε ascii " * (n // 12 + 1))[:n]
    data = bytes(range(256)) * (n // 256) + bytes(n % 256)
    with wsc.connect(url(on), compression="deflate", max_size=None) as ws:
        assert ws.response.headers["Sec-WebSocket-Extensions"].startswith("permessage-deflate")
        for _ in range(2):                      # a second time: the context carried over
            ws.send(text)
            assert ws.recv(timeout=20) == text
            ws.send(data)
            assert ws.recv(timeout=20) == data
    got = [m for p, m in app.seen if m["type"] == "websocket.receive"]
    assert got[0] == {"type": "websocket.receive", "text": text}
    assert got[1] == {"type": "websocket.receive", "bytes": data}


@pytest.mark.parametrize("server_nct, client_nct", [(True, False), (False, True), (True, True)])
def test_no_context_takeover_variants(on, server_nct, client_nct):
    """Each no_context_takeover parameter offered is accepted, named in the
    answer and kept: many messages round trip (a server that kept its
    context where it promised not to would send data the client cannot
    inflate; one that reset it where the client keeps its own could not
    read the client's)."""
    ext = ClientPerMessageDeflateFactory(server_no_context_takeover=server_nct,
                                         client_no_context_takeover=client_nct,
                                         server_max_window_bits=10)
    with wsc.connect(url(on), extensions=[ext]) as ws:
        answer = ws.response.headers["Sec-WebSocket-Extensions"]
        assert ("server_no_context_takeover" in answer) == server_nct
        assert ("client_no_context_takeover" in answer) == client_nct
        assert "server_max_window_bits=10" in answer
        for i in range(20):
            msg = f"message {i} " + "the same words again " * 20
            ws.send(msg)
            assert ws.recv(timeout=10) == msg


def test_server_frames_are_compressed_and_small_ones_are_not(on):
    """The server's messages of 64 bytes or more go out compressed (RSV1,
    raw deflate without the tail); a shorter one plain."""
    w = RawWs(on, path="/echo", extra=["Sec-WebSocket-Extensions: permessage-deflate"])
    assert w.status == 101 and w.header("sec-websocket-extensions") == "permessage-deflate"
    d = zlib.decompressobj(-15)
    for msg in (b"a" * 5000, b"b" * 5000, b"short"):
        w.send(frame(2, msg))
        op, fin, payload = w.recv_frame()
        if len(msg) >= 64:
            assert len(payload) < len(msg) // 10
            assert d.decompress(payload + b"\x00\x00\xff\xff") == msg
        else:
            assert payload == msg


def test_fragmented_compressed_message_with_a_ping_between(on, app):
    """7.2.2 / 6.1: RSV1 on the first frame only, the compressed bytes split
    over fragments, a ping between them answered."""
    w = RawWs(on, path="/echo", extra=["Sec-WebSocket-Extensions: permessage-deflate"])
    text = ("fragmented and compressed ✓ " * 400).encode()
    z = deflated(text)
    a, b = len(z) // 3, 2 * len(z) // 3
    w.send(frame(1, z[:a], fin=False, rsv=4) + frame(9, b"between") + frame(0, z[a:b], fin=False)
           + frame(0, z[b:]))
    got = [w.recv_frame(), w.recv_frame()]
    assert got[0] == (0xA, 1, b"between")
    op, fin, payload = got[1]
    assert op == 1 and zlib.decompressobj(-15).decompress(payload + b"\0\0\xff\xff") == text
    wait_for(lambda: any(m.get("text") for p, m in app.seen), what="the app's message")


def test_context_takeover_across_messages_from_the_client(on):
    """Without client_no_context_takeover the client's second message may
    refer back into the first (the inflater is kept)."""
    w = RawWs(on, path="/echo", extra=["Sec-WebSocket-Extensions: permessage-deflate"])
    c = zlib.compressobj(wbits=-15)
    first, second = b"repeated words, repeated words " * 10, b"repeated words, repeated words " * 10
    z1, z2 = deflated(first, c), deflated(second, c)
    assert len(z2) < len(z1) // 2                  # the second refers back
    w.send(frame(2, z1, rsv=4) + frame(2, z2, rsv=4))
    d = zlib.decompressobj(-15)
    for want in (first, second):
        op, fin, payload = w.recv_frame()
        assert d.decompress(payload + b"\0\0\xff\xff") == want


def test_decompression_bomb_past_ws_max_size_is_1009(on, app):
    """A few KiB that inflate to 64 MiB: 1009, the inflater stopped at
    ws_max_size (2 MiB) + 1 bytes; the app told 1009."""
    w = RawWs(on, path="/echo", extra=["Sec-WebSocket-Extensions: permessage-deflate"])
    c = zlib.compressobj(9, wbits=-15)
    bomb = b"".join(c.compress(bytes(1 << 20)) for _ in range(64)) + c.flush(zlib.Z_SYNC_FLUSH)
    assert len(bomb) < 100 << 10
    w.send(frame(2, bomb[:-4], rsv=4))
    code, reason = close_of(w)
    assert code == 1009 and b"inflated" in reason
    assert w.at_eof()
    wait_for(lambda: app.disconnects("/echo"), what="the app's disconnect")
    assert app.disconnects("/echo")[0]["code"] == 1009


def test_inflated_exactly_ws_max_size_is_fine(on):
    w = RawWs(on, path="/echo", extra=["Sec-WebSocket-Extensions: permessage-deflate"])
    w.send(frame(2, deflated(bytes(MAX)), rsv=4))
    op, fin, payload = w.recv_frame(timeout=20)
    assert zlib.decompressobj(-15).decompress(payload + b"\0\0\xff\xff") == bytes(MAX)


@pytest.mark.parametrize("data, reason", [
    (frame(1, b"x", fin=False, rsv=4) + frame(0, b"y", rsv=4), b"RSV1 set on a continuation frame"),
    (frame(9, b"ping", rsv=4), b"RSV1 set on a control frame"),
    (frame(2, b"x", rsv=2), b"RSV2 or RSV3 set (permessage-deflate uses RSV1 only)"),
    (frame(2, b"x", rsv=1), b"RSV2 or RSV3 set (permessage-deflate uses RSV1 only)"),
])
def test_rsv_misuse_is_1002(on, data, reason):
    w = RawWs(on, path="/echo", extra=["Sec-WebSocket-Extensions: permessage-deflate"])
    w.send(data)
    assert close_of(w) == (1002, reason)
    assert w.at_eof()


@pytest.mark.parametrize("payload", [
    b"\xff\xff\xff\xff\xff",                          # a reserved block type (BTYPE 11)
    b"\x00\x05\x00\x00\x00hello",                     # a stored block whose NLEN is not ~LEN
    deflated(b"hello" * 50)[:-1] + b"\xff\xff",      # a broken Huffman stream
])
def test_data_that_does_not_inflate_is_1007(on, app, payload):
    w = RawWs(on, path="/echo", extra=["Sec-WebSocket-Extensions: permessage-deflate"])
    w.send(frame(2, payload, rsv=4))
    code, reason = close_of(w)
    assert code == 1007 and b"does not inflate" in reason, reason
    wait_for(lambda: app.disconnects("/echo"), what="the app's disconnect")
    assert app.disconnects("/echo")[0]["code"] == 1007


def test_compressed_text_not_utf8_is_1007(on):
    w = RawWs(on, path="/echo", extra=["Sec-WebSocket-Extensions: permessage-deflate"])
    w.send(frame(1, deflated(b"bad \xff utf-8"), rsv=4))
    assert close_of(w) == (1007, b"text message that is not UTF-8")


def test_off_by_default_the_offer_is_ignored(off):
    """The default: no Sec-WebSocket-Extensions in the 101, and a client
    that sets RSV1 anyway is a 1002."""
    w = RawWs(off, path="/echo", extra=["Sec-WebSocket-Extensions: permessage-deflate; "
                                        "client_max_window_bits"])
    assert w.status == 101 and w.header("sec-websocket-extensions") is None
    w.send(frame(2, b"a" * 200))
    assert w.recv_frame() == (2, 1, b"a" * 200)    # sent plain
    w.send(frame(2, deflated(b"x" * 100), rsv=4))
    assert close_of(w) == (1002, b"RSV bits set without a negotiated extension")
    with wsc.connect(url(off), compression="deflate") as ws:
        assert "Sec-WebSocket-Extensions" not in ws.response.headers
        ws.send("plain " * 100)
        assert ws.recv(timeout=10) == "plain " * 100
