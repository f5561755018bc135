"""A connection whose ASGI app runs is not idle and owes nothing yet
(conn.h: c->call): the keep-alive timer does not run while the app thinks
longer than keepalive_timeout, and a drain does not close it as idle
after its grace; its response still goes out whole (Connection: close
while draining)."""
from __future__ import annotations

import asyncio
import socket
import time

import pytest

pytestmark = pytest.mark.timeout(60)


def slow(seconds: float):
    async def app(scope, receive, send):
        await asyncio.sleep(seconds)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"late but whole"})
    return app


def read_all(c: socket.socket) -> bytes:
    out = b""
    while chunk := c.recv(65536):
        out += chunk
    return out


def test_an_app_slower_than_keepalive_timeout_is_answered(serve_asgi):
    _, addr = serve_asgi(slow(1.0), keepalive_timeout=0.2, header_timeout=0.2)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        out = read_all(c)
    assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"late but whole")


def test_a_drain_waits_for_a_running_app(serve_asgi):
    loop, addr = serve_asgi(slow(1.0))
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        deadline = time.monotonic() + 5
        while not loop.conns:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        loop.drain(idle_grace=0.1)
        out = read_all(c)
    assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"late but whole")
    assert b"Connection: close" in out
    assert loop.drained.wait(5)


def test_an_app_idle_after_a_burst_the_client_took_late(serve_asgi):
    """A streamed burst that waited in the output (the send timer ran for
    it), taken by the client, then the app thinks longer than
    body_timeout before its last part: the send timer ended with the
    output it timed; the connection is not cut for the app's own time."""
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x" * (4 << 20), "more_body": True})
        await asyncio.sleep(1.5)
        await send({"type": "http.response.body", "body": b"the end"})

    _, addr = serve_asgi(app, body_timeout=0.5)
    with socket.create_connection(addr, timeout=10) as c:
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        c.sendall(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        time.sleep(0.2)                            # the burst waits in our output
        out = read_all(c)
    assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"the end\r\n0\r\n\r\n")
