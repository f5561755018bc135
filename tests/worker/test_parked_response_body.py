"""A response body parked on its connection (issue 21: past HIGH_WATER the
rest of a body goes out from the loop, never from a loop thread waiting for
its client), in the worker's own process so the test can see the
connection and the app's objects, and so test_http_asan.py can run it under
AddressSanitizer: the framing rules still hold for a parked body (the
app's Content-Length cuts it, HEAD sends none), a parked body counts as
pending output, its iterable's close() runs once however it ends, and a
write() from a thread of the app's while the loop sends it is refused."""
from __future__ import annotations

import select
import socket
import threading

import pytest

from test_engine_connection_lifecycle import shrink_sndbuf
from test_http_parser_and_wsgi_framing import wait_for

pytestmark = pytest.mark.timeout(60)

SIZE = 4 << 20
BODY = bytes(range(256)) * (SIZE // 256)


@pytest.fixture
def serve(serve_wsgi):
    return serve_wsgi                   # conftest.py


def non_reader(addr, request: bytes) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    s.connect(addr)
    s.sendall(request)
    assert select.select([s], [], [], 10)[0], "the answer began"
    return s


def parked(loop) -> bool:
    """A connection holds more than HIGH_WATER: its iterator is parked."""
    return any(c.pending > 1 << 20 for c in list(loop.conns.values()))


def read_all(s: socket.socket) -> bytes:
    out = bytearray()
    while chunk := s.recv(1 << 20):
        out += chunk
    return bytes(out)


def test_the_apps_content_length_cuts_a_parked_list(serve):
    """A list of 4 MB under a Content-Length of 2 MB: exactly 2 MB go out,
    then the connection closes (never more than announced)."""
    def app(environ, start_response):
        shrink_sndbuf(environ)              # the body cannot hide in the kernel
        start_response("200 OK", [("Content-Length", str(SIZE // 2))])
        return [BODY[:SIZE // 4], BODY[SIZE // 4:]]

    _, addr = serve(app)
    with socket.create_connection(addr, timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        got = read_all(s)
    head, _, body = got.partition(b"\r\n\r\n")
    assert b"Content-Length: 2097152" in head and body == BODY[:SIZE // 2]


def test_head_of_a_large_list_sends_no_body_and_serves_on(serve):
    def app(environ, start_response):
        shrink_sndbuf(environ)              # the body cannot hide in the kernel
        start_response("200 OK", [])
        return [BODY]

    _, addr = serve(app)
    with socket.create_connection(addr, timeout=10) as s:
        s.sendall(b"HEAD / HTTP/1.1\r\nHost: h\r\n\r\nHEAD / HTTP/1.1\r\nHost: h\r\n\r\n")
        got = b""
        while got.count(b"\r\n\r\n") < 2:
            got += s.recv(65536)
    assert got.count(b"Content-Length: %d" % SIZE) == 2 and got.endswith(b"\r\n\r\n")


@pytest.mark.parametrize("kind", ["list", "generator"])
def test_a_parked_body_is_pending_output_and_closes_once_at_the_send_timeout(serve, kind):
    """While the client reads nothing, the parked body counts in
    conn.pending (the drain's idle close leaves it alone), a generator is
    not iterated past the output buffer's bound; body_timeout
    without progress closes the connection and runs close() once."""
    closed = []

    class Blocks:
        def __iter__(self):
            for i in range(0, SIZE, 65536):
                yield BODY[i:i + 65536]

        def close(self):
            closed.append(1)

    def app(environ, start_response):
        shrink_sndbuf(environ)              # the body cannot hide in the kernel
        start_response("200 OK", [])
        return [BODY] if kind == "list" else Blocks()

    loop, addr = serve(app, body_timeout=1.0)
    s = non_reader(addr, b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    try:
        conn = next(iter(loop.conns.values()))
        assert conn.pending > 0
        if kind == "generator":
            # parked, not iterated on: the buffer holds HIGH_WATER and one block at most
            assert wait_for(lambda: parked(loop), 10)
            assert conn.pending <= (1 << 20) + 65536 + 16
        assert wait_for(lambda: not loop.conns, 10), "closed at the send timeout"
    finally:
        s.close()
    assert closed == ([] if kind == "list" else [1])


def test_an_iterator_failing_when_resumed_closes_its_connection_once(serve):
    closed = []

    class Failing:
        def __iter__(self):
            for i in range(0, SIZE, 65536):
                if i >= 3 << 20:
                    raise KeyboardInterrupt("mid-body")
                yield BODY[i:i + 65536]

        def close(self):
            closed.append(1)

    def app(environ, start_response):
        shrink_sndbuf(environ)              # the body cannot hide in the kernel
        if environ["PATH_INFO"] == "/ok":
            start_response("200 OK", [("Content-Length", "2")])
            return [b"ok"]
        start_response("200 OK", [("Content-Length", str(SIZE))])
        return Failing()

    loop, addr = serve(app)
    s = non_reader(addr, b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    try:
        assert wait_for(lambda: parked(loop), 10)
        s.settimeout(10)
        got = read_all(s)
    finally:
        s.close()
    body = got.partition(b"\r\n\r\n")[2]
    assert 2 << 20 < len(body) < SIZE and body == BODY[:len(body)]
    assert closed == [1]
    with socket.create_connection(addr, timeout=10) as o:
        o.sendall(b"GET /ok HTTP/1.1\r\nHost: h\r\n\r\n")
        assert o.recv(4096).endswith(b"ok")


@pytest.mark.parametrize("kind", ["list", "generator"])
def test_a_client_reset_mid_body_closes_the_iterable_once(serve, kind):
    closed = []

    def gen():
        try:
            for i in range(0, SIZE, 65536):
                yield BODY[i:i + 65536]
        finally:
            closed.append(1)

    def app(environ, start_response):
        shrink_sndbuf(environ)              # the body cannot hide in the kernel
        start_response("200 OK", [])
        return [BODY] if kind == "list" else gen()

    loop, addr = serve(app)
    s = non_reader(addr, b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    s.recv(65536)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    s.close()
    assert wait_for(lambda: not loop.conns, 10)
    assert closed == ([] if kind == "list" else [1])


def test_write_from_an_app_thread_while_the_body_is_parked_is_refused(serve):
    """A thread of the app's that keeps the write callable and writes after
    the app returned, while the loop sends the returned body: its bytes
    would land inside that body; refused with a RuntimeError."""
    errors = []

    def app(environ, start_response):
        shrink_sndbuf(environ)              # the body cannot hide in the kernel
        write = start_response("200 OK", [])

        def blocks():
            for i in range(0, SIZE, 65536):
                yield BODY[i:i + 65536]

        def late():
            if wait_for(lambda: parked(environ["sockherd.loop"]), 10):
                try:
                    write(b"late")
                except RuntimeError as exc:
                    errors.append(exc)

        threading.Thread(target=late, daemon=True).start()
        return blocks()

    _, addr = serve(app, body_timeout=2.0)
    s = non_reader(addr, b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    try:
        assert wait_for(lambda: errors, 10), "the late write() was refused"
    finally:
        s.close()
    assert "being sent" in str(errors[0])


def test_a_parked_body_goes_on_from_a_sibling_while_its_thread_is_stuck(serve):
    """The rest of a parked body goes out from whichever loop thread handles
    its POLLOUT: its owner stuck in another connection's slow app, the
    relief hands the connection to the idle sibling, which sends the rest
    while the owner is still stuck."""
    release = threading.Event()

    def app(environ, start_response):
        if environ["PATH_INFO"] == "/stuck":
            release.wait(30)
            start_response("200 OK", [("Content-Length", "4")])
            return [b"done"]
        shrink_sndbuf(environ)
        start_response("200 OK", [("Content-Length", str(SIZE))])
        return (BODY[i:i + 65536] for i in range(0, SIZE, 65536))

    loop, addr = serve(app, threads=2)

    def conn_of(s: socket.socket):
        me, found = s.getsockname(), []
        assert wait_for(lambda: found.extend(c for c in list(loop.conns.values())
                                             if c.peer == me) or found, 10)
        return found[0]

    a = non_reader(addr, b"GET /big HTTP/1.1\r\nHost: h\r\n\r\n")
    others = []
    try:
        big = conn_of(a)
        assert wait_for(lambda: parked(loop), 10)
        owner = big.th
        while True:                            # a second client on the same thread
            assert len(others) < 200          # new connections favour an idle thread
            others.append(socket.create_connection(addr, timeout=10))
            if conn_of(others[-1]).th is owner:
                break
        others[-1].sendall(b"GET /stuck HTTP/1.1\r\nHost: h\r\n\r\n")
        a.settimeout(20)                       # the owner stays stuck all along
        got = bytearray()
        while b"\r\n\r\n" not in got or len(got) - got.index(b"\r\n\r\n") - 4 < SIZE:
            chunk = a.recv(1 << 20)
            assert chunk, "EOF"
            got += chunk
        assert bytes(got[got.index(b"\r\n\r\n") + 4:]) == BODY
        assert big.th is not owner
        release.set()
        assert others[-1].recv(4096).endswith(b"done")
    finally:
        release.set()
        a.close()
        for s in others:
            s.close()
