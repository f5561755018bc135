"""Issue 35, review 2: the drain's going away (asgi_ws.c ws_going_away)
walks every live call and closes each: a call whose close is at once (a
handshake not answered yet gets its 503 and, nothing unread, its
connection closes there and then) is unlinked from the list inside the
walk, its `next` set to NULL, and the walk took that NULL as the list's
end: every WebSocket linked after it (the older ones: a call is linked at
the head) was left open, never told 1001, and cut at the worker's exit.
In process (serve_asgi), raw clients."""
from __future__ import annotations

import asyncio
import base64
import os
import socket
import threading
import time

import pytest

from wsclient import OPEN, RawWs

pytestmark = pytest.mark.timeout(60)


def wait_for(pred, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class App:
    """/open-*: accepted, its disconnect code recorded; /pending: never
    answered until `release` is set."""

    def __init__(self):
        self.codes: dict[str, int] = {}
        self.started: set[str] = set()
        self.release = threading.Event()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            return
        await receive()
        path = scope["path"]
        self.started.add(path)
        if path == "/pending":
            while not self.release.is_set():
                await asyncio.sleep(0.01)
            return
        await send({"type": "websocket.accept"})
        while (m := await receive())["type"] != "websocket.disconnect":
            pass
        self.codes[path] = m["code"]


class _Raw:
    """A handshake whose answer is not waited for (RawWs waits for it)."""

    def __init__(self, addr, path):
        self.sock = socket.create_connection(addr, timeout=10)
        OPEN.append(self)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())

    def close(self):
        self.sock.close()


@pytest.fixture
def app_and_loop(serve_asgi):
    app = App()
    loop, addr = serve_asgi(app)
    yield app, loop, addr
    app.release.set()


def test_going_away_reaches_websockets_behind_a_pending_handshake(app_and_loop):
    app, loop, addr = app_and_loop
    older = [RawWs(addr, path=f"/open-{n}") for n in range(3)]
    assert all(ws.status == 101 for ws in older)
    wait_for(lambda: len(app.started) == 3, what="3 WebSockets accepted")
    pending = _Raw(addr, "/pending")                # the newest: the list's head
    wait_for(lambda: "/pending" in app.started, what="the pending handshake's app")
    loop.going_away()
    pending.sock.settimeout(10)
    assert pending.sock.recv(4096).startswith(b"HTTP/1.1 503 ")
    codes = [ws.close_code(timeout=5) for ws in older]
    assert codes == [1001, 1001, 1001], codes
    wait_for(lambda: len(app.codes) == 3, what="each app told")
    assert set(app.codes.values()) == {1001}, app.codes
