"""Issue 35, review 2: asgi_end.c's asgi_resolve calls a future's done()
(fut_call) and then PyObject_IsTrue on what it returned; the future is
the app's loop's (loop.create_future, which the app's code may replace),
so done() may return junk whose truth raises. That -1 was taken for
"done" and the exception then dropped by the PyErr_Restore of what was
pending before: the app's send() never resolved and nothing was
reported. asgi_waiting reports the same case (PyErr_WriteUnraisable);
asgi_resolve must too. In process (serve_asgi), a raw client that reads
nothing until the app's send waits past HIGH_WATER."""
from __future__ import annotations

import asyncio
import sys
import threading
import time

import pytest

from wsclient import RawWs

pytestmark = pytest.mark.timeout(60)


def wait_for(pred, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class Junk:
    def __bool__(self):
        raise ValueError("junk truth")


class JunkDoneFuture(asyncio.Future):
    def done(self):
        return Junk()


class App:
    """Replaces its loop's create_future, then sends 1 MiB messages to a
    client that reads nothing until one send waits (past HIGH_WATER) on a
    JunkDoneFuture."""

    def __init__(self):
        self.waiting = threading.Event()
        self.sent = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            return
        await receive()
        await send({"type": "websocket.accept"})
        loop = asyncio.get_running_loop()
        loop.create_future = lambda: JunkDoneFuture(loop=loop)
        try:
            for _ in range(256):
                pending = send({"type": "websocket.send", "bytes": bytes(1 << 20)})
                self.sent += 1
                if isinstance(pending, asyncio.Future):
                    self.waiting.set()
                    await pending
                    return
                await pending
        finally:
            del loop.create_future


@pytest.fixture
def unraisable():
    seen: list = []
    old = sys.unraisablehook
    sys.unraisablehook = lambda u: seen.append((u.exc_type, str(u.exc_value)))
    yield seen
    sys.unraisablehook = old


def test_a_futures_done_whose_truth_raises_is_reported(serve_asgi, unraisable):
    app = App()
    loop, addr = serve_asgi(app)
    ws = RawWs(addr, path="/big")
    assert ws.status == 101
    wait_for(app.waiting.is_set, what="a send waiting past HIGH_WATER")
    for _ in range(app.sent):                       # read: the output drains, resume
        op, fin, payload = ws.recv_frame(timeout=20)
        assert len(payload) == 1 << 20
    wait_for(lambda: any(t is ValueError and "junk truth" in m for t, m in unraisable),
             what=f"the junk truth reported (seen: {unraisable})")
