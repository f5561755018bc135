"""The WebSocket receive queue's account (issue 35, points 4 and 17), in
process (serve_asgi: a real Loop on loopback, the native engine; under
ASan by test_ws_asan.py's part): `_http.ws_held()`, what every queue
holds, counts each message by what it holds and takes off exactly what it
counted, so

- a stalled app's queue fills to its bound (WS_QUEUE_MAX, 256 KiB) with
  messages of any kind, empty ones included, and no further;
- once the app has taken every message (none lost, in order) the account
  is back where it started; so it is when the connection closes with
  messages still queued.

The real-server tests (test_ws_queue_bound.py) show what a flood costs the
worker; these show the account itself, which a mutation breaks (counting
payload bytes in, or a str's width out: the bound fails or the account
drifts)."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from sockherd.worker import _http
from wsclient import RawWs, frame

pytestmark = pytest.mark.timeout(60)

QUEUE_MAX = 256 << 10
MESSAGES = {
    "empty": (2, b""),
    "one-byte": (2, b"x"),
    "ascii": (1, b"hello"),
    "astral": (1, ("a" * 1000 + "\U0001F600").encode()),
    "latin-1": (1, ("\xe9" * 300).encode()),
    "ucs-2": (1, ("\u0100" * 300).encode()),
    "binary-64k": (2, bytes(64 << 10)),
}


def wait_for(pred, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def settled_held() -> int:
    """ws_held() once two reads 0.2 s apart agree."""
    last = [-1]

    def steady():
        time.sleep(0.2)
        now = _http.ws_held()
        same, last[0] = now == last[0], now
        return same
    wait_for(steady, what="a steady ws_held()")
    return last[0]


class Stall:
    """Accepts, takes nothing until `release` is set, then takes every
    message (recorded) until the disconnect, or returns at once if `take`
    is off (its queue left to the call's end)."""

    def __init__(self):
        self.take = True
        self.release = threading.Event()
        self.got: list[dict] = []
        self.ended = threading.Event()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            return
        await receive()
        await send({"type": "websocket.accept"})
        try:
            while not self.release.is_set():
                await asyncio.sleep(0.01)
            while self.take:
                m = await receive()
                if m["type"] == "websocket.disconnect":
                    return
                self.got.append(m)
        finally:
            self.ended.set()


@pytest.fixture
def stall(serve_asgi):
    app = Stall()
    yield app, serve_asgi(app)[1]
    app.release.set()


@pytest.mark.parametrize("kind", list(MESSAGES))
def test_a_stalled_queue_fills_to_its_bound_and_drains_to_zero(stall, kind):
    app, addr = stall
    start = _http.ws_held()
    op, payload = MESSAGES[kind]
    n = max(2000, 2 * QUEUE_MAX // max(1, len(payload)))
    ws = RawWs(addr, path="/stall")
    assert ws.status == 101
    sender = threading.Thread(target=ws.sock.sendall, args=(frame(op, payload) * n,), daemon=True)
    sender.start()
    held = settled_held() - start
    # full: no further than one message past the bound; every message
    # costs its dict and object (~250 bytes at least), so empty ones fill it too
    assert QUEUE_MAX <= held < QUEUE_MAX + len(payload) * 4 + 4096, (kind, held)
    app.release.set()
    sender.join(30)
    assert not sender.is_alive(), "the server stopped reading once the app took its messages"
    wait_for(lambda: len(app.got) == n, what=f"{n} messages taken")
    value = payload.decode() if op == 1 else payload
    assert all(m.get("text" if op == 1 else "bytes") == value for m in app.got)
    assert _http.ws_held() == start, f"the account drifted by {_http.ws_held() - start}"
    ws.close()
    wait_for(app.ended.is_set, what="the app's end")


def test_a_connection_closed_with_messages_queued_gives_its_account_back(stall):
    app, addr = stall
    start = _http.ws_held()
    ws = RawWs(addr, path="/stall")
    assert ws.status == 101
    ws.send(frame(1, b"queued") * 500)
    wait_for(lambda: _http.ws_held() - start > 500 * 200, what="500 messages queued")
    app.take = False
    app.release.set()                  # it returns, the 500 messages left queued
    wait_for(app.ended.is_set, what="the app's end")
    ws.close()
    wait_for(lambda: _http.ws_held() == start, what="the account given back")


def test_deflate_without_a_message_bound_is_refused_natively():
    """Issue 35, point 23: ws_max_size 0 with deflate removed the inflate
    cap (255 KiB -> 256 MiB); settings.py refuses it first
    (tests/master/test_settings.py), the native entries too."""
    with pytest.raises(ValueError, match="permessage-deflate needs a message bound"):
        _http.ws_settings(0, True)
    with pytest.raises(ValueError, match="deflate needs a message bound"):
        _http.WsParser(0, deflate=True)
    _http.WsParser(0)                          # no bound without deflate: the operator's choice
