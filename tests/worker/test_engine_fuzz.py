"""The native engine fuzzed over real sockets (the HTTP issue, section 6):
generated valid and invalid requests, pipelined, split at random byte
boundaries, and raw garbage, sent to a real in-process server (a Loop over
the engine, one thread and two). Every connection must be answered or
closed: after the client half-closes, the server ends the connection
within a deadline, every response it sent is a well-formed HTTP/1.1 one,
valid requests get their answers in order, and nothing is left open or
broken (loop.conns empty, no loop error). test_http_asan.py runs this file
against the AddressSanitizer + UBSan build too."""
from __future__ import annotations

import re
import select
import socket
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from sockherd.fdcore import Table
from sockherd.worker.loop import Loop
from sockherd.worker.wsgi import make_handler
from test_engine_connection_lifecycle import closed_within
from test_http_parser import BAD, STREAM

pytestmark = pytest.mark.timeout(300)

STATUS = re.compile(rb"HTTP/1\.1 [1-5][0-9][0-9] [^\r\n]*\r\n")


def echo(environ, start_response):
    """Answers the method, path and body (read through wsgi.input, in
    pieces, so that the streaming path is taken for a body in flight)."""
    inp, parts = environ["wsgi.input"], []
    while chunk := inp.read(7):
        parts.append(chunk)
    body = b"%s %s %s" % (environ["REQUEST_METHOD"].encode(), environ["PATH_INFO"].encode("latin-1"),
                          b"".join(parts))
    start_response("200 OK", [("Content-Type", "text/plain")])
    if environ["QUERY_STRING"] == "gen":
        return iter([body[:3], body[3:]])              # chunked
    return [body]


@pytest.fixture(scope="module", params=[1, 2], ids=["t1", "t2"])
def server(request):
    table = Table(request.param, 1)
    loop = Loop(table, make_handler(echo, {"threads": request.param, "header_timeout": 5.0,
                                           "body_timeout": 5.0}))
    srv = socket.create_server(("127.0.0.1", 0), backlog=128)
    addr = srv.getsockname()
    loop.add_listener(srv)
    loop.start()
    yield loop, addr
    deadline = time.monotonic() + 10
    while loop.conns and time.monotonic() < deadline:
        select.select([], [], [], 0.01)
    left = len(loop.conns)
    loop.stop()
    table.close()
    assert not loop.errors, loop.errors
    assert left == 0, f"{left} connection(s) left open after the fuzzing"


def exchange(addr, data: bytes, cuts: list[int]) -> bytes:
    """Sends data in pieces (each given a moment to arrive alone), half-
    closes, and returns everything the server sent until it closed."""
    with socket.create_connection(addr, timeout=10) as c:
        return send_pieces(c, data, cuts)


def send_pieces(c: socket.socket, data: bytes, cuts: list[int]) -> bytes:
    """exchange() on a connected socket c."""
    pieces, last = [], 0
    for cut in sorted(set(x for x in cuts if 0 < x < len(data))) + [len(data)]:
        pieces.append(data[last:cut])
        last = cut
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for piece in pieces:
        try:
            c.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            break                                   # refused and closed early: fine
        select.select([c], [], [], 0.002)           # a poll with a deadline, not a sleep
    try:
        c.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    closed, out = closed_within(c, 10)
    assert closed, f"the server neither answered nor closed; got {out[:200]!r}"
    return out


def responses(out: bytes) -> list[tuple[int, bytes]]:
    """The responses in out, (status, body), checking each is well formed."""
    found = []
    while out:
        m = STATUS.match(out)
        assert m, f"not an HTTP/1.1 response: {out[:200]!r}"
        head, sep, rest = out.partition(b"\r\n\r\n")
        assert sep, f"a response head cut short: {out[:200]!r}"
        status = int(head[9:12])
        fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
        if b"Content-Length" in fields:
            n = int(fields[b"Content-Length"])
            body, out = rest[:n], rest[n:]
            assert len(body) == n, "a body shorter than its Content-Length"
        elif fields.get(b"Transfer-Encoding") == b"chunked":
            body = b""
            while True:
                size, _, rest = rest.partition(b"\r\n")
                n = int(size, 16)
                if n == 0:
                    assert rest.startswith(b"\r\n")
                    out = rest[2:]
                    break
                body, rest = body + rest[:n], rest[n + 2:]
        else:
            body, out = rest, b""                       # closed after the body
        found.append((status, body))
    return found


# ---- generated requests --------------------------------------------------------------------

token = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-", min_size=1,
                max_size=12)
path = st.text("abcdefghijklmnopqrstuvwxyz0123456789/-._~%", max_size=30).map(lambda p: "/" + p)
value = st.text("abcdefghijklmnopqrstuvwxyz0123456789 ;=,/.-", max_size=40).map(str.strip)


@st.composite
def valid_request(draw) -> tuple[bytes, bytes]:
    """(request bytes, the body the app will see)."""
    method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "OPTIONS"]))
    query = draw(st.sampled_from(["", "?gen", "?a=1&b=2"]))
    headers = [f"Host: {draw(token)}"]
    for name, val in draw(st.lists(st.tuples(token, value), max_size=6)):
        if name.lower() not in ("host", "content-length", "transfer-encoding", "connection",
                                "expect", "upgrade"):
            headers.append(f"{name}: {val}")
    body = draw(st.binary(max_size=300)) if method in ("POST", "PUT") else b""
    p = draw(path)
    raw = f"{method} {p}{query} HTTP/1.1\r\n" + "".join(h + "\r\n" for h in headers)
    if body and draw(st.booleans()):
        sizes = draw(st.lists(st.integers(1, 50), max_size=5))
        chunks, rest = [], body
        for n in sizes:
            chunks.append(rest[:n])
            rest = rest[n:]
        chunks = [c for c in chunks + [rest] if c]
        framed = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
        raw += "Transfer-Encoding: chunked\r\n\r\n"
        return raw.encode() + framed, (method, p, body)
    raw += f"Content-Length: {len(body)}\r\n\r\n"
    return raw.encode() + body, (method, p, body)


def expected(method: str, p: str, body: bytes) -> bytes:
    import urllib.parse
    return b"%s %s %s" % (method.encode(), urllib.parse.unquote_to_bytes(p), body)


cuts = st.lists(st.integers(min_value=0, max_value=4000), max_size=8)
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(reqs=st.lists(valid_request(), min_size=1, max_size=4), cut=cuts)
def test_valid_requests_split_anywhere_are_answered_in_order(server, reqs, cut):
    _, addr = server
    got = responses(exchange(addr, b"".join(r for r, _ in reqs), cut))
    assert [s for s, _ in got] == [200] * len(reqs)
    assert [b for _, b in got] == [expected(*e) for _, e in reqs]


@FUZZ
@given(good=st.lists(valid_request(), max_size=2), bad=st.sampled_from(sorted(BAD)), cut=cuts)
def test_a_bad_request_after_good_ones_is_refused_and_closes(server, good, bad, cut):
    _, addr = server
    got = responses(exchange(addr, b"".join(r for r, _ in good) + BAD[bad], cut))
    # the good ones answered in order, then at most one refusal
    assert [s for s, _ in got[:len(good)]] == [200] * len(good)
    assert all(400 <= s < 600 for s, _ in got[len(good):]) and len(got) <= len(good) + 1


@FUZZ
@given(data=st.binary(max_size=600), cut=cuts)
def test_garbage_is_answered_or_closed(server, data, cut):
    _, addr = server
    responses(exchange(addr, data, cut))


@FUZZ
@given(cut=cuts)
def test_the_parser_stream_split_anywhere(server, cut):
    _, addr = server
    got = responses(exchange(addr, STREAM, cut))
    assert [s for s, _ in got] == [200, 200, 200]
    assert [b for _, b in got] == [b"POST /up hello world", b"GET /b ", b"PUT /c xyz"]
