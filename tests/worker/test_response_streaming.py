"""A streamed response goes out block by block as the app gives it (PEP
3333: the server must not delay the transmission of any block), while a
body given whole (a list, a single-item iterable) keeps its
Content-Length and its one write for head and body. Issue 18 section 4."""
from __future__ import annotations

import socket
import threading

import pytest

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def serve(serve_wsgi):
    return serve_wsgi                   # conftest.py


def read_until(sock: socket.socket, marker: bytes, timeout: float = 10.0) -> bytes:
    """Bytes from sock until marker was seen (or the peer closed), each
    recv bounded by timeout: a block held back fails the test by timing out."""
    sock.settimeout(timeout)
    out = b""
    while marker not in out:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            return out
        if not chunk:
            return out
        out += chunk
    return out


def first_block_then_rest(addr, release) -> tuple[bytes, bytes]:
    """GET /events: reads until the app's first block (`data: first`) and
    asserts the second is not there yet (the app waits on release), then
    sets release and reads to the chunked end. Returns (first, rest)."""
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"GET /events HTTP/1.1\r\nHost: h\r\n\r\n")
        first = read_until(c, b"data: first", timeout=10)
        got_first_alone = b"data: first" in first and b"data: second" not in first
        release.set()
        rest = read_until(c, b"0\r\n\r\n")
    assert got_first_alone, first
    return first, rest


def test_first_streamed_block_is_sent_before_the_second_is_given(serve):
    """Defect: write_chunk() held the first block until the app yielded a
    second one ('maybe the whole body'), so an SSE-style generator's first
    event reached the client only with the second: here the app waits for
    the test to have read the first block before it yields the second."""
    release = threading.Event()

    def sse(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/event-stream")])
        yield b"data: first\n\n"
        release.wait(20)
        yield b"data: second\n\n"

    _, addr = serve(sse)
    first, rest = first_block_then_rest(addr, release)
    assert b"Transfer-Encoding: chunked" in first
    assert b"data: second" in rest and rest.endswith(b"0\r\n\r\n")


def test_write_callable_block_is_sent_at_once(serve):
    """Defect: the first write() of an app was held like the first yielded
    block, until the app wrote again or returned."""
    release = threading.Event()

    def app(environ, start_response):
        write = start_response("200 OK", [("Content-Type", "text/plain")])
        write(b"early")
        release.wait(20)
        return [b"late"]

    _, addr = serve(app)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        first = read_until(c, b"early")
        release.set()
        rest = read_until(c, b"0\r\n\r\n")
    assert b"early" in first and b"late" not in first
    assert b"late" in rest


@pytest.mark.parametrize("body", [lambda: [b"whole"], lambda: iter([b"whole"])],
                         ids=["list", "exhausted-iterator"])
def test_body_given_whole_keeps_content_length(serve, body):
    """The fast path stays: a list of bytes, or an iterator that says it is
    exhausted after its first item (a list's iterator), is a body given
    whole: Content-Length, no chunking (head and body framed together)."""
    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return body()

    _, addr = serve(app)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        out = read_until(c, b"\x00never")
    assert b"Content-Length: 5\r\n" in out and b"chunked" not in out
    assert out.endswith(b"\r\n\r\nwhole")


def streamed(environ, start_response):
    """A streamed resource as werkzeug serves it: a generator for GET, and
    for HEAD no body at all (Response.get_app_iter gives ())."""
    start_response("200 OK", [("Content-Type", "text/plain")])
    if environ["REQUEST_METHOD"] == "HEAD":
        return ()
    return (block for block in (b"a", b"b"))


def streamed_always(environ, start_response):
    """The same resource as a generator for HEAD too (an app that does not
    special-case HEAD; found by the acceptance audit of issue 18: only the
    werkzeug shape, an empty tuple for HEAD, was pinned)."""
    start_response("200 OK", [("Content-Type", "text/plain")])
    return (block for block in (b"a", b"b"))


@pytest.mark.parametrize("app", [streamed, streamed_always], ids=["werkzeug", "generator"])
@pytest.mark.parametrize("method", [b"HEAD", b"GET"])
def test_head_of_a_streamed_response_has_no_content_length(serve, method, app):
    """Defect: HEAD on a generator response said Content-Length: 0 while
    GET of the same resource is chunked: the length is unknown, so none."""
    _, addr = serve(app)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(method + b" / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        out = read_until(c, b"\x00never")
    head = out.split(b"\r\n\r\n", 1)[0]
    assert out.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Length" not in head, out
    if method == b"GET":
        assert b"Transfer-Encoding: chunked" in head
    else:
        assert out.endswith(b"\r\n\r\n"), out          # no body bytes after the head


def test_flask_stream_with_context_first_block_is_not_held(serve):
    """Defect: Flask's stream_with_context response (werkzeug's
    ClosingIterator over a generator) had its first block held like any
    first block, until the view yielded the second."""
    flask = pytest.importorskip("flask")
    app = flask.Flask(__name__)
    release = threading.Event()

    @app.route("/events")
    def events():
        def gen():
            yield "data: first\n\n"
            release.wait(20)
            yield "data: second\n\n"
        return flask.Response(flask.stream_with_context(gen()), mimetype="text/event-stream")

    _, addr = serve(app)
    first, rest = first_block_then_rest(addr, release)
    assert b"data: second" in rest
