"""A request body up to body_buffer is read in the event loop before the
app runs (issue 21, "Nothing waits on a slow client inside the app").

Finding reproduced: a request whose body had not fully arrived went to
wsgi.py's slow path at once, and the app ran in the loop thread, its
wsgi.input waiting on the socket up to body_timeout: four slow uploads
delayed a plain `GET /` by 4.5 s on a 2 x 2 server, and on `-w 1 --threads 1`
until the uploads ended. Real master and worker, real sockets.
"""
from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "master"))

from test_run import master, wait_for  # noqa: E402,F401 - master: the fixture

pytestmark = pytest.mark.timeout(120)

# The app: /echo reads wsgi.input whole; /pieces reads it 16 KiB at a
# time, and touches a marker file after its first piece (an app streaming
# its body runs before the body is all here: the marker shows it).
# Both answer with wsgi.input's type, the length and a digest.
BODYAPP = '''
import hashlib, os

MARK = {mark!r}

def app(environ, start_response):
    inp = environ["wsgi.input"]
    path = environ["PATH_INFO"]
    h, n, pieces = hashlib.sha256(), 0, 0
    if path == "/echo":
        data = inp.read()
        h.update(data)
        n, pieces = len(data), 1
    elif path == "/pieces":
        while chunk := inp.read(16384):
            if not pieces:
                open(MARK, "w").close()
            h.update(chunk)
            n += len(chunk)
            pieces += 1
    body = ("%s %d %d %s" % (type(inp).__name__, n, pieces, h.hexdigest())).encode()
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]
'''


@pytest.fixture
def bodyapp(tmp_path: Path) -> Path:
    """The marker file /pieces touches."""
    mark = tmp_path / "first-piece-read"
    (tmp_path / "bodyapp.py").write_text(BODYAPP.format(mark=str(mark)))
    return mark


def start(master, *args: str):
    # one worker, one thread: whatever pins that thread pins the server
    return master("bodyapp:app", "-w", "1", "--threads", "1", *args, ready=1)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def rx_queue(server_port: int, client_port: int) -> int | None:
    """Bytes the server's end of our connection holds unread (its kernel
    receive queue, /proc/net/tcp), None if not found."""
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                rows = f.readlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            cols = row.split()
            local, remote = cols[1], cols[2]
            if int(local.rsplit(":", 1)[1], 16) == server_port and \
                    int(remote.rsplit(":", 1)[1], 16) == client_port:
                return int(cols[4].split(":")[1], 16)
    return None


def read_by_server(port: int, socks, timeout: float) -> bool:
    """Whether the server read everything sent on socks (their queues on
    its side empty) within timeout: what was sent was then parsed, not
    only delivered. False at the deadline (the caller decides)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(rx_queue(port, s.getsockname()[1]) == 0 for s in socks):
            return True
        time.sleep(0.01)
    return False


def response(sock: socket.socket, timeout: float = 10.0) -> tuple[bytes, bytes]:
    """One response (Content-Length framed): (head, body)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response head: {data!r}"
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed mid-body"
        rest += chunk
    return head, rest[:length]


def upload_head(path: str, length: int | None, *extra: str) -> bytes:
    framing = "Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}"
    lines = [f"POST {path} HTTP/1.1", "Host: t", framing, *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def test_slow_uploads_do_not_hold_the_thread_from_a_plain_get(master, bodyapp):
    """Four uploads whose bodies have not arrived, on a one-thread worker:
    a plain GET is answered at once while they are still incomplete, and
    each upload is answered with its whole body once it is all sent."""
    m = start(master, "--body-timeout", "20")
    body = os.urandom(1000)
    uploads = [m.connect() for _ in range(4)]
    try:
        for up in uploads:
            up.sendall(upload_head("/echo", len(body)) + body[:10])
        # the server has the heads and first bytes (else the GET could be
        # served before them); today only the first is read: go on anyway
        read_by_server(m.port, uploads, timeout=3)
        started = time.monotonic()
        with m.connect() as get:
            get.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            try:
                head, _ = response(get, timeout=3)
            except TimeoutError:
                pytest.fail("GET not answered within 3 s: the slow uploads hold the thread")
        took = time.monotonic() - started
        assert head.startswith(b"HTTP/1.1 200 "), head
        assert took < 2.0, f"GET took {took:.2f} s behind the slow uploads"
        for up in uploads:
            up.sendall(body[10:])
        for up in uploads:
            head, answer = response(up)
            assert head.startswith(b"HTTP/1.1 200 ") and \
                answer == f"BytesIO 1000 1 {digest(body)}".encode(), answer
    finally:
        for up in uploads:
            up.close()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_the_app_sees_the_whole_body_that_arrived_in_pieces(master, bodyapp, chunked):
    """The body is sent in three pieces, each read by the server before
    the next goes: the app runs once, with all of it in a BytesIO."""
    m = start(master)
    body = os.urandom(3 * 20000)
    pieces = [body[i:i + 20000] for i in range(0, len(body), 20000)]
    with m.connect() as c:
        if chunked:
            wire = [upload_head("/pieces", None) + chunk(pieces[0]),
                    chunk(pieces[1]), chunk(pieces[2]) + b"0\r\n\r\n"]
        else:
            wire = [upload_head("/pieces", len(body)) + pieces[0], pieces[1], pieces[2]]
        for part in wire:
            c.sendall(part)
            assert read_by_server(m.port, [c], timeout=10)
            if part is not wire[-1] and bodyapp.exists():
                pytest.fail("the app ran before its body was all here")
        head, answer = response(c)
    assert answer == f"BytesIO {len(body)} 4 {digest(body)}".encode(), answer


def test_expect_100_continue_is_answered_by_the_loop_and_the_body_buffered(master, bodyapp):
    """The loop says 100 Continue when it starts waiting for the body (as
    nginx): the app is not running yet, the body then goes to it whole."""
    m = start(master)
    body = os.urandom(5000)
    with m.connect() as c:
        c.sendall(upload_head("/pieces", len(body), "Expect: 100-continue"))
        c.settimeout(10)
        got = b""
        while b"\r\n\r\n" not in got:
            more = c.recv(100)
            assert more, got
            got += more
        assert got == b"HTTP/1.1 100 Continue\r\n\r\n"
        assert not bodyapp.exists()
        c.sendall(body)
        head, answer = response(c)
    assert answer == f"BytesIO 5000 1 {digest(body)}".encode(), answer


def test_an_http10_client_is_not_sent_100_continue(master, bodyapp):
    """RFC 9110 10.1.1: a 1.0 client's expectation is ignored, here too."""
    m = start(master)
    with m.connect() as c:
        c.sendall(b"POST /echo HTTP/1.0\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        assert read_by_server(m.port, [c], timeout=10)
        c.sendall(b"abcd")
        head, answer = response(c)
    assert head.startswith(b"HTTP/1.1 200 ") and answer.startswith(b"BytesIO 4 1 "), answer


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_larger_than_the_buffer_streams_to_the_app(master, bodyapp, chunked):
    """Past body_buffer the app reads the body as it comes (it is never
    held whole): the app has read its first piece while most of the body
    is not sent yet. Content-Length: decided at the head; chunked: once
    what is buffered reaches the buffer."""
    m = start(master, "--body-buffer", "65536")
    body = os.urandom(200000)
    with m.connect() as c:
        if chunked:
            # 40 KB (held: below the buffer), then 40 KB more (past it)
            c.sendall(upload_head("/pieces", None) + chunk(body[:40000]))
            assert read_by_server(m.port, [c], timeout=10)
            assert not bodyapp.exists(), "a chunked body below the buffer went to the app"
            c.sendall(chunk(body[40000:80000]))
        else:
            c.sendall(upload_head("/pieces", len(body)) + body[:80000])
        wait_for(bodyapp.exists, 10, "the app reading its first piece of a streamed body")
        if chunked:
            c.sendall(chunk(body[80000:]) + b"0\r\n\r\n")
        else:
            c.sendall(body[80000:])
        head, answer = response(c)
    kind, n, pieces, sha = answer.decode().split()
    assert (kind, int(n), sha) == ("Input", len(body), digest(body)), answer
    assert int(pieces) > 1


def test_a_body_that_stalls_while_buffered_gets_408_and_the_connection_closes(master, bodyapp):
    """The body timer runs while the loop reads the body: past
    body_timeout (nothing more sent) a 408, counted and logged as a
    refusal, and the connection closed; the app never ran."""
    m = start(master, "--body-timeout", "1")
    with m.connect() as c:
        c.sendall(upload_head("/pieces", 1000) + b"x" * 10)
        started = time.monotonic()
        c.settimeout(10)
        got = b""
        while more := c.recv(65536):
            got += more
        took = time.monotonic() - started
    assert got.startswith(b"HTTP/1.1 408 "), got
    assert b"the request body did not arrive in time" in got
    assert 0.8 < took < 6, took
    m.wait_log(r"refused 408 from 127\.0\.0\.1:\d+: the request body did not arrive in time")
    assert not bodyapp.exists()


def test_the_body_limit_refuses_before_anything_is_buffered(master, bodyapp):
    """limit_request_body: a declared length past it is a 413 at once,
    without waiting for (or buffering) the body."""
    m = start(master, "--limit-request-body", "100")
    with m.connect() as c:
        c.sendall(upload_head("/echo", 500) + b"x" * 10)
        head, _ = response(c, timeout=5)
    assert head.startswith(b"HTTP/1.1 413 "), head


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_negative_body_buffer_is_refused_with_a_clear_error(tmp_path, how):
    args = [sys.executable, "-m", "sockherd.master", "check"]
    env = {**os.environ, "SOCKHERD_RUNTIME_DIR": str(tmp_path / "run")}
    if how == "flag":
        args += ["--body-buffer", "-1"]
    else:
        env["SOCKHERD_BODY_BUFFER"] = "-1"
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    where = "command line: --body-buffer" if how == "flag" else \
        "environment: SOCKHERD_BODY_BUFFER"
    assert f"bad setting: {where} = '-1': expected `int` >= 0" in out.stderr, out.stderr
