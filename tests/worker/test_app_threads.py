"""The app's own threads at the call boundary: what a thread the app
starts may do with its request's callables while the request is served
(wsgi.input, write()), and that it gets what the loop thread would.

Found by the adversarial review of the connection layer after issue 18."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from test_engine_connection_lifecycle import recv_until
from test_http_parser_and_wsgi_framing import serve, wait_for  # noqa: F401

pytestmark = pytest.mark.timeout(60)


def test_100_continue_goes_out_when_an_app_thread_reads_the_body(serve):
    """Review finding: wsgi.input read from a thread of the app's (a pool
    the app hands the upload to) owed a `100 Continue`: the slow path wrote
    it with conn.write, which from a thread that is not a loop thread posts
    to the owner's mailbox; the owner is inside the app waiting for that
    thread, so the 100 never went out, a client that waits for it never
    sent its body, and the read failed after body_timeout. A thread of the
    app's may use its request's connection as the loop thread would while
    the request is served: the 100 goes out at once."""
    def app(environ, start_response):
        got = {}

        def read():
            try:
                got["body"] = environ["wsgi.input"].read()
            except BaseException as exc:  # noqa: BLE001 - reported in the answer
                got["error"] = exc

        t = threading.Thread(target=read)
        t.start()
        t.join(10)
        start_response("200 OK", [])
        return [b"got %r" % (got.get("body", got.get("error")),)]

    _, addr = serve(app, body_timeout=3.0)
    c = socket.create_connection(addr, timeout=10)
    try:
        c.sendall(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n"
                  b"Expect: 100-continue\r\n\r\n")
        interim = recv_until(c, lambda b: b"\r\n\r\n" in b, 2.0)   # a client that waits for it
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n", interim
        c.sendall(b"hello")
        got = recv_until(c, lambda b: b.endswith(b"got b'hello'"), 5.0)
        assert got.startswith(b"HTTP/1.1 200 OK") and got.endswith(b"got b'hello'"), got
    finally:
        c.close()


@pytest.mark.parametrize("attempt", range(3))          # the lost race is one of two outcomes
def test_a_body_read_by_an_app_thread_and_the_loop_thread_serves_the_next_request(serve,
                                                                                  attempt):
    """Review finding: an app that hands wsgi.input to a thread and answers
    without waiting for it leaves two readers of the socket: that thread,
    and the loop thread draining the body before the next request. Both
    polled the socket; the one that lost the bytes (fed to the parser by
    the other) waited on for body_timeout, and when that was the loop
    thread the next request, pipelined behind the body, went unanswered
    and the connection closed. One reader reads at a time, the other looks
    at the parser: the pipelined request is answered at once."""
    def app(environ, start_response):
        if environ["PATH_INFO"] == "/two":
            start_response("200 OK", [("Content-Length", "3")])
            return [b"two"]
        reader = threading.Thread(target=environ["wsgi.input"].read, daemon=True)
        reader.start()
        # the thread is waiting for the body before the loop thread drains it
        wait_for(lambda: not reader.is_alive(), 0.2)
        start_response("200 OK", [("Content-Length", "3")])
        return [b"one"]

    # the slow path: every body still arriving streams
    _, addr = serve(app, body_timeout=5.0, body_buffer=0)
    c = socket.create_connection(addr, timeout=10)
    try:
        c.sendall(b"POST /one HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n12345")
        out = recv_until(c, lambda b: b.endswith(b"one"), 3.0)    # framed, sent before the drain
        assert out.endswith(b"one"), out
        t0 = time.monotonic()
        c.sendall(b"67890GET /two HTTP/1.1\r\nHost: h\r\n\r\n")
        out = recv_until(c, lambda b: b.endswith(b"two"), 8.0)
        took = time.monotonic() - t0
    finally:
        c.close()
    assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"two"), out
    assert took < 2.0, took
