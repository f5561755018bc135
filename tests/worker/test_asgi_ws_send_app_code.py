"""What a WebSocket send() does while the app's own code runs inside it: the
twins, in the websocket scope (asgi_ws_send.c), of test_asgi_send_app_code.py's
http-scope defects (issue 35: point 2's WebSocket part, and a re-entrant
websocket send), found by an adversarial review of those fixes.

  - borrowed values used after the app's code ran (point 2): the denial's
    body across more_body's __bool__, its status across the headers'
    lookup, websocket.send's text across the bytes lookup, websocket.close's
    code across the reason lookup (a key's __eq__ that empties the message),
    websocket.accept's subprotocol across its headers' __iter__. Each value
    is now held for as long as it is used; on the unfixed code the freed
    memory's new contents went out (ASan: heap-use-after-free).
  - a send() from the code a send() runs is refused, as the http scope's
    is (`sending`): a websocket.close from inside websocket.accept answered
    403 and the accept wrote its 101 behind it; a denial body from inside
    more_body's __bool__ ended the response before the outer one's bytes.

A real Loop over a real fdcore Table on loopback (conftest.py's serve_asgi);
the server's bytes read off a raw socket. Runs under ASan
(test_http_asan.py, the ws part)."""
from __future__ import annotations

import base64
import os

import pytest

from test_wsgi import raw  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def ws_handshake(path: bytes) -> bytes:
    key = base64.b64encode(os.urandom(16))
    return (b"GET " + path + b" HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: " + key +
            b"\r\nSec-WebSocket-Version: 13\r\n\r\n")


KEEP = []


class EmptiesItsMessage:
    """more_body: False, and the message emptied when asked, the freed body's
    memory then taken by new bytes objects of the same size."""

    def __init__(self, msg):
        self.msg = msg

    def __bool__(self):
        self.msg.clear()
        for i in range(256):
            KEEP.append(b"REUSED-%08d-xxxxxxxxxxxxxxxx" % i)
        return False


def ws_deny_emptied_app():
    async def app(scope, receive, send):
        if scope["type"] != "websocket":
            return
        await receive()
        await send({"type": "websocket.http.response.start", "status": 401, "headers": []})
        # the body made here: the message holds its only reference
        msg = {"type": "websocket.http.response.body",
               "body": b"denied-%08d-yyyyyyyyyyyyyyyy" % 42}
        msg["more_body"] = EmptiesItsMessage(msg)
        await send(msg)
    return app


def test_ws_denial_body_whose_more_body_empties_the_message_keeps_its_body(serve_asgi):
    """Issue 35 point 2 (a borrowed value used after the app's __bool__),
    fixed for http.response.trailers, was still in the WebSocket denial's
    send (asgi_ws_send.c do_deny, now asgi_ws_deny.c): `body` and
    `more_body` were borrowed (PyDict_GetItemString), more_body's __bool__
    emptied the message and the freed body's buffer went on the wire."""
    _, addr = serve_asgi(ws_deny_emptied_app())
    out = raw(addr, ws_handshake(b"/deny"))
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 401"), out
    assert body == b"denied-00000042-yyyyyyyyyyyyyyyy", out


class ClosesWhenMeasured:
    """A header pair of websocket.accept (a sequence of two bytes): its
    length, asked by the accept's check, sends websocket.close first."""

    def __init__(self, send, seen):
        self.send, self.seen, self.items = send, seen, (b"x-a", b"1")

    def __len__(self):
        if not self.seen:
            try:
                self.seen.append(("inner", self.send({"type": "websocket.close"})))
            except Exception as exc:                  # noqa: BLE001
                self.seen.append(("inner", exc))
        return 2

    def __getitem__(self, i):
        return self.items[i]


def ws_accept_reentrant_app(seen):
    async def app(scope, receive, send):
        if scope["type"] != "websocket":
            return
        await receive()
        try:
            await send({"type": "websocket.accept", "headers": [ClosesWhenMeasured(send, seen)]})
            seen.append(("outer", "accepted"))
            await send({"type": "websocket.send", "text": "after"})
            seen.append(("after", "sent"))
        except Exception as exc:                      # noqa: BLE001
            seen.append(("outer", exc))
    return app


def test_ws_send_from_inside_websocket_accept_is_refused(serve_asgi):
    """The `sending` guard was the http scope's only (AsgiCall); the WebSocket
    send (asgi_ws_send.c ws_send) had none. websocket.accept checked its
    state first and then ran the app's code (a header pair's __len__); a
    websocket.close from there answered 403 and finished the call, and the
    outer accept went on: it wrote its 101 behind the 403, set the state
    back to OPEN, counted a 101 and told the app it accepted. Since the
    accept's headers are read as a head's (issue 35, point 1) a pair of the
    app's own type is refused before any of its code runs; the guard
    itself is proven by the tests below (the headers' __iter__)."""
    seen = []
    _, addr = serve_asgi(ws_accept_reentrant_app(seen))
    out = raw(addr, ws_handshake(b"/acc"))
    assert out.startswith(b"HTTP/1.1 403"), out
    # either the inner send is refused (as in the http scope) or the outer
    # accept is; never both a 403 and an accepted WebSocket
    inner_ok = seen and seen[0][0] == "inner" and not isinstance(seen[0][1], Exception)
    assert not (inner_ok and ("outer", "accepted") in seen), (out, seen)


# ---- the other borrowed values of the websocket scope's send (point 2) ----

def frames_of(out: bytes) -> list[tuple[int, bytes]]:
    """The server's frames after the 101 (unmasked): (opcode, payload)."""
    head, _, rest = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), out[:300]
    got = []
    while len(rest) >= 2:
        n, at = rest[1] & 0x7F, 2
        if n == 126:
            n, at = int.from_bytes(rest[2:4], "big"), 4
        elif n == 127:
            n, at = int.from_bytes(rest[2:10], "big"), 10
        got.append((rest[0] & 0x0F, rest[at:at + n]))
        rest = rest[at + n:]
    return got


class ClearsOnCompare(str):
    """A key of the app's whose hash is another key's (`of`, one the
    message lacks: its lookup then compares them), and its __eq__ empties
    the message, the freed values' memory then taken by new objects of
    their size."""

    def __new__(cls, name, of):
        k = super().__new__(cls, name)
        k.of, k.msg = of, None
        return k

    def __hash__(self):
        return hash(self.of)

    def __eq__(self, other):
        if self.msg:
            self.msg.clear()
            for i in range(256):
                KEEP.append("REUSED-%08d-xxxxxxxxxxxxxxxxxxxxxxxx" % i)
                KEEP.append(b"REUSED-%08d-xxxxxxxxxxxxxxxxxxxxxxxx" % i)
                KEEP.append(70000 + i)
        return False


def message_with_trap(base: dict, trap_of: str) -> dict:
    msg, trap = dict(base), ClearsOnCompare("trap", trap_of)
    msg[trap] = None
    trap.msg = msg                    # armed once in (its insertion compares too)
    return msg


def one_send_app(make_msg, seen):
    async def app(scope, receive, send):
        if scope["type"] != "websocket":
            return
        await receive()
        try:
            await send({"type": "websocket.accept"})
            await send(make_msg())
            seen.append("sent")
        except Exception as exc:                      # noqa: BLE001
            seen.append(exc)
    return app


def test_ws_send_text_emptied_by_the_bytes_lookup_keeps_its_text(serve_asgi):
    """websocket.send took `text` borrowed, then looked up `bytes`: a key
    whose __eq__ empties the message freed the text before it was framed."""
    seen = []
    text = lambda: "text-%08d-zzzzzzzzzzzzzzzzzzzzzzzz" % 7    # noqa: E731  (made at run time)
    _, addr = serve_asgi(one_send_app(
        lambda: message_with_trap({"type": "websocket.send", "text": text()}, "bytes"), seen))
    got = frames_of(raw(addr, ws_handshake(b"/text")))
    assert seen == ["sent"], seen
    assert got[0] == (1, text().encode()), got


def test_ws_close_code_emptied_by_the_reason_lookup_keeps_its_code(serve_asgi):
    """websocket.close took `code` borrowed, then looked up `reason`: the
    freed int was read for the close frame's code."""
    seen = []
    _, addr = serve_asgi(one_send_app(
        lambda: message_with_trap({"type": "websocket.close", "code": int("4321")}, "reason"),
        seen))
    got = frames_of(raw(addr, ws_handshake(b"/close")))
    assert seen == ["sent"], seen
    assert got == [(8, (4321).to_bytes(2, "big"))], got


def test_ws_denial_status_emptied_by_the_headers_lookup_keeps_its_status(serve_asgi):
    """websocket.http.response.start took `status` borrowed, then looked
    up `headers`: the freed int was the status read."""
    async def app(scope, receive, send):
        if scope["type"] != "websocket":
            return
        await receive()
        await send(message_with_trap({"type": "websocket.http.response.start",
                                      "status": int("451")}, "headers"))
        await send({"type": "websocket.http.response.body", "body": b"no"})
    _, addr = serve_asgi(app)
    out = raw(addr, ws_handshake(b"/status"))
    assert out.startswith(b"HTTP/1.1 451 "), out
    assert out.endswith(b"\r\n\r\nno"), out


def emptying_headers(msg):
    """websocket.accept's headers: an iterable whose __iter__ empties the
    message (the subprotocol's only reference with it)."""
    def gen():
        msg.clear()
        for i in range(256):
            KEEP.append("REUSED-%08d-xxxxxxxxxxxxxxxxxxxxxxxx" % i)
        yield (b"x-h", b"1")
    return gen()


def test_ws_accept_subprotocol_emptied_by_the_headers_keeps_its_subprotocol(serve_asgi):
    """websocket.accept took `subprotocol` borrowed (its UTF-8), then read
    the headers, whose iterator emptied the message: the freed str's
    bytes went into Sec-WebSocket-Protocol."""
    seen = []

    def accept():
        msg = {"type": "websocket.accept", "subprotocol": "proto-%08d-wwwwwwwwwwwwwwww" % 3}
        msg["headers"] = emptying_headers(msg)
        return msg

    async def app(scope, receive, send):
        if scope["type"] != "websocket":
            return
        await receive()
        await send(accept())
        seen.append("accepted")
    _, addr = serve_asgi(app)
    out = raw(addr, ws_handshake(b"/sub"))
    assert seen == ["accepted"], seen
    assert b"\r\nSec-WebSocket-Protocol: proto-00000003-wwwwwwwwwwwwwwww\r\n" in out, out
    assert b"\r\nx-h: 1\r\n" in out, out


# ---- a send() from inside a send() (the http scope's point 5 guard) ----

def closing_headers(send, seen):
    """websocket.accept's headers: an iterable whose __iter__ sends
    websocket.close first (a 403 and the call's end, on the unfixed code)."""
    def gen():
        try:
            seen.append(("inner", send({"type": "websocket.close"})))
        except Exception as exc:                      # noqa: BLE001
            seen.append(("inner", exc))
        yield (b"x-h", b"1")
    return gen()


def test_ws_close_from_inside_websocket_accept_is_refused(serve_asgi):
    """A websocket.close from the code websocket.accept runs (its headers'
    __iter__) answered 403 and the outer accept wrote its 101 behind it,
    and the app was told it accepted. The inner send is refused (the
    app's RuntimeError), the accept goes on alone: one head, the 101."""
    seen = []

    async def app(scope, receive, send):
        if scope["type"] != "websocket":
            return
        await receive()
        await send({"type": "websocket.accept", "headers": closing_headers(send, seen)})
        seen.append(("outer", "accepted"))
        await send({"type": "websocket.send", "text": "after"})
    _, addr = serve_asgi(app)
    out = raw(addr, ws_handshake(b"/acc"))
    assert out.count(b"HTTP/1.1 ") == 1, out
    assert frames_of(out)[0] == (1, b"after"), out
    kind, inner = seen[0]
    assert kind == "inner" and isinstance(inner, RuntimeError), seen
    assert "in progress" in str(inner), seen
    assert seen[1] == ("outer", "accepted"), seen


class SendsFromBool:
    """more_body of a denial's body: asks send() for the body's end itself."""

    def __init__(self, send, seen):
        self.send, self.seen = send, seen

    def __bool__(self):
        try:
            self.seen.append(self.send({"type": "websocket.http.response.body", "body": b"inner"}))
        except Exception as exc:                      # noqa: BLE001
            self.seen.append(exc)
        return False


def test_ws_denial_body_sent_from_inside_its_more_body_is_refused(serve_asgi):
    """The denial's body: a send from more_body's __bool__ ended the
    response and the outer one wrote its bytes after that end. Refused:
    the response is the outer send's alone."""
    seen = []

    async def app(scope, receive, send):
        if scope["type"] != "websocket":
            return
        await receive()
        await send({"type": "websocket.http.response.start", "status": 401, "headers": []})
        await send({"type": "websocket.http.response.body", "body": b"outer",
                    "more_body": SendsFromBool(send, seen)})
    _, addr = serve_asgi(app)
    out = raw(addr, ws_handshake(b"/deny2"))
    assert out.startswith(b"HTTP/1.1 401 "), out
    assert b"inner" not in out and out.endswith(b"\r\n\r\nouter"), out
    assert len(seen) == 1 and isinstance(seen[0], RuntimeError), seen
