"""Flow control of ASGI responses and the client's end (issue 22 §2):
send() waits while the connection's output is past HIGH_WATER, so a
client that does not read costs bounded memory whatever the app streams;
http.disconnect reaches a receive() when the client goes away, also
while a streaming response is being sent, and a send() after that raises
an OSError (ClientDisconnected, ASGI 2.4)."""
from __future__ import annotations

import asyncio
import socket
import struct
import time

import pytest

from sockherd.worker._http import ClientDisconnected

pytestmark = pytest.mark.timeout(60)

HIGH_WATER = 1 << 20
CHUNK = 64 << 10
TOTAL = 10 << 20


def wait_until(fn, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not fn():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_client_that_does_not_read_suspends_send(serve_asgi):
    """10 MB streamed to a client that reads nothing: the app's send()
    waits once about HIGH_WATER is buffered (plus what the kernel holds);
    then the client reads it all, intact."""
    progress = {"sent": 0, "waiting": False}

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"%d" % TOTAL)]})
        block = bytes(range(256)) * (CHUNK // 256)
        while progress["sent"] < TOTAL:
            progress["waiting"] = True
            await send({"type": "http.response.body", "body": block, "more_body": True})
            progress["waiting"] = False
            progress["sent"] += CHUNK
        await send({"type": "http.response.body", "body": b""})

    loop, addr = serve_asgi(app)
    with socket.create_connection(addr, timeout=20) as c:
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        c.sendall(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        # the app stops making progress: its send waits
        last = -1
        deadline = time.monotonic() + 10
        while True:
            time.sleep(0.3)
            if progress["sent"] == last and progress["waiting"]:
                break
            last = progress["sent"]
            assert time.monotonic() < deadline, "send() never waited"
        conn = next(iter(loop.conns.values()))
        assert conn.pending <= HIGH_WATER + CHUNK
        # bounded by our buffer and the kernel's (the socket's send buffer
        # at its largest, the client's receive buffer), not by the 10 MB
        with open("/proc/sys/net/ipv4/tcp_wmem") as f:
            kernel = int(f.read().split()[2]) + (256 << 10)
        assert progress["sent"] <= HIGH_WATER + 2 * CHUNK + kernel < TOTAL
        out = bytearray()
        while chunk := c.recv(1 << 20):
            out += chunk
    head, _, body = bytes(out).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and len(body) == TOTAL
    assert body == (bytes(range(256)) * (CHUNK // 256)) * (TOTAL // CHUNK)


@pytest.mark.parametrize("end", ["fin", "reset"])
def test_disconnect_during_a_streaming_response(serve_asgi, end):
    """An SSE-like stream that listens for the client's end: the client
    closes (its FIN, or a reset: the connection fails without an end of
    input), receive() says http.disconnect, a send() after it raises
    ClientDisconnected (an OSError), the loop thread serves on."""
    seen = []

    async def app(scope, receive, send):
        if scope["path"] == "/ok":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})

        async def ticks():
            while True:
                await send({"type": "http.response.body", "body": b"data: tick\n\n",
                            "more_body": True})
                await asyncio.sleep(0.02)

        ticker = asyncio.ensure_future(ticks())
        seen.append(await receive())                # the body: empty, whole
        seen.append(await receive())                # waits for the client's end
        await asyncio.sleep(0.05)                   # the ticker meets the close
        seen.append(ticker.done() and type(ticker.exception()).__name__)
        try:
            await send({"type": "http.response.body", "body": b"late", "more_body": True})
        except OSError as exc:
            seen.append(type(exc))

    _, addr = serve_asgi(app)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"GET /events HTTP/1.1\r\nHost: h\r\n\r\n")
        got = b""
        while got.count(b"tick") < 3:
            got += c.recv(65536)
        if end == "reset":
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    wait_until(lambda: len(seen) == 4, what="the app to see the disconnect")
    assert seen[0] == {"type": "http.request", "body": b"", "more_body": False}
    assert seen[1] == {"type": "http.disconnect"}
    assert seen[2] == "ClientDisconnected" and seen[3] is ClientDisconnected
    assert issubclass(ClientDisconnected, OSError)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"GET /ok HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        out = b""
        while chunk := c.recv(65536):
            out += chunk
    assert out.endswith(b"\r\n\r\nok")


def test_disconnect_mid_upload(serve_asgi):
    """The client goes away while the app waits for the rest of its body."""
    seen = []

    async def app(scope, receive, send):
        while True:
            msg = await receive()
            seen.append(msg["type"])
            if msg["type"] == "http.disconnect" or not msg.get("more_body"):
                return

    _, addr = serve_asgi(app, body_buffer=0)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1000\r\n\r\n" + b"x" * 100)
        wait_until(lambda: seen, what="the first part")
    wait_until(lambda: seen[-1] == "http.disconnect", what="http.disconnect")
    assert seen[0] == "http.request"


def test_input_while_an_app_runs_is_bounded(serve_asgi):
    """A client pipelining megabytes behind a request whose app runs: the
    connection reads on (a disconnect must be seen) but stops once
    CALL_INPUT_MAX (256 KiB) waits unparsed; the rest stays in the kernel."""
    release = []

    async def app(scope, receive, send):
        if scope["path"] == "/slow":
            release.append(asyncio.get_running_loop().create_future())
            await release[0]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    loop, addr = serve_asgi(app)
    flood = b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n" * ((4 << 20) // 30)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"GET /slow HTTP/1.1\r\nHost: h\r\n\r\n")
        wait_until(lambda: release, what="the app to run")
        c.setblocking(False)
        sent, deadline = 0, time.monotonic() + 1.0
        while time.monotonic() < deadline and sent < len(flood):
            try:
                sent += c.send(flood[sent:sent + 65536])
            except BlockingIOError:
                time.sleep(0.01)
        conn = next(iter(loop.conns.values()))
        time.sleep(0.2)                            # what it will read of it, read
        assert conn.parser.pending <= (256 << 10) + (64 << 10), conn.parser.pending
        assert sent > 1 << 20                      # the kernel holds the rest
        aio_loop = loop.aio_loop(0)
        aio_loop.call_soon_threadsafe(release[0].set_result, None)
