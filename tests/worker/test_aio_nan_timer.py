"""A timer due at NaN (issue 35 point 9): asyncio.sleep(nan), call_later
(nan, ...), call_at(nan, ...). The loop's C call_later/call_at took the
NaN as the timer's due time; the loop thread's wait (due time - now) was
then NaN, which no bound caught: it polled with no timeout, and the
request hung on an idle worker (as long as nothing else woke it). A NaN is
refused as Python 3.13's asyncio.sleep refuses it: ValueError, the app's
own error (a 500, logged with the app's traceback), and the loop thread
serves on. A NaN timer made by asyncio's own methods (what our C callers
hand to them) counts as due now, as asyncio's _run_once treats it.

A real Loop over a real fdcore Table on loopback (conftest.py's
serve_asgi); every request read with a deadline."""
from __future__ import annotations

import asyncio
import logging
import socket
import time

import pytest

pytestmark = pytest.mark.timeout(60)

NAN = float("nan")


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    path, loop = scope["path"], asyncio.get_running_loop()
    if path == "/sleep":
        await asyncio.sleep(NAN)
    elif path in ("/later", "/at"):
        fut = loop.create_future()
        if path == "/later":
            loop.call_later(NAN, fut.set_result, None)
        else:
            loop.call_at(NAN, fut.set_result, None)
        await fut
    elif path == "/base":
        # asyncio's own call_at (our C one hands it what it does not
        # check itself): its NaN timer must not stop the loop's wait either
        fut = loop.create_future()
        asyncio.BaseEventLoop.call_at(loop, NAN, fut.set_result, None)
        await fut
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def get(addr, path: bytes, timeout: float = 5) -> bytes:
    """The response to one request (Connection: close), or what came
    before the deadline with <timeout>."""
    deadline = time.monotonic() + timeout
    out = b""
    with socket.create_connection(addr, timeout=0.2) as s:
        s.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                return out
            out += chunk
    return out + b"<timeout>"


@pytest.mark.parametrize("path", [b"/sleep", b"/later", b"/at"])
def test_a_nan_due_time_is_the_apps_error_and_the_loop_serves_on(serve_asgi, caplog, path):
    _, addr = serve_asgi(app)
    with caplog.at_level(logging.ERROR, logger="sockherd.worker"):
        out = get(addr, path)
        assert out.startswith(b"HTTP/1.1 500"), out
        assert get(addr, b"/ok").endswith(b"\r\n\r\nok")
    text = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert "app failed on GET " + path.decode() in text, text
    assert any(r.exc_info and r.exc_info[0] is ValueError and "NaN" in str(r.exc_info[1])
               for r in caplog.records), text


def test_a_nan_timer_of_asyncios_own_call_at_is_due_now(serve_asgi):
    _, addr = serve_asgi(app)
    out = get(addr, b"/base")
    assert out.endswith(b"\r\n\r\nok"), out
    assert get(addr, b"/ok").endswith(b"\r\n\r\nok")
