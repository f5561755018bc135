"""A WebSocket receive() or send() the app stops awaiting (asyncio.wait_for's
timeout, its task cancelled) is dropped as the http scope drops one
(asgi_end.c asgi_waiting; issue 35, point 6): the next receive() or send()
is taken, and a client message that comes meanwhile is kept for it.

On the unfixed code the abandoned future stayed the call's: the next
receive() raised RuntimeError ("while another receive() ... waits"), the
client's next message was handed to the cancelled future and lost, and
the next send() raised RuntimeError ("while another send() ... waits").

A real Loop over a real fdcore Table on loopback (conftest.py's
serve_asgi); a raw WebSocket client (tests/ws/wsclient.py), every wait a
poll with a deadline."""
from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ws"))
import wsclient  # noqa: E402
from wsclient import RawWs, frame  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _clients_closed():
    yield
    while wsclient.OPEN:
        wsclient.OPEN.pop().close()


def wait_until(pred, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def receive_app(seen, pause):
    """Accepts, abandons one receive() by wait_for's timeout, waits `pause`
    seconds (the client's message comes then), receives again and echoes."""
    async def app(scope, receive, send):
        if scope["type"] != "websocket":
            return
        await receive()
        await send({"type": "websocket.accept"})
        try:
            await asyncio.wait_for(receive(), 0.1)
            seen.append("no timeout")
        except asyncio.TimeoutError:
            seen.append("timed out")
        await asyncio.sleep(pause)
        try:
            m = await asyncio.wait_for(receive(), 5)
            seen.append(m)
            await send({"type": "websocket.send", "text": "echo:" + m.get("text", "")})
        except Exception as exc:                      # noqa: BLE001
            seen.append(exc)
    return app


@pytest.mark.parametrize("pause", [0.0, 0.5], ids=["at-once", "after-a-pause"])
def test_a_receive_abandoned_by_wait_for_leaves_the_next_receive_its_message(serve_asgi,
                                                                             pause):
    seen = []
    _, addr = serve_asgi(receive_app(seen, pause))
    w = RawWs(addr, path="/r")
    assert w.status == 101
    wait_until(lambda: seen, "the app's wait_for")
    assert seen[0] == "timed out", seen
    w.send(frame(1, b"hello"))
    got = w.recv_frame()
    assert got == (1, 1, b"echo:hello"), (got, seen)
    assert seen[1] == {"type": "websocket.receive", "text": "hello"}, seen


def send_app(seen):
    """Accepts, sends 256 KiB messages to a client that does not read until
    one send waits (the output past its high water) and wait_for abandons
    it, then sends once more."""
    async def app(scope, receive, send):
        if scope["type"] != "websocket":
            return
        await receive()
        await send({"type": "websocket.accept"})
        chunk = b"x" * (256 << 10)
        for i in range(400):
            try:
                await asyncio.wait_for(send({"type": "websocket.send", "bytes": chunk}), 0.2)
            except asyncio.TimeoutError:
                seen.append(("timed out", i + 1))
                break
        try:
            await asyncio.wait_for(send({"type": "websocket.send", "text": "after"}), 10)
            seen.append("sent after")
        except Exception as exc:                      # noqa: BLE001
            seen.append(exc)
    return app


def test_a_send_abandoned_by_wait_for_leaves_the_next_send_taken(serve_asgi):
    seen = []
    _, addr = serve_asgi(send_app(seen))
    w = RawWs(addr, path="/s")
    assert w.status == 101
    wait_until(lambda: seen, "the app's abandoned send")
    assert seen[0][0] == "timed out", seen
    sent = seen[0][1]
    # every message goes out whole (the abandoned one was written already),
    # then "after"
    n = 0
    while True:
        got = w.recv_frame()
        assert got is not None, (n, seen)
        if got[0] == 2:
            assert got[2] == b"x" * (256 << 10)
            n += 1
            continue
        assert got == (1, 1, b"after"), (got, seen)
        break
    assert n == sent, (n, seen)
    wait_until(lambda: len(seen) > 1, "the app's next send")
    assert seen[1] == "sent after", seen
