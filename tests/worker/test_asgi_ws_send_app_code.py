"""What a WebSocket send() does while the app's own code runs inside it: the
twins, in the websocket scope (asgi_ws_send.c), of test_asgi_send_app_code.py's
http-scope defects, found by an adversarial review of those fixes. Both are
open (issue 35: point 2's WebSocket part, and a re-entrant websocket send),
pinned as strict xfails so that their fix shows.

A real Loop over a real fdcore Table on loopback (conftest.py's serve_asgi)."""
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


@pytest.mark.xfail(strict=True, reason="issue 35 point 2, WebSocket part: do_deny reads "
                   "body and more_body borrowed across more_body's __bool__")
def test_ws_denial_body_whose_more_body_empties_the_message_keeps_its_body(serve_asgi):
    """Issue 35 point 2 (a borrowed value used after the app's __bool__),
    fixed for http.response.trailers, is still in the WebSocket denial's
    send (asgi_ws_send.c do_deny): `body` and `more_body` are borrowed
    (PyDict_GetItemString), more_body's __bool__ empties the message and
    the freed body's buffer is what goes on the wire."""
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
