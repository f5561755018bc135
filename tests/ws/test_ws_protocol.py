"""The ASGI websocket scope on the native engine (worker/native/app/asgi/asgi_ws.c),
in process: a real Loop over a real fdcore Table on loopback (the
serve_asgi fixture), a raw client (wsclient.py) for every case a
well-behaved client never sends, websockets' sync client for the rest.

The handshake (400 / 426 before the app, 101 with the accept key, the
subprotocol and headers the app gives; 403 for a close before accept; the
websocket.http.response denial), messages both ways, pings answered by
the engine, fragmentation with pings between fragments, UTF-8 split
across fragments, every protocol close code of RFC 6455 7.4.1 with the
app told the same code, the close handshake both ways, ws_max_size,
send flow control, an idle WebSocket outliving the keep-alive and header
timeouts, and a 1 MiB message followed by a prompt close (found while
writing these: the queue's count was not lowered for a message handed to
a waiting receive(), so no frame was parsed after a large one and the
close handshake hung until the client's timeout)."""
from __future__ import annotations

import asyncio
import json
import select
import socket
import struct
import time

import pytest
import websockets.sync.client as wsc
from websockets.exceptions import ConnectionClosed

from wsclient import RawWs, accept_of, close_payload, frame

pytestmark = pytest.mark.timeout(60)


def wait_for(pred, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class App:
    """One ASGI app, its behaviour chosen by the path; what it received
    recorded (self.seen: (path, message))."""

    def __init__(self):
        self.seen = []
        self.sent = 0
        self.ended = []

    def disconnects(self, path):
        return [m for p, m in self.seen if p == path and m["type"] == "websocket.disconnect"]

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"plain http"})
            return
        path = scope["path"]
        try:
            await getattr(self, "ws_" + path.strip("/").split("/")[0])(scope, receive, send, path)
        finally:
            self.ended.append(path)

    async def _recv(self, receive, path):
        m = await receive()
        self.seen.append((path, m))
        return m

    async def ws_echo(self, scope, receive, send, path):
        assert (await self._recv(receive, path))["type"] == "websocket.connect"
        subs = scope["subprotocols"]
        await send({"type": "websocket.accept", "subprotocol": subs[0] if subs else None,
                    "headers": [(b"x-hello", b"world")]})
        while True:
            m = await self._recv(receive, path)
            if m["type"] == "websocket.disconnect":
                return
            await send({"type": "websocket.send", **{k: m[k] for k in ("text", "bytes") if k in m}})

    async def ws_scope(self, scope, receive, send, path):
        await receive()
        await send({"type": "websocket.accept"})
        shown = {k: v for k, v in scope.items() if k not in ("state",)}
        await send({"type": "websocket.send", "text": json.dumps(shown, default=lambda b: b.decode("latin-1"))})
        await self._recv(receive, path)

    async def ws_reject(self, scope, receive, send, path):
        await receive()
        await send({"type": "websocket.close"})

    async def ws_deny(self, scope, receive, send, path):
        await receive()
        await send({"type": "websocket.http.response.start", "status": 401,
                    "headers": [(b"content-type", b"text/plain"), (b"x-why", b"token")]})
        await send({"type": "websocket.http.response.body", "body": b"no ", "more_body": True})
        await send({"type": "websocket.http.response.body", "body": b"entry"})

    async def ws_close(self, scope, receive, send, path):
        await receive()
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": 4000, "reason": "done here"})
        await self._recv(receive, path)

    async def ws_raise(self, scope, receive, send, path):
        await receive()
        await send({"type": "websocket.accept"})
        raise RuntimeError("the app broke (expected by the test)")

    async def ws_silent(self, scope, receive, send, path):
        await receive()                                  # returns without an answer

    async def ws_broken(self, scope, receive, send, path):
        await receive()
        raise RuntimeError("the app broke before accept (expected by the test)")

    async def ws_flood(self, scope, receive, send, path):
        await receive()
        await send({"type": "websocket.accept"})
        block = b"x" * (64 << 10)
        for _ in range(128):                              # 8 MiB
            await send({"type": "websocket.send", "bytes": block})
            self.sent += len(block)
        await send({"type": "websocket.close"})


@pytest.fixture
def app():
    return App()


@pytest.fixture
def server(serve_asgi, app):
    loop, addr = serve_asgi(app, keepalive_timeout=0.5, header_timeout=0.5, ws_max_size=1 << 21)
    return addr


def url(addr, path):
    return f"ws://{addr[0]}:{addr[1]}{path}"


# ---- the handshake --------------------------------------------------------------------------------

def test_accept_with_key_subprotocol_and_headers(server, app):
    w = RawWs(server, path="/echo", extra=["Sec-WebSocket-Protocol: chat.v2, chat.v1"])
    assert w.status == 101
    assert w.header("sec-websocket-accept") == accept_of(w.key)
    assert w.header("upgrade").lower() == "websocket" and w.header("connection").lower() == "upgrade"
    assert w.header("sec-websocket-protocol") == "chat.v2"
    assert w.header("x-hello") == "world"
    w.send(frame(1, "héllo".encode()))
    assert w.recv_frame() == (1, 1, "héllo".encode())
    w.send(frame(8, close_payload(1000)))
    assert w.close_code() == 1000 and w.at_eof()
    wait_for(lambda: app.disconnects("/echo"), what="the disconnect")
    assert app.disconnects("/echo") == [{"type": "websocket.disconnect", "code": 1000, "reason": ""}]


def test_scope(server):
    with wsc.connect(url(server, "/scope/caf%C3%A9?x=1&y=2"), subprotocols=["a", "b"],
                     additional_headers={"X-Test": "yes"}) as ws:
        s = json.loads(ws.recv())
    assert s["type"] == "websocket" and s["scheme"] == "ws" and "method" not in s
    assert s["path"] == "/scope/café" and s["raw_path"] == "/scope/caf%C3%A9"
    assert s["query_string"] == "x=1&y=2"
    assert s["subprotocols"] == ["a", "b"]
    assert ["x-test", "yes"] in s["headers"]
    assert s["asgi"]["version"] == "3.0" and s["http_version"] == "1.1"
    assert s["extensions"] == {"websocket.http.response": {}}
    assert s["client"][0] == "127.0.0.1" and s["server"] == [server[0], server[1]]


@pytest.mark.parametrize("key, version, status", [
    ("", "13", 400),                                   # no key
    ("c2hvcnQ=", "13", 400),                           # base64, not of 16 bytes
    ("!!!!!!!!!!!!!!!!!!!!!!==", "13", 400),           # not base64
    ("dGhlIHNhbXBsZSBub25jZQ==", "", 400),             # no version
    ("dGhlIHNhbXBsZSBub25jZQ==", "8", 426),
])
def test_bad_handshakes_are_refused_before_the_app(server, app, key, version, status):
    w = RawWs(server, path="/echo", key=key, version=version)
    assert w.status == status
    if status == 426:
        assert w.header("sec-websocket-version") == "13"
    assert w.at_eof()
    assert app.seen == [] and app.ended == []


def test_close_before_accept_is_403(server, app):
    w = RawWs(server, path="/reject")
    assert w.status == 403 and w.at_eof()


def test_app_returning_without_an_answer_is_403_raising_500(server, app):
    w = RawWs(server, path="/silent")
    assert w.status == 403 and w.at_eof()
    w = RawWs(server, path="/broken")
    assert w.status == 500 and w.at_eof()


def test_wsgi_app_gets_an_upgrade_request_as_any_other(serve_wsgi):
    seen = []

    def wsgi_app(environ, start_response):
        seen.append((environ["HTTP_UPGRADE"], environ["REQUEST_METHOD"]))
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"no websockets here"]

    _, addr = serve_wsgi(wsgi_app)
    w = RawWs(addr, path="/")
    assert w.status == 200 and w.body == b"no websockets here"
    assert seen == [("websocket", "GET")]


def test_denial_response(server):
    w = RawWs(server, path="/deny")
    assert w.status == 401 and w.header("x-why") == "token"
    assert w.header("transfer-encoding") == "chunked"
    deadline = time.monotonic() + 10
    while not w.buf.endswith(b"0\r\n\r\n") and w._fill(deadline):
        pass
    assert w.buf == b"3\r\nno \r\n5\r\nentry\r\n0\r\n\r\n"
    assert w.at_eof()


def test_websockets_client_sees_the_denial(server):
    with pytest.raises(Exception) as err:
        wsc.connect(url(server, "/deny"))
    assert "401" in str(err.value)


def test_plain_http_on_the_same_server(server):
    with socket.create_connection(server, timeout=10) as s:
        s.sendall(b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"plain http")


# ---- messages -------------------------------------------------------------------------------------

def test_text_bytes_and_pings_answered_by_the_engine(server, app):
    with wsc.connect(url(server, "/echo")) as ws:
        ws.send("text ✓")
        assert ws.recv() == "text ✓"
        ws.send(b"\x00\xffbytes")
        assert ws.recv() == b"\x00\xffbytes"
        assert ws.ping(b"are you there").wait(10)
    wait_for(lambda: app.disconnects("/echo"), what="the disconnect")
    kinds = [m["type"] for p, m in app.seen]
    assert kinds == ["websocket.connect", "websocket.receive", "websocket.receive",
                     "websocket.disconnect"]                 # no ping reached the app


def test_fragments_with_pings_between_and_utf8_split(server, app):
    w = RawWs(server, path="/echo")
    text = "split € and 😀 across fragments".encode()
    cuts = [7, 8, 14, 15, 16]                               # inside € and 😀
    parts = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    for i, part in enumerate(parts):
        w.send(frame(1 if i == 0 else 0, part, fin=i == len(parts) - 1))
        w.send(frame(9, b"ping %d" % i))
    got = [w.recv_frame() for _ in range(len(parts) + 1)]
    pongs = [f for f in got if f[0] == 10]
    assert [p[2] for p in pongs] == [b"ping %d" % i for i in range(len(parts))]
    assert [f for f in got if f[0] == 1] == [(1, 1, text)]
    w.send(frame(2, b"bin-a", fin=False) + frame(9, b"") + frame(0, b"bin-b"))
    assert w.recv_frame() == (10, 1, b"")
    assert w.recv_frame() == (2, 1, b"bin-abin-b")
    w.close()


def test_one_mib_message_then_a_prompt_close(server, app):
    data = bytes(range(256)) * 4096
    with wsc.connect(url(server, "/echo"), max_size=None, close_timeout=5) as ws:
        ws.send(data)
        assert ws.recv(timeout=20) == data
        t = time.monotonic()
    assert time.monotonic() - t < 3, "the close handshake hung after a large message"
    assert ws.protocol.close_rcvd.code == 1000
    wait_for(lambda: app.disconnects("/echo"), what="the disconnect")
    assert app.disconnects("/echo")[0]["code"] == 1000


# ---- every close code -------------------------------------------------------------------------------

@pytest.mark.parametrize("data, code", [
    (frame(2, b"unmasked", mask=False), 1002),
    (frame(1, b"rsv", rsv=2), 1002),
    (frame(5, b""), 1002),                                  # unknown opcode
    (frame(9, b"p" * 126), 1002),                           # control frame too long
    (frame(9, b"p", fin=False), 1002),                      # fragmented control frame
    (frame(0, b"orphan"), 1002),                            # continuation without a message
    (frame(1, b"a", fin=False) + frame(2, b"b"), 1002),     # new message inside a fragmented one
    (frame(8, b"\x03"), 1002),                              # 1-byte close payload
    (frame(8, close_payload(1005)), 1002),
    (frame(8, close_payload(1006)), 1002),
    (frame(8, close_payload(1015)), 1002),
    (frame(8, close_payload(999)), 1002),
    (frame(8, close_payload(5000)), 1002),
    (frame(1, b"bad \xff utf-8"), 1007),
    (frame(1, b"\xe2\x82", fin=False) + frame(0, b"x"), 1007),   # a split sequence broken
    (frame(8, close_payload(1000, b"\xc3\x28")), 1007),     # close reason not UTF-8
    (frame(2, b"x" * ((1 << 21) + 1)), 1009),               # past ws_max_size (2 MiB here)
    (frame(2, b"x" * (1 << 20), fin=False) + frame(0, b"y" * ((1 << 20) + 1)), 1009),
])
def test_protocol_errors_close_with_their_code(server, app, data, code):
    w = RawWs(server, path="/echo")
    w.send(data)
    assert w.close_code() == code
    assert w.at_eof()
    wait_for(lambda: app.disconnects("/echo"), what="the app's disconnect")
    assert app.disconnects("/echo")[0]["code"] == code



@pytest.mark.parametrize("length, n, reason", [
    ("16", 5, b"control frame length not in the 7-bit form (not minimally encoded)"),
    ("min", 126, b"control frame longer than 125 bytes"),
])
def test_control_frame_length_close_reason(server, app, length, n, reason):
    """Finding (wsmem brief): a ping whose 16-bit length said 5 was closed
    1002 with the reason "control frame longer than 125 bytes"; the close
    frame names the rule broken (5.2's minimal encoding, or 5.5's bound)."""
    w = RawWs(server, path="/echo")
    w.send(frame(9, b"p" * n, length=length))
    while (f := w.recv_frame()) is not None and f[0] != 8:
        pass
    assert f is not None and f[2] == struct.pack("!H", 1002) + reason
    assert w.at_eof()

@pytest.mark.parametrize("code, reason", [(1000, b""), (1001, b"bye"), (4321, "sé".encode())])
def test_client_close_is_echoed_and_told_to_the_app(server, app, code, reason):
    w = RawWs(server, path="/echo")
    w.send(frame(8, close_payload(code, reason)))
    f = w.recv_frame()
    assert f[0] == 8 and struct.unpack("!H", f[2][:2])[0] == code
    assert w.at_eof()
    wait_for(lambda: app.disconnects("/echo"), what="the disconnect")
    assert app.disconnects("/echo") == [{"type": "websocket.disconnect", "code": code,
                                         "reason": reason.decode()}]


def test_client_close_without_code(server, app):
    w = RawWs(server, path="/echo")
    w.send(frame(8, b""))
    assert w.recv_frame() == (8, 1, b"")
    wait_for(lambda: app.disconnects("/echo"), what="the disconnect")
    assert app.disconnects("/echo")[0]["code"] == 1005


def test_app_close_with_code_and_reason(server, app):
    with wsc.connect(url(server, "/close")) as ws:
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
    assert ws.protocol.close_rcvd.code == 4000 and ws.protocol.close_rcvd.reason == "done here"


def test_app_error_after_accept_is_1011(server, app, caplog):
    caplog.set_level("ERROR", logger="sockherd.worker")
    w = RawWs(server, path="/raise")
    assert w.status == 101
    assert w.close_code() == 1011
    # logged with what the scope was (a websocket scope has no method:
    # this read "app failed on None /raise")
    wait_for(lambda: "app failed on websocket /raise" in caplog.text, what="the app's error logged")


def test_client_vanishing_is_1006(server, app):
    w = RawWs(server, path="/echo")
    w.send(frame(1, b"hi"))
    assert w.recv_frame() == (1, 1, b"hi")
    w.close()
    wait_for(lambda: app.disconnects("/echo"), what="the disconnect")
    assert app.disconnects("/echo")[0]["code"] == 1006


# ---- flow control and timers -------------------------------------------------------------------------

def test_send_waits_while_the_client_reads_nothing(server, app):
    w = RawWs(server, path="/flood")
    w.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    # the app stops near the high water mark (1 MiB buffered + the
    # kernel's buffers), far from its 8 MiB
    wait_for(lambda: app.sent > 0, what="the first send")
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        select.select([], [], [], 0.05)
    assert app.sent < 6 << 20, app.sent
    got = 0
    while True:
        f = w.recv_frame(timeout=20)
        assert f is not None
        if f[0] == 8:
            break
        got += len(f[2])
    assert got == 8 << 20 == app.sent


def test_idle_websocket_outlives_keepalive_and_header_timeouts(server, app):
    w = RawWs(server, path="/echo")
    w.send(frame(1, b"a partial frame follows"))
    assert w.recv_frame() == (1, 1, b"a partial frame follows")
    late = frame(1, b"xyz")
    w.send(late[:3])                                        # a frame's head started, then idle
    r, _, _ = select.select([w.sock], [], [], 2.0)          # 4x keepalive / header timeouts
    assert r == [], "the server said something (or closed) while the WebSocket idled"
    w.send(late[3:])
    assert w.recv_frame() == (1, 1, b"xyz")
    w2 = RawWs(server, path="/echo")                        # idle from its handshake on
    r, _, _ = select.select([w2.sock], [], [], 2.0)
    assert r == []
    w2.send(frame(9, b"still here"))
    assert w2.recv_frame() == (10, 1, b"still here")
