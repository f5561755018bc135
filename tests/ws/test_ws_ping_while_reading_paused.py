"""Issue 35, review 2: the keep-alive ping (asgi_ws_ping.c) closed a live
client 1011 "keepalive ping timeout" whenever its app was slower than
ws_ping_interval + ws_ping_timeout while the client had sent ahead: the
receive queue full, the input buffer full (h1_input_room, in_full), the
server stopped reading, so the client's pong sat in the kernel unread and
the pong timer fired on a peer that had answered at once. The close then
came with that input unread (a reset on the wire) and every message the
client sent that the app had not taken yet was lost. While the server
itself does not read, nothing the client does can count as life: no
ping is timed out then (the interval starts again; reading resumes once
the app receives, and what was waiting is life then).
In process (serve_asgi), a raw client that answers every ping."""
from __future__ import annotations

import asyncio
import select
import threading
import time

import pytest

from wsclient import RawWs, frame

pytestmark = pytest.mark.timeout(60)

MESSAGES = 2000


class Stall:
    """Accepts, takes nothing until `release`, then every message."""

    def __init__(self):
        self.release = threading.Event()
        self.got = 0
        self.code = None
        self.ended = threading.Event()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            return
        await receive()
        await send({"type": "websocket.accept"})
        try:
            while not self.release.is_set():
                await asyncio.sleep(0.01)
            while (m := await receive())["type"] == "websocket.receive":
                self.got += 1
            self.code = m["code"]
        finally:
            self.ended.set()


def converse(ws: RawWs, data: bytes, seconds: float) -> list:
    """Sends data (non-blocking) for `seconds`, answering every ping; the
    server's other frames and any end, in order."""
    s, view, at, buf, seen = ws.sock, memoryview(data), 0, b"", []
    s.setblocking(False)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            r, w, _ = select.select([s], [s] if at < len(data) else [], [], 0.05)
            try:
                if w:
                    at += s.send(view[at:at + 65536])
                if r:
                    d = s.recv(65536)
                    if not d:
                        return seen + ["eof"]
                    buf += d
            except BlockingIOError:
                continue
            except OSError as exc:
                return seen + [repr(exc)]
            while len(buf) >= 2 and len(buf) >= 2 + (buf[1] & 0x7F):
                op, n = buf[0] & 0x0F, buf[1] & 0x7F
                payload, buf = buf[2:2 + n], buf[2 + n:]
                if op == 0x9:
                    s.sendall(frame(0xA, payload))
                else:
                    seen.append((op, payload))
    finally:
        s.setblocking(True)
    assert at == len(data) or seen, "the flood never finished"
    return seen


def test_a_client_answering_pings_outlives_a_slow_app(serve_asgi):
    app = Stall()
    loop, addr = serve_asgi(app, ws_ping_interval=0.3, ws_ping_timeout=0.3)
    ws = RawWs(addr, path="/slow")
    assert ws.status == 101
    try:
        # ~2 MB ahead of an app that stalls for 10 intervals + timeouts
        seen = converse(ws, frame(2, b"x" * 1000) * MESSAGES, 3.0)
        assert seen == [], f"the server ended a client that answered every ping: {seen}"
    finally:
        app.release.set()
    deadline = time.monotonic() + 20
    while app.got < MESSAGES and not app.ended.is_set():
        assert time.monotonic() < deadline, f"{app.got} of {MESSAGES} messages taken"
        converse(ws, b"", 0.05)
    assert app.got == MESSAGES
    ws.send(frame(0x8, b"\x03\xe8"))
    assert ws.close_code(timeout=10) == 1000
    assert app.ended.wait(10) and app.code == 1000
