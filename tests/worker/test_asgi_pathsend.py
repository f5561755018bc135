"""The ASGI `http.response.pathsend` extension (issue 22 §2, Extensions):
advertised in every HTTP scope's extensions; the file named by the message
goes out by sendfile(2) from the loop, framed with a Content-Length of the
file's size when the app gave none; a path that cannot be sent raises in
the app (its head has not gone out: a 500, logged); a large file to a
client that reads slowly never holds the loop thread (other connections of
the same thread are served meanwhile) and the requests pipelined behind it
are answered once it is out; the file's descriptor is closed on every path
(sent, HEAD, the client gone mid-file, the client taking nothing for
body_timeout). A real Loop over a real fdcore Table on loopback, ONE loop
thread (conftest.py's serve_asgi), raw sockets."""
from __future__ import annotations

import logging
import os
import socket
import time

import pytest

from test_asgi_flow_control import wait_until  # noqa: E402
from test_wsgi import raw  # noqa: E402

pytestmark = pytest.mark.timeout(90)


def open_fds_of(path) -> list[int]:
    """This process's descriptors open on `path` (the loop runs in it)."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == str(path):
                out.append(int(name))
        except OSError:
            pass                                  # closed meanwhile (listdir's own fd)
    return out


def make_file(tmp_path, size: int, name="data.bin"):
    path = tmp_path / name
    block = bytes(range(256)) * 256
    with open(path, "wb") as f:
        for _ in range(size // len(block)):
            f.write(block)
        f.write(block[:size % len(block)])
    return path


def pathsend_app(path, headers=(), seen=None):
    """GET /file -> path by pathsend (the app gives `headers`); anything
    else -> `ok <path>`."""
    async def app(scope, receive, send):
        if seen is not None:
            seen.append(scope)
        if scope["path"] == "/file":
            await send({"type": "http.response.start", "status": 200, "headers": list(headers)})
            await send({"type": "http.response.pathsend", "path": str(path)})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok " + scope["path"].encode()})
    return app


def read_until(s: socket.socket, end: bytes) -> bytes:
    """What s sends until `end` (which must come before its EOF)."""
    buf = b""
    while end not in buf:
        chunk = s.recv(65536)
        assert chunk, f"EOF before {end!r}: {buf[-300:]!r}"
        buf += chunk
    return buf


def read_response(s: socket.socket, buf: bytes = b"") -> tuple[bytes, bytes, bytes]:
    """(head, body, rest) of one Content-Length response read from s."""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(1 << 20)
        assert chunk, f"EOF in a head: {buf[:200]!r}"
        buf += chunk
    head, _, buf = buf.partition(b"\r\n\r\n")
    length = int(next(ln.split(b":", 1)[1] for ln in head.split(b"\r\n")
                      if ln.lower().startswith(b"content-length:")))
    while len(buf) < length:
        chunk = s.recv(1 << 20)
        assert chunk, f"EOF after {len(buf)} of {length} body bytes"
        buf += chunk
    return head, buf[:length], buf[length:]


def test_pathsend_is_advertised(serve_asgi, tmp_path):
    seen = []
    _, addr = serve_asgi(pathsend_app(tmp_path, seen=seen))
    out = raw(addr, b"GET /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200 OK"), out
    assert seen[0]["extensions"]["http.response.pathsend"] == {}


def test_the_file_goes_out_with_its_length_and_the_connection_serves_on(serve_asgi, tmp_path):
    path = make_file(tmp_path, 3_000_001)
    _, addr = serve_asgi(pathsend_app(path, [(b"content-type", b"application/octet-stream")]))
    with socket.create_connection(addr, timeout=20) as s:
        for _ in range(2):                                   # one kept-alive connection
            s.sendall(b"GET /file HTTP/1.1\r\nHost: h\r\n\r\n")
            head, body, rest = read_response(s)
            assert head.startswith(b"HTTP/1.1 200 OK"), head
            assert b"content-length: 3000001" in head.lower()
            assert b"transfer-encoding" not in head.lower() and b"connection:" not in head.lower()
            assert body == path.read_bytes() and rest == b""
    wait_until(lambda: not open_fds_of(path), what="the file's fd closed")


def test_the_apps_content_length_is_what_goes_out(serve_asgi, tmp_path):
    """An app's Content-Length below the file's size: that many bytes, never
    more than announced (then the connection closes, as for a body)."""
    path = make_file(tmp_path, 100_000)
    _, addr = serve_asgi(pathsend_app(path, [(b"content-length", b"1000")]))
    out = raw(addr, b"GET /file HTTP/1.1\r\nHost: h\r\n\r\n")
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"content-length: 1000" in head.lower()
    assert body == path.read_bytes()[:1000]


def test_empty_file(serve_asgi, tmp_path):
    path = make_file(tmp_path, 0)
    _, addr = serve_asgi(pathsend_app(path))
    with socket.create_connection(addr, timeout=10) as s:
        s.sendall(b"GET /file HTTP/1.1\r\nHost: h\r\n\r\nGET /next HTTP/1.1\r\nHost: h\r\n\r\n")
        head, body, rest = read_response(s)
        assert b"content-length: 0" in head.lower() and body == b""
        _, body, _ = read_response(s, rest)
        assert body == b"ok /next"
    wait_until(lambda: not open_fds_of(path), what="the file's fd closed")


def test_head_has_the_length_and_no_body(serve_asgi, tmp_path):
    path = make_file(tmp_path, 5000)
    _, addr = serve_asgi(pathsend_app(path))
    with socket.create_connection(addr, timeout=10) as s:
        s.sendall(b"HEAD /file HTTP/1.1\r\nHost: h\r\n\r\nGET /next HTTP/1.1\r\nHost: h\r\n\r\n")
        buf = read_until(s, b"ok /next")
    first, _, second = buf.partition(b"\r\n\r\n")
    assert b"content-length: 5000" in first.lower() and second.startswith(b"HTTP/1.1 200 OK")
    wait_until(lambda: not open_fds_of(path), what="the file's fd closed")


@pytest.mark.parametrize("case", ["missing", "directory", "not str", "nul"])
def test_a_path_that_cannot_be_sent_is_a_500_logged(serve_asgi, tmp_path, caplog, case):
    target = {"missing": str(tmp_path / "nope"), "directory": str(tmp_path),
              "not str": tmp_path / "x", "nul": str(tmp_path) + "/a\0b"}[case]

    async def app(scope, receive, send):
        if scope["path"] == "/file":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.pathsend", "path": target})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    _, addr = serve_asgi(app)
    with caplog.at_level(logging.ERROR, logger="sockherd.worker"):
        out = raw(addr, b"GET /file HTTP/1.1\r\nHost: h\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 500 Internal Server Error"), out
        assert out.endswith(b"\r\n\r\nInternal Server Error\n") and b"Traceback" not in out
        # the loop thread serves on
        assert raw(addr, b"GET /ok HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
                   ).endswith(b"\r\n\r\nok")
    assert any("app failed on GET /file" in r.getMessage() for r in caplog.records), caplog.text
    assert "pathsend" in caplog.text or "nope" in caplog.text, caplog.text


@pytest.mark.parametrize("order", ["before start", "after a body part"])
def test_pathsend_out_of_order_is_the_apps_error(serve_asgi, tmp_path, caplog, order):
    path = make_file(tmp_path, 100)

    async def app(scope, receive, send):
        if order == "after a body part":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"first", "more_body": True})
        await send({"type": "http.response.pathsend", "path": str(path)})

    _, addr = serve_asgi(app)
    with caplog.at_level(logging.ERROR, logger="sockherd.worker"):
        out = raw(addr, b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    if order == "before start":
        assert out.startswith(b"HTTP/1.1 500 Internal Server Error"), out
    else:                                         # the head went out: cut
        assert out.startswith(b"HTTP/1.1 200 OK") and not out.endswith(b"0\r\n\r\n"), out
    assert "http.response.pathsend" in caplog.text, caplog.text
    assert not open_fds_of(path)


def test_a_slow_reader_never_holds_the_loop_thread(serve_asgi, tmp_path):
    """30 MB to a client that reads nothing at first: the one loop thread
    answers other connections meanwhile; the file's send waits (it did not
    go out whole into our memory: the connection's pending output stays
    small); then the client reads all of it, intact, and a request it
    pipelined behind the file is answered after it, on the same
    connection."""
    size = 30 << 20
    path = make_file(tmp_path, size)
    loop, addr = serve_asgi(pathsend_app(path))
    with socket.create_connection(addr, timeout=30) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        s.sendall(b"GET /file HTTP/1.1\r\nHost: h\r\n\r\nGET /after HTTP/1.1\r\nHost: h\r\n\r\n")
        wait_until(lambda: loop.conns, what="the connection")
        conn = next(iter(loop.conns.values()))
        # the file waits for the client (its send is owed), the thread serves others
        t0 = time.monotonic()
        for i in range(20):
            out = raw(addr, b"GET /other%d HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n" % i)
            assert out.endswith(b"ok /other%d" % i), out
        assert time.monotonic() - t0 < 10
        assert open_fds_of(path), "the file is still being sent"
        assert conn.pending < (1 << 20), conn.pending
        s.settimeout(30)
        head, body, rest = read_response(s)
        assert b"content-length: %d" % size in head.lower()
        assert body == path.read_bytes()
        _, body, _ = read_response(s, rest)
        assert body == b"ok /after"
    wait_until(lambda: not open_fds_of(path), what="the file's fd closed")


@pytest.mark.parametrize("end", ["fin", "reset"])
def test_the_client_gone_mid_file_closes_the_file(serve_asgi, tmp_path, end, caplog):
    path = make_file(tmp_path, 30 << 20)
    loop, addr = serve_asgi(pathsend_app(path))
    s = socket.create_connection(addr, timeout=20)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    s.sendall(b"GET /file HTTP/1.1\r\nHost: h\r\n\r\n")
    assert s.recv(1000).startswith(b"HTTP/1.1 200 OK")
    wait_until(lambda: open_fds_of(path), what="the file open")
    if end == "reset":
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
    s.close()
    wait_until(lambda: not open_fds_of(path), what="the file's fd closed")
    wait_until(lambda: not loop.conns, what="the connection closed")
    assert raw(addr, b"GET /ok HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").endswith(b"ok /ok")


def test_a_client_that_takes_nothing_is_cut_after_body_timeout(serve_asgi, tmp_path):
    path = make_file(tmp_path, 30 << 20)
    loop, addr = serve_asgi(pathsend_app(path), body_timeout=1.0)
    with socket.create_connection(addr, timeout=20) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        s.sendall(b"GET /file HTTP/1.1\r\nHost: h\r\n\r\n")
        wait_until(lambda: open_fds_of(path), what="the file open")
        # nothing read: the send timer closes the connection, and the file
        wait_until(lambda: not open_fds_of(path), timeout=15, what="the file's fd closed")
        wait_until(lambda: not loop.conns, what="the connection closed")


def test_a_slow_but_steady_reader_is_not_cut(serve_asgi, tmp_path):
    """A client reading at about 2 MB/s takes 6 s for 12 MB against a
    body_timeout of 2 s: each piece the kernel takes re-arms the send timer
    (only a client that takes nothing for body_timeout is cut)."""
    size = 12 << 20
    path = make_file(tmp_path, size)
    _, addr = serve_asgi(pathsend_app(path), body_timeout=2.0)
    with socket.create_connection(addr, timeout=20) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        s.sendall(b"GET /file HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        got = bytearray()
        t0 = time.monotonic()
        while chunk := s.recv(64 << 10):
            got += chunk
            time.sleep(0.03)                    # the client's pace: ~2 MB/s
    assert time.monotonic() - t0 > 3.0          # longer than body_timeout, by far
    head, _, body = bytes(got).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and body == path.read_bytes()
