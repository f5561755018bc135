"""A close the server starts lingers (RFC 6455 7.1.1; worker/native/app/asgi/
asgi_ws_call.c asgi_ws_lingers, asked by the HTTP/1 codec's h1_unread):
after our close frame the client still owes its answer, and may be
sending data frames meanwhile. The connection sends our FIN behind the
frame and reads and drops what comes until the client's FIN; a close(2)
at once, with the client's frames still arriving, answers them with a
reset, and the reset destroys our close frame in the client's receive
buffer before it reads it (the client sees ECONNRESET, no close code).

Pinned when the close-handshake wait moved from the connection layer's
table into the adapter's (issue 37): dropping it passed every other test."""
from __future__ import annotations

import asyncio
import time

import pytest

from wsclient import RawWs, frame

pytestmark = pytest.mark.timeout(60)


async def closes_first(scope, receive, send):
    """Accepts, then closes (1000) at once and ends: the close is ours."""
    if scope["type"] != "websocket":
        return
    assert (await receive())["type"] == "websocket.connect"
    await send({"type": "websocket.accept"})
    await asyncio.sleep(0.05)
    await send({"type": "websocket.close", "code": 1000})


@pytest.mark.parametrize("round_", range(3))
def test_a_close_we_start_reaches_a_client_still_sending(serve_asgi, round_):
    _, addr = serve_asgi(closes_first)
    w = RawWs(addr, path="/")
    assert w.status == 101
    # the client sends on, not reading, across our close and past it
    message = frame(1, b"m" * 1024, mask=True)
    sent, failed = 0, None
    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline:
        try:
            w.send(message)
            sent += 1
        except OSError as exc:              # the reset reached the sender first
            failed = exc
            break
        time.sleep(0.002)
    assert failed is None, f"sending after {sent} frames: {failed!r} (a reset)"
    assert w.close_code(timeout=10) == 1000, "our close frame was lost (a reset)"
