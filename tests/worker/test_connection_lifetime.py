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

from test_engine_connection_lifecycle import recv_until
from test_http_parser_and_wsgi_framing import serve, wait_for  # noqa: F401

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
    got = recv_until(n, lambda b: b.endswith(b"next"), 5)
    n.close()
    assert got.endswith(b"next"), got
    assert not unraisable, unraisable[:3]


# Was: a strict xfail (the loop thread blocked in conn_flush_wait while a
# slow reader drained the HIGH_WATER..LOW_WATER span); fixed by issue 21:
# the generator is parked on its connection and resumed by the loop.
def test_a_slow_reader_of_a_streamed_response_does_not_stall_the_worker(serve):
    """Review finding: a client that reads a streamed (generator) response
    slowly but steadily, never idle for body_timeout, holds the worker's
    only loop thread inside conn_flush_wait for as long as it likes (each
    bit of progress moves the deadline): a few such clients stall a
    default worker (threads=1) outright. Another client's plain request
    must still be answered promptly."""
    from test_engine_connection_lifecycle import shrink_sndbuf, small_rcvbuf_client

    def app(environ, start_response):
        if environ["PATH_INFO"] == "/other":
            start_response("200 OK", [("Content-Length", "5")])
            return [b"other"]
        shrink_sndbuf(environ)
        start_response("200 OK", [])

        def stream():
            for _ in range(256):
                yield b"s" * 65536              # 16 MiB, block by block

        return stream()

    _, addr = serve(app, threads=1, body_timeout=5.0)
    slow = small_rcvbuf_client(addr, 4096)
    stop = threading.Event()

    def trickle():
        try:
            slow.sendall(b"GET /stream HTTP/1.1\r\nHost: h\r\n\r\n")
            while not stop.is_set() and slow.recv(1024):
                stop.wait(0.01)                 # ~100 KiB/s: steady, never idle
        except OSError:
            pass

    t = threading.Thread(target=trickle)
    t.start()
    try:
        time.sleep(0.5)                         # the stream is under way (not a wait on it)
        other = socket.create_connection(addr, timeout=10)
        try:
            other.sendall(b"GET /other HTTP/1.1\r\nHost: h\r\n\r\n")
            got = recv_until(other, lambda b: b.endswith(b"other"), 3.0)
        finally:
            other.close()
        assert got.endswith(b"other"), got
    finally:
        stop.set()
        slow.close()
        t.join(10)


def test_a_response_begun_after_the_drain_began_carries_connection_close(serve):
    """Review finding: whether a response says `Connection: close` while
    the worker drains was decided when its request arrived; a request
    already in the app when the drain began (here: waiting for the rest of
    its body) was answered as keep-alive, so its client kept the connection
    for a next request that the drain's idle close then races. A head
    that goes out after the drain began says close, and the connection
    ends after it."""
    started = threading.Event()

    def app(environ, start_response):
        started.set()
        body = environ["wsgi.input"].read()
        start_response("200 OK", [("Content-Length", str(len(body)))])
        return [body]

    # the slow path: every body still arriving streams
    loop, addr = serve(app, threads=2, body_buffer=0)
    c = socket.create_connection(addr, timeout=10)
    try:
        c.sendall(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n12345")
        assert started.wait(5)
        loop.drain(5.0)
        c.sendall(b"67890")
        out = recv_until(c, lambda b: False, 5.0)              # to the server's close
    finally:
        c.close()
    assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"\r\n\r\n1234567890"), out
    assert b"\r\nConnection: close\r\n" in out, out
    assert loop.drained.wait(5)


def test_a_drain_closes_an_idle_http_connection_without_ending_a_loop_thread(serve_wsgi):
    """Issue 20 regression: the drain's idle check asked every connection
    of `conns` whether its input had ended, a stream connection's attribute;
    the HTTP engine's connections have none, and a drain with an idle
    kept-alive one ended the loop thread (AttributeError)."""
    def hello(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"hi"]

    loop, addr = serve_wsgi(hello, threads=1)
    c = socket.create_connection(addr, timeout=10)
    c.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    got = b""
    while not got.endswith(b"hi"):
        got += c.recv(4096)
    loop.drain(idle_grace=0.2)
    assert loop.drained.wait(10)
    assert c.recv(100) == b""                    # closed by the drain, after the grace
    assert not loop.ended and not loop.errors, loop.errors
    c.close()
