"""Connection lifetime of the native engine: a connection that ends on a
thread that is not a loop thread, and what the worker's accounting (the
connection cap, the counters) makes of it.

Found by the adversarial review of the connection layer after issue 18."""
from __future__ import annotations

import socket
import sys
import threading
import time

import pytest

from test_engine_review import recv_until
from test_http_review import serve, wait_for  # noqa: F401

pytestmark = pytest.mark.timeout(120)


def _reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()


def test_cap_reopens_when_a_connection_ends_on_an_app_thread(serve, monkeypatch):
    """Review finding: a connection that fails on a thread of the app's own
    (write() from a producer thread to a client that reset) is forgotten
    from that thread; loop.forget then reopened the max_connections gate
    with `self.local.th`, which a non-loop thread has not: an unraisable
    AttributeError, the cap stayed shut, and a worker at its cap never
    accepted again. The next client must be served."""
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(u.exc_value))
    done = threading.Event()

    def app(environ, start_response):
        if environ["PATH_INFO"] == "/next":
            start_response("200 OK", [("Content-Length", "4")])
            return [b"next"]
        write = start_response("200 OK", [])

        def produce():
            try:
                for _ in range(2000):
                    write(b"p" * 65536)
            except BaseException:  # noqa: BLE001 - the client is gone: expected
                pass
            done.set()

        t = threading.Thread(target=produce)
        t.start()
        t.join(30)
        return []

    loop, addr = serve(app, threads=2, body_timeout=4.0)
    loop.max_connections = 1
    c = socket.create_connection(addr, timeout=10)
    c.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    assert recv_until(c, lambda b: len(b) > 200000, 10)
    # a second client while at the cap: the other loop thread shuts the gate
    n = socket.create_connection(addr, timeout=10)
    n.sendall(b"GET /next HTTP/1.1\r\nHost: h\r\n\r\n")
    assert wait_for(lambda: "cap" in loop.gate.reasons, 5)
    _reset(c)
    assert done.wait(20)
    assert wait_for(lambda: not loop.conns or len(loop.conns) == 1 and c.fileno() < 0, 5)
    got = recv_until(n, lambda b: b.endswith(b"next"), 5)
    n.close()
    assert got.endswith(b"next"), got
    assert not unraisable, unraisable[:3]
