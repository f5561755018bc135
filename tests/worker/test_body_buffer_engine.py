"""The engine's side of a request body read in the loop before the app
runs (issue 21, body_buffer): the held request's edges, on an in-process
worker (conftest.py's serve_wsgi, real sockets), so test_http_asan.py runs
them against the sanitizer build too. The behaviour end to end, on a real
master, is test_body_buffered_in_loop.py's."""
from __future__ import annotations

import select
import socket
import threading

import pytest

from test_http_parser_and_wsgi_framing import wait_for

pytestmark = pytest.mark.timeout(60)


def echo(environ, start_response):
    body = environ["wsgi.input"].read()
    out = b"%s %d:" % (type(environ["wsgi.input"]).__name__.encode(), len(body)) + body
    start_response("200 OK", [("Content-Length", str(len(out)))])
    return [out]


def counted():
    """(echo that notes each call, its calls)"""
    calls = []

    def app(environ, start_response):
        calls.append(1)
        return echo(environ, start_response)

    return app, calls


def held(loop) -> bool:
    return any(getattr(c, "buffering", False) for c in list(loop.conns.values()))


def read_all(c: socket.socket) -> bytes:
    out = b""
    while chunk := c.recv(65536):
        out += chunk
    return out


def test_a_held_request_is_served_whole_and_the_next_one_follows(serve_wsgi):
    """Held until its body is whole, then answered, then the pipelined
    request behind it, in order."""
    loop, addr = serve_wsgi(echo)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 6\r\n\r\nabc")
        wait_for(lambda: held(loop))
        c.sendall(b"def" b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        out = read_all(c)
    assert out.count(b"HTTP/1.1 200 OK") == 2, out
    assert out.index(b"BytesIO 6:abcdef") < out.index(b"_NoBody 0:"), out


def test_a_bad_chunk_while_held_is_a_400_and_the_app_never_runs(serve_wsgi):
    app, calls = counted()
    loop, addr = serve_wsgi(app)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        wait_for(lambda: held(loop))
        c.sendall(b"zz\r\n")
        out = read_all(c)
    assert out.startswith(b"HTTP/1.1 400 "), out
    assert not calls


def test_a_client_that_closes_mid_body_is_closed_without_an_answer(serve_wsgi):
    app, calls = counted()
    loop, addr = serve_wsgi(app)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\nabc")
        wait_for(lambda: held(loop))
        c.shutdown(socket.SHUT_WR)
        out = read_all(c)
    assert out == b"" and not calls
    wait_for(lambda: not loop.conns)


def test_a_body_timeout_after_owed_output_sends_it_then_the_408(serve_wsgi):
    """A pipelined GET's large response is still owed when the held POST's
    body times out: the 408 goes out after it, then the close."""
    big = bytes(range(256)) * 3000

    def app(environ, start_response):
        start_response("200 OK", [("Content-Length", str(len(big)))])
        return [big]

    loop, addr = serve_wsgi(app, body_timeout=1.0)
    with socket.socket() as c:
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.settimeout(15)
        c.connect(addr)
        c.sendall(b"GET /big HTTP/1.1\r\nHost: h\r\n\r\n"
                  b"POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n012")
        wait_for(lambda: loop.engine.refused["body_timeout"] == 1, timeout=20)
        out = read_all(c)
    head, _, rest = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and rest[:len(big)] == big
    assert rest[len(big):].startswith(b"HTTP/1.1 408 "), rest[len(big):][:200]


def test_a_held_request_is_not_idle_for_the_drain(serve_wsgi):
    """The drain closes connections idle for its grace: one whose body is
    arriving is mid-request, answered (Connection: close) once it is whole."""
    loop, addr = serve_wsgi(echo, threads=2)
    c = socket.create_connection(addr, timeout=10)
    try:
        c.sendall(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n12345")
        wait_for(lambda: held(loop))
        loop.drain(0.1)
        # past the grace several times over: still open (no EOF to read)
        assert not select.select([c], [], [], 0.6)[0], c.recv(100)
        c.sendall(b"67890")
        out = read_all(c)
    finally:
        c.close()
    assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"BytesIO 10:1234567890"), out
    assert b"\r\nConnection: close\r\n" in out, out
    assert loop.drained.wait(5)


def test_a_chunked_body_reaching_the_buffer_goes_to_the_app_streaming(serve_wsgi):
    """What was buffered is the streaming wsgi.input's first bytes."""
    started = threading.Event()

    def app(environ, start_response):
        started.set()
        return echo(environ, start_response)

    loop, addr = serve_wsgi(app, body_buffer=1000)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"200\r\n" + b"a" * 512 + b"\r\n")
        wait_for(lambda: held(loop))
        assert not started.is_set()
        c.sendall(b"200\r\n" + b"b" * 512 + b"\r\n")
        assert started.wait(10)
        c.sendall(b"3\r\nccc\r\n0\r\n\r\n")
        head, _, body = c.recv(65536).partition(b"\r\n\r\n")
        while len(body) < len(b"Input 1027:") + 1027:
            body += c.recv(65536)
    assert body == b"Input 1027:" + b"a" * 512 + b"b" * 512 + b"ccc", body[:40]


def test_answers_owed_go_before_the_slow_path_waits_on_its_client(serve_wsgi):
    """Answers queued on the thread's owed list (h1_conn.c: owe, answers
    ending < 0.5 ms apart) are written before a streamed upload (past
    body_buffer: wsgi.py's slow path) makes the loop thread wait on its
    client: they waited for that stranger's upload before (review; the
    end-to-end test, on a real master: test_owed_answers_wsgi.py)."""
    busy, go = threading.Event(), threading.Event()

    def app(environ, start_response):
        if environ["PATH_INFO"] == "/busy":
            busy.set()
            go.wait(10)                          # the batch below arrives meanwhile
        body = str(len(environ["wsgi.input"].read())).encode()
        start_response("200 OK", [("Content-Length", str(len(body)))])
        return [body]

    loop, addr = serve_wsgi(app, body_buffer=1024)
    conns = [socket.create_connection(addr, timeout=10) for _ in range(6)]
    b, up, fast = conns[0], conns[1], conns[2:]
    try:
        for c in conns:                          # accepted and idle (not in the batch below)
            c.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
            assert c.recv(65536).endswith(b"\r\n\r\n0")
        b.sendall(b"GET /busy HTTP/1.1\r\nHost: h\r\n\r\n")
        wait_for(busy.is_set)
        for c in fast:                           # one poll's batch: these, then the upload
            c.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        up.sendall(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100)
        go.set()
        for c in fast:                           # the upload's rest is not sent yet
            c.settimeout(5)
            assert select.select([c], [], [], 5)[0], "an answer waited for another's upload"
            assert c.recv(65536).endswith(b"\r\n\r\n0")
        up.sendall(b"x" * (100000 - 100))
        assert up.recv(65536).endswith(b"\r\n\r\n100000")
    finally:
        for c in conns:
            c.close()
