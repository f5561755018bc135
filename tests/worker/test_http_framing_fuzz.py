"""Request framing fuzzed against a strict reference (issue 18, the fuzz
target): generated requests (head, Content-Length or chunked body with
extensions and trailers), pipelined, mutated at the byte and line level,
split at random points, are framed by http_reference.py (RFC 9112's ABNF,
independent of llhttp) and by the engine, both as the Parser object fed
directly and as the real server on a real socket (an echo app records each
request it is given). The engine must frame exactly what the reference
frames: never a request the reference does not see, never two where it
sees one, no body byte served twice or dropped (method, target and body
compared per request); where the reference refuses, the engine answers
4xx/5xx or closes and dispatches nothing from there on.

test_http_asan.py runs this file against the AddressSanitizer + UBSan
build. The number of examples is FUZZ_HTTP_EXAMPLES (default: a bounded
run of a few tens of seconds); bench/fuzz_http.sh runs it for longer."""
from __future__ import annotations

import os
import socket
import threading

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from http_reference import Framing, frame
from test_engine_fuzz import responses, send_pieces
from test_http_parser import framed

pytestmark = pytest.mark.timeout(int(os.environ.get("FUZZ_HTTP_TIMEOUT", "300")))

EXAMPLES = int(os.environ.get("FUZZ_HTTP_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.filter_too_much, HealthCheck.too_slow])

# Where the reference refuses for one of these reasons and the engine
# serves, it is a deliberate leniency pinned by test_http_framing_known.py
# (LENIENT: bytes RFC 3986 leaves out of a request-target), not a finding.
# Issue 18 §2's defects and this target's first findings are fixed: their
# reasons are no longer stepped around.
KNOWN = ("byte 0x",)


def known(ref: Framing) -> bool:
    return ref.end == "reject" and ref.reason.startswith(KNOWN)


# ---- generated messages --------------------------------------------------------------------

TCHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-!#$%&'*+.^_`|~"
token = st.text(TCHARS, min_size=1, max_size=8)
pchars = st.text("abcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@/", max_size=12)
value = st.text("abcdefghijklmnopqrstuvwxyz0123456789 \t;=,/.\"-()", max_size=20).map(
    lambda v: v.strip(" \t"))
# chunk extensions without BWS: the engine refuses BWS around ';' and '='
# (a finding, test_http_framing_known.py), which would only end fuzzed
# streams early
ext = st.one_of(token.map(lambda t: ";" + t),
                st.tuples(token, st.one_of(token, value.map(lambda v: '"%s"' % v.replace('"', "")))).map(
                    lambda t: f";{t[0]}={t[1]}"))


@st.composite
def message(draw) -> bytes:
    """One request, well formed by the reference's grammar."""
    version = draw(st.sampled_from(["HTTP/1.1"] * 4 + ["HTTP/1.0"]))
    method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"]))
    target = "/" + draw(pchars) + draw(st.sampled_from(["", "?", "?a=1&b", "?/x?y"]))
    fields = [f"{draw(st.sampled_from(['Host', 'host', 'HOST']))}:"
              f"{draw(st.sampled_from(['', ' ', '  ']))}{draw(st.sampled_from(['h', 'a.b:80', 'x-y', '']))}"]
    if version == "HTTP/1.0" and draw(st.booleans()):
        fields = []
    for name, val in draw(st.lists(st.tuples(token, value), max_size=3)):
        if name.lower() not in ("host", "content-length", "transfer-encoding", "connection",
                                "expect", "upgrade", "te", "trailer"):
            fields.append(f"{name}:{draw(st.sampled_from(['', ' ', chr(9)]))}{val}")
    if draw(st.integers(0, 4)) == 0:
        fields.append("Connection: " + draw(st.sampled_from(["close", "keep-alive", "x, close"])))
    body = draw(st.binary(max_size=40))
    framing = draw(st.sampled_from(["none", "cl", "chunked"] if version == "HTTP/1.1"
                                   else ["none", "cl"]))
    if framing == "none":
        body = b""
    elif framing == "cl":
        fields.append(f"Content-Length: {len(body)}")
    else:
        fields.append("Transfer-Encoding: " + draw(st.sampled_from(["chunked", "Chunked", "chunked "])))
    draw(st.randoms()).shuffle(fields)
    raw = (f"{method} {target} {version}\r\n" + "".join(f + "\r\n" for f in fields) + "\r\n").encode()
    if framing != "chunked":
        return raw + body
    rest = body
    while rest:
        n = draw(st.integers(1, len(rest)))
        zeros = "0" * draw(st.integers(0, 2))
        exts = "".join(draw(st.lists(ext, max_size=1)))   # ";a=b;c" is refused (a finding)
        raw += f"{zeros}{n:{draw(st.sampled_from(['x', 'X']))}}{exts}\r\n".encode() + rest[:n] + b"\r\n"
        rest = rest[n:]
    raw += ("0" * draw(st.integers(1, 3)) + "".join(draw(st.lists(ext, max_size=1))) + "\r\n").encode()
    for name, val in draw(st.lists(st.tuples(token, value), max_size=2)):
        if name.lower() not in ("host", "content-length", "transfer-encoding"):
            raw += f"{name}: {val}\r\n".encode()
    return raw + b"\r\n"


# what a mutation puts in: the bytes that decide framing
INSERTS = [b" ", b"\t", b"\r", b"\n", b"\r\n", b"\x00", b";", b":", b",", b"0", b"1", b"a", b"\"",
           b"=", b"\\", b"HTTP/1.1", b"\r\n\r\n", b"\r\nContent-Length: 1", b"\r\nContent-Length: 0",
           b"\r\nTransfer-Encoding: chunked", b"\r\nTransfer-Encoding:", b"\r\nHost: h",
           b"\r\nConnection: close", b"0\r\n\r\n", b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"]


@st.composite
def mutated(draw, data: bytes) -> bytes:
    """data with a few byte- and line-level edits."""
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["insert", "delete", "replace", "crlf", "dupline"]))
        if op == "insert":
            data = data[:i] + draw(st.sampled_from(INSERTS)) + data[i:]
        elif op == "delete":
            data = data[:i] + data[i + draw(st.integers(1, 3)):]
        elif op == "replace" and i < len(data):
            data = data[:i] + draw(st.sampled_from(INSERTS[:13])) + data[i + 1:]
        elif op == "crlf":                                  # one CRLF loses its CR or its LF
            spots = [k for k in range(len(data) - 1) if data[k:k + 2] == b"\r\n"]
            if spots:
                k = draw(st.sampled_from(spots))
                data = data[:k] + draw(st.sampled_from([b"\n", b"\r", b"\r\r\n", b"\n\r"])) + data[k + 2:]
        elif op == "dupline":                               # a line said twice
            lines = data.split(b"\r\n")
            k = draw(st.integers(0, len(lines) - 1))
            lines.insert(k, lines[k])
            data = b"\r\n".join(lines)
    return data


@st.composite
def stream(draw) -> tuple[bytes, bool]:
    """(pipelined requests, whether they were mutated)."""
    data = b"".join(draw(st.lists(message(), min_size=1, max_size=3)))
    if draw(st.integers(0, 3)):
        return draw(mutated(data)), True
    return data, False


cuts = st.lists(st.integers(min_value=0, max_value=2000), max_size=6)


# ---- the Parser, fed directly ----------------------------------------------------------------

def parser_frames(data: bytes, cut: list[int]) -> tuple[list, str]:
    """What the Parser frames from data fed in pieces: [(method, target,
    body)] for each request whose body it finished, and 'refused' or
    'open' (waiting for more, or done after a close)."""
    return framed(data, cut, lambda env, body: (env["REQUEST_METHOD"].encode(),
                                                env["RAW_URI"].encode("latin-1"), body))


def expected(ref: Framing) -> list:
    return [(r.method, r.target, r.body) for r in ref.requests]


def check_parser(data: bytes, cut: list[int], mutated: bool) -> None:
    """The Parser frames a prefix of what the reference frames (all of it
    for an unmutated stream), and refuses where it stops short. Where the
    reference refuses, the Parser may refuse or wait for more (at the end
    of the stream the server then closes): it must not frame past it."""
    ref = frame(data)
    got, how = parser_frames(data, cut)
    want = expected(ref)
    assert got == want[:len(got)], ("framed differently", data, ref)
    if len(got) < len(want):
        assert how == "refused" and mutated, ("dropped requests", data, ref)


@FUZZ
@given(data=stream(), cut=cuts)
def test_the_parser_frames_what_the_reference_frames(data, cut):
    data, mutated = data
    assume(not known(frame(data)))
    check_parser(data, cut, mutated)


# ---- the real server, on a socket ---------------------------------------------------------

class Echo:
    """The app: each request it is given whose body it read to the end,
    recorded per client port, and answered with (method, target, body)."""

    def __init__(self):
        self.seen: dict[int, list] = {}
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        body = environ["wsgi.input"].read()     # raises if the body is refused or cut short
        got = (environ["REQUEST_METHOD"].encode(), environ["RAW_URI"].encode("latin-1"), body)
        with self.lock:
            self.seen.setdefault(int(environ["REMOTE_PORT"]), []).append(got)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [repr(got).encode()]


def exchange(addr, data: bytes, cut: list[int]) -> tuple[int, bytes]:
    """test_engine_fuzz's exchange, and the client's port (the app's
    REMOTE_PORT)."""
    with socket.create_connection(addr, timeout=10) as c:
        return c.getsockname()[1], send_pieces(c, data, cut)


def check_server(app: Echo, addr, data: bytes, cut: list[int], mutated: bool) -> None:
    """The app is given a prefix of what the reference frames (all of it
    for an unmutated stream), each answered in order; past that prefix at
    most one refusal, and nothing after a request that closes."""
    ref = frame(data)
    port, out = exchange(addr, data, cut)
    with app.lock:
        seen = app.seen.pop(port, [])
    want = expected(ref)
    assert seen == want[:len(seen)], ("dispatched differently", data, ref, seen)
    assert mutated or len(seen) == len(want), ("dropped requests", data, ref, seen)
    got = responses(out)
    n = len(seen)
    if ref.end == "partial":
        # a finding pinned by test_http_pipeline_eof.py: when a body is cut
        # short by EOF the answers before it are lost; check those that came
        n = min(n, sum(1 for s, _ in got if s == 200))
    assert [s for s, _ in got[:n]] == [200] * n, (data, ref, got)
    assert [b for _, b in got[:n]] == [repr(w).encode() for w in seen[:n]], (data, ref, got)
    extra = got[n:]
    assert len(extra) <= 1 and all(400 <= s < 600 for s, _ in extra), (data, ref, got)
    if ref.end == "done" and n == len(want) and want and not ref.requests[-1].keep_alive:
        assert not extra, (data, ref, got)


@pytest.fixture
def echo_server(serve_wsgi):
    def start(threads):
        app = Echo()
        _, addr = serve_wsgi(app, threads=threads, header_timeout=5.0, body_timeout=5.0)
        return app, addr
    return start


@pytest.mark.parametrize("threads", [1, 2])
def test_the_server_frames_what_the_reference_frames(echo_server, threads):
    app, addr = echo_server(threads)

    @FUZZ
    @given(data=stream(), cut=cuts)
    def run(data, cut):
        data, mutated = data
        assume(not known(frame(data)))
        check_server(app, addr, data, cut, mutated)

    run()
