"""Output already framed goes out before the slow path waits for input: a
finished response of a pipelined request is not held back while a later
request's body is awaited, nor thrown away when that body times out (the
connection then closes after what was owed is sent). Issue 18 section 4."""
from __future__ import annotations

import os
import socket

import pytest

from test_http_parser_and_wsgi_framing import _owner_conn, wait_for
from test_response_streaming import read_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def serve(serve_wsgi):
    return serve_wsgi                   # conftest.py


def app_for(big: bytes, seen: list):
    def app(environ, start_response):
        if environ["REQUEST_METHOD"] == "POST":
            try:
                data = environ["wsgi.input"].read()
            except Exception as exc:           # the body timed out: noted, raised again
                seen.append(exc)
                raise
            start_response("200 OK", [("Content-Length", str(len(data)))])
            return [data]
        body = b"first done"
        if environ["PATH_INFO"] == "/big":
            # a small fixed send buffer (no autotuning): most of the
            # answer stays in our output buffer while the client does not read
            with socket.socket(fileno=os.dup(_owner_conn(environ).fd)) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            body = big
        start_response("200 OK", [("Content-Length", str(len(body)))])
        return [body]
    return app


def test_pipelined_response_goes_out_while_a_later_body_is_awaited(serve):
    """Defect: the response to GET /a, finished, stayed in the buffer
    while the slow path waited for the pipelined POST's body: the client
    saw nothing until the body came."""
    _, addr = serve(app_for(b"", []))
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n"
                  b"POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n012")
        first = read_until(c, b"first done", timeout=10)
        c.sendall(b"3456789")
        rest = read_until(c, b"0123456789")
    assert first.endswith(b"first done"), first
    assert rest.endswith(b"0123456789")


def test_own_response_goes_out_while_its_unread_body_is_drained(serve):
    """Defect: a response given before the app read its body stayed in the
    buffer while the slow path drained the unread rest of that body."""
    def app(environ, start_response):
        start_response("200 OK", [("Content-Length", "5")])
        return [b"early"]

    # the slow path: every body still arriving streams
    _, addr = serve(app, body_buffer=0)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n012")
        first = read_until(c, b"early", timeout=10)
        c.sendall(b"3456789")
    assert first.endswith(b"early"), first


def test_body_timeout_closes_after_what_was_owed_is_sent(serve):
    """Defect: when the pipelined POST's body timed out, conn_close_now
    threw away the GET's response still buffered (the client did not read
    yet): the client got a truncated answer. Now the connection closes
    after the owed bytes are sent (bounded by the send timeout)."""
    big = bytes(range(256)) * 3000                    # 768 000 bytes, below HIGH_WATER
    seen = []
    # the slow path: every body still arriving streams
    _, addr = serve(app_for(big, seen), body_timeout=1.0, body_buffer=0)
    with socket.socket() as c:
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # output stays ours
        c.settimeout(10)
        c.connect(addr)
        c.sendall(b"GET /big HTTP/1.1\r\nHost: h\r\n\r\n"
                  b"POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n012")
        assert wait_for(lambda: seen, timeout=20), "the body never timed out"
        out = b""
        while chunk := c.recv(65536):
            out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and body == big, (head, len(body))
