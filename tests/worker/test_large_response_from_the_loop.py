"""A large response goes out from the loop, never from a loop thread waiting
for a slow client (issue 21: "a client that never reads a large response
holds its thread the same way": respond.c waited in conn_flush_wait, up to
body_timeout, and every other connection of that thread waited with it).

The body as a list of bytes, a generator of 64 KiB blocks (with a
Content-Length, and chunked) and a wsgi.file_wrapper of a regular file
(sendfile). A real master with one worker of one loop thread (`-w 1 --threads 1`) and of two
(`--threads 2`: connections shared by the group, per-request dispatch), real
sockets on loopback. The app shrinks its connection's send buffer and the
clients their receive buffers, so the 10 MB body cannot hide in the
kernel's buffers: most of it must wait in the server while the client
does not read."""
from __future__ import annotations

import hashlib
import os
import random
import re
import select
import socket
import sys
import threading
import time
import uuid

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "master"))
from test_run import module_master  # noqa: E402,F401 (fixture)

pytestmark = pytest.mark.timeout(120)

BODY_TIMEOUT = 2.0
SIZE = 10 << 20
BODY = random.Random(21).randbytes(SIZE)
DIGEST = hashlib.sha256(BODY).hexdigest()

APP = """
import os, random, socket

SIZE = {SIZE}
BODY = random.Random(21).randbytes(SIZE)
CHUNK = 64 << 10
FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "big.bin")
with open(FILE, "wb") as f:
    f.write(BODY)
closed = []                       # names of the iterables whose close() ran


def shrink_sndbuf(environ):
    port = environ["REMOTE_PORT"]
    conn = next(c for c in list(environ["sockherd.loop"].conns.values())
                if c.peer and str(c.peer[1]) == port)
    s = socket.socket(fileno=conn.fd)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
    finally:
        s.detach()


class Body:
    '''64 KiB blocks of BODY; raises `fail` once `fail_at` bytes went out.'''

    def __init__(self, name, fail=None, fail_at=0):
        self.name, self.fail, self.fail_at = name, fail, fail_at

    def __iter__(self):
        for i in range(0, len(BODY), CHUNK):
            if self.fail and i >= self.fail_at:
                raise self.fail("mid-body failure of " + self.name)
            yield BODY[i:i + CHUNK]

    def close(self):
        closed.append(self.name)


def app(environ, start_response):
    path, name = environ["PATH_INFO"], environ["QUERY_STRING"]
    if path in ("/bytes", "/gen", "/chunked", "/raise", "/exit", "/file"):
        shrink_sndbuf(environ)
    if path == "/bytes":
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return [BODY[:SIZE // 2], BODY[SIZE // 2:]]
    if path == "/file":
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return environ["wsgi.file_wrapper"](open(FILE, "rb"))
    if path == "/gen":
        start_response("200 OK", [("Content-Length", str(len(BODY)))])
        return Body(name)
    if path == "/chunked":
        start_response("200 OK", [])
        return Body(name)
    if path == "/raise":
        start_response("200 OK", [("Content-Length", str(len(BODY)))])
        return Body(name, RuntimeError, 4 << 20)
    if path == "/exit":
        start_response("200 OK", [("Content-Length", str(len(BODY)))])
        return Body(name, SystemExit, 4 << 20)
    if path == "/closed":
        body = ",".join(closed).encode()
    elif path == "/conns":
        body = str(len(environ["sockherd.loop"].conns)).encode()
    else:
        body = b"hello"
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]
""".replace("{SIZE}", str(SIZE))


@pytest.fixture(scope="module", params=["1", "2"], ids=["t1", "t2"])
def server(module_master, tmp_path_factory, request):
    """One worker of one loop thread, and of two: a group whose
    connections are shared (dispatch), where the body's POLLOUT comes
    from a registration made once (fdcore: no re-registration on a
    direction change). Each is shared by the module's tests (a master per
    test was most of their time): a test names its iterables with a tag
    of its own (tagged()) and waits for its connections to be gone, so
    none depends on another's leftovers or order."""
    site = tmp_path_factory.mktemp("bigapp")
    (site / "bigapp.py").write_text(APP)
    return module_master("bigapp:app", "-w", "1", "--threads", request.param, "--body-timeout",
                         str(BODY_TIMEOUT), ready=1, chdir=site)


def tagged(path: str) -> tuple[str, str]:
    """(path, the iterable's name): a name of this test's own on the
    shared server ("/gen?never" -> "/gen?never-1a2b3c4d", its name)."""
    if "?" not in path:
        return path, ""
    path = f"{path}-{uuid.uuid4().hex[:8]}"
    return path, path.split("?", 1)[1]


class Reader:
    """HTTP/1.1 responses off one socket, in order (pipelining); `pace`:
    seconds between reads of `step` bytes (a slow, steady reader)."""

    def __init__(self, sock: socket.socket, step: int = 65536, pace: float = 0.0):
        self.sock, self.step, self.pace = sock, step, pace
        self.buf = bytearray()

    def _more(self) -> None:
        if self.pace:
            time.sleep(self.pace)            # the reader's own pace, not a wait on the server
        chunk = self.sock.recv(self.step)
        if not chunk:
            raise EOFError(f"EOF with {len(self.buf)} bytes unread")
        self.buf += chunk

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._more()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._more()
        return self._take(self.buf.index(b"\r\n") + 2)

    def response(self) -> tuple[bytes, bytes]:
        """(head, body): a Content-Length body or a chunked one."""
        while b"\r\n\r\n" not in self.buf:
            self._more()
        head = self._take(self.buf.index(b"\r\n\r\n") + 4)
        fields = {k.strip().lower(): v.strip() for k, _, v in
                  (line.partition(b":") for line in head.split(b"\r\n")[1:] if line)}
        if b"content-length" in fields:
            return head, self._take(int(fields[b"content-length"]))
        parts = []
        while size := int(self._line().strip(), 16):
            parts.append(self._take(size))
            assert self._take(2) == b"\r\n"
        assert self._take(2) == b"\r\n"
        return head, b"".join(parts)


def non_reader(port: int, path: str) -> socket.socket:
    """A client that asks for path and never reads: returned once the
    answer has begun to arrive (its first bytes wait in its buffer)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    assert select.select([s], [], [], 10)[0], "the answer began"
    return s


def get(port: int, path: str = "/", timeout: float = 10.0) -> bytes:
    """One request on a new connection: its body. Raises socket.timeout
    past `timeout` seconds."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
        return Reader(s).response()[1]


def wait_for(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := fn()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def closed_names(port: int) -> list[str]:
    return [n for n in get(port, "/closed").decode().split(",") if n]


def closed_once(port: int, name: str) -> bool:
    """The iterable `name` (tagged()) was closed, once (the list holds the
    other tests' names too, each its own)."""
    return closed_names(port).count(name) == 1


@pytest.mark.parametrize("path", ["/bytes", "/gen?never", "/file"])
def test_a_client_that_never_reads_does_not_hold_the_loop_thread(server, path):
    """Issue 21: with the worker's only loop thread waiting for a client
    that does not read a 10 MB answer, another client's GET / waited
    body_timeout. Now it is answered at once; the non-reader is closed once
    body_timeout passed without progress, and a generator's close() runs
    once."""
    path, name = tagged(path)
    idle = non_reader(server.port, path)
    began = time.monotonic()
    try:
        # today: socket.timeout, the loop thread waits in conn_flush_wait
        assert get(server.port, "/", timeout=1.0) == b"hello"
        wait_for(lambda: get(server.port, "/conns") == b"1", BODY_TIMEOUT + 8,
                 "the non-reader's connection to close")
        assert time.monotonic() - began >= BODY_TIMEOUT - 0.5, "closed before body_timeout"
    finally:
        idle.close()
    if path.startswith("/gen"):
        assert closed_once(server.port, name)


@pytest.mark.parametrize("path", ["/bytes", "/gen?slow", "/chunked?slow", "/file"])
def test_a_slow_steady_reader_gets_every_byte_while_others_are_served(server, path):
    """A client reading 10 MB at about 2 MB/s, for longer than body_timeout
    but never idle that long, gets the body intact; meanwhile other clients
    are answered promptly (the loop thread does not wait for the reader)."""
    path, name = tagged(path)
    got = {}
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.settimeout(20)
    sock.connect(("127.0.0.1", server.port))

    def read():
        try:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            got["body"] = Reader(sock, step=32768, pace=0.015).response()[1]
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            got["error"] = exc

    reader = threading.Thread(target=read)
    reader.start()
    served = 0
    try:
        assert select.select([sock], [], [], 10)[0], "the answer began"
        while reader.is_alive():
            assert get(server.port, "/", timeout=1.0) == b"hello"
            served += 1
            reader.join(0.1)
    finally:
        reader.join(30)
        sock.close()
    assert "error" not in got, got.get("error")
    assert len(got["body"]) == SIZE and hashlib.sha256(got["body"]).hexdigest() == DIGEST
    assert served >= 3, served
    if "?" in path:
        assert closed_once(server.port, name)


@pytest.mark.parametrize("path", ["/bytes", "/gen?first", "/file"])
def test_pipelined_requests_wait_for_the_large_response_and_keep_alive_holds(server, path):
    """A request pipelined behind the 10 MB answer is answered after all of
    it, in order, on the same kept-alive connection, which serves on."""
    path, name = tagged(path)
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n"
                  "GET /after HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        r = Reader(s, step=262144)
        head, body = r.response()
        assert head.startswith(b"HTTP/1.1 200") and b"connection: close" not in head.lower()
        assert len(body) == SIZE and hashlib.sha256(body).hexdigest() == DIGEST
        assert r.response()[1] == b"hello"
        s.sendall(b"GET /again HTTP/1.1\r\nHost: t\r\n\r\n")
        assert r.response()[1] == b"hello"
    if "?" in path:
        assert closed_once(server.port, name)


def test_close_runs_once_when_the_client_goes_away_mid_body(server):
    """A client that reads 1 MB of the streamed body and resets: the
    iterable's close() runs once (PEP 3333) and the connection is gone."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.settimeout(20)
    s.connect(("127.0.0.1", server.port))
    path, name = tagged("/gen?gone")
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    r = Reader(s)
    while len(r.buf) < 1 << 20:
        r._more()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    s.close()                                  # a reset, mid-body
    wait_for(lambda: get(server.port, "/conns") == b"1", 10, "the connection to close")
    assert closed_once(server.port, name)


@pytest.mark.parametrize("path", ["/raise?boom", "/exit?boom"])
def test_an_iterator_failing_after_its_suspension_closes_only_its_connection(server, path):
    """The app's iterator raises (an Exception, and SystemExit: any
    BaseException) after 4 MB, long after it was parked and resumed: that
    connection closes after what was sent, the failure is logged, close()
    runs once and the loop thread serves on."""
    path, name = tagged(path)
    failed = rf"app failed on GET {path.split('?')[0]}"
    logged = len(re.findall(failed, server.text()))
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.settimeout(20)
    s.connect(("127.0.0.1", server.port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    r = Reader(s, step=32768, pace=0.002)
    with pytest.raises(EOFError):
        r.response()
    s.close()
    body = bytes(r.buf)                         # the head was taken, the body cut short
    assert 3 << 20 <= len(body) < SIZE and body == BODY[:len(body)]
    server.wait_log(failed, count=logged + 1)
    assert get(server.port, "/", timeout=5.0) == b"hello"
    assert closed_once(server.port, name)
    # the same worker: not replaced (a loop thread that ended would have it replaced)
    assert len(re.findall(r"worker \d+\.\d+: ready", server.text())) == 1
    assert server.proc.poll() is None
