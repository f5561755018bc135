"""An fd the app closes while it is registered with its asyncio loop
(issue 35 point 3): a socket with a pending loop.sock_recv(), closed by
the app. Its number is free again in the kernel, but the loop thread's
fdcore table still had it (the app's registration, KIND_AIO, disowned),
so every later connection the kernel gave that number was refused by the
table and closed unanswered (a reset), silently, for the life of the
worker. asyncio's own loops do not lose the number (epoll forgets a
closed fd); ours must not either:

  - each round of connections after the close is answered, every one;
  - the app's stale registration (its key still in the selector) acted on
    later (the task cancelled: remove_reader of that number) must not touch
    the connection that now has the number: it is answered after.

A real Loop over a real fdcore Table on loopback (conftest.py's
serve_asgi), in this process: the clients' sockets are made before the
close, so the only new fds after it are the server's accepted ones (the
kernel gives the lowest free number: the closed one). Under ASan in the
asgi part of test_http_asan.py."""
from __future__ import annotations

import asyncio
import socket
import time

import pytest

pytestmark = pytest.mark.timeout(60)

ROUNDS, PER_ROUND = 3, 5


def make_app():
    held = {}

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        path = scope["path"]
        body = b"ok"
        if path == "/close":
            loop = asyncio.get_running_loop()
            a, b = socket.socketpair()
            a.setblocking(False)
            held["task"] = loop.create_task(loop.sock_recv(a, 1))
            await asyncio.sleep(0.01)          # its reader registered (add_reader)
            body = b"%d" % a.fileno()
            a.close()                           # still registered with the loop
            b.close()
        elif path == "/cancel":
            # the sock_recv's done callback: remove_reader(the old number)
            held.pop("task").cancel()
            await asyncio.sleep(0.01)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})
    return app


def request(path: bytes, close: bool = True) -> bytes:
    return (b"GET " + path + b" HTTP/1.1\r\nHost: h\r\n" +
            (b"Connection: close\r\n" if close else b"") + b"\r\n")


def read_response(s: socket.socket, deadline: float) -> bytes:
    """One response (Content-Length framed) or what came before EOF/reset."""
    out = b""
    while time.monotonic() < deadline:
        head, sep, rest = out.partition(b"\r\n\r\n")
        if sep:
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    if len(rest) >= int(line.split(b":")[1]):
                        return out
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return out + b"<reset>"
        except socket.timeout:
            continue
        if not chunk:
            return out + b"<eof>"
        out += chunk
    return out + b"<timeout>"


def ask(s: socket.socket, addr, path: bytes, close: bool = True, connect: bool = True) -> bytes:
    if connect:
        s.connect(addr)
    s.sendall(request(path, close))
    return read_response(s, time.monotonic() + 10)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_closed_registered_fd_number_serves_later_connections(serve_asgi, threads):
    _, addr = serve_asgi(make_app(), threads=threads)
    # every client socket first: after the close, only the server makes fds
    socks = [socket.socket() for _ in range((ROUNDS + 1) * PER_ROUND + 2)]
    for s in socks:
        s.settimeout(0.5)
    closer, canceller = socks.pop(), socks.pop()
    try:
        got = ask(closer, addr, b"/close")
        assert got.startswith(b"HTTP/1.1 200"), got
        for r in range(ROUNDS + 1):
            last = r == ROUNDS
            batch = socks[r * PER_ROUND:(r + 1) * PER_ROUND]
            for s in batch:
                s.connect(addr)                 # accepted together: one has the number
            answers = [ask(s, addr, b"/ok", close=not last, connect=False) for s in batch]
            bad = [a for a in answers if not a.startswith(b"HTTP/1.1 200")]
            assert not bad, f"round {r}: {len(bad)} of {PER_ROUND} not answered: {bad}"
            # the client sockets stay open (closed at the end): a number
            # freed in this process now would be the next accept's, and
            # the old one never reached again; the server closes its side
            time.sleep(0.05)
        # the last round's connections are kept alive: one of them has the
        # old number. The app's stale registration is then acted on (its
        # task cancelled: remove_reader, the selector's unregister)
        got = ask(canceller, addr, b"/cancel")
        assert got.startswith(b"HTTP/1.1 200"), got
        answers = [ask(s, addr, b"/ok", connect=False) for s in batch]
        bad = [a for a in answers if not a.startswith(b"HTTP/1.1 200")]
        assert not bad, f"after the unregister: {len(bad)} of {PER_ROUND} not answered: {bad}"
    finally:
        for s in socks + [closer, canceller]:
            s.close()
