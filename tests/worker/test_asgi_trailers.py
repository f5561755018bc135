"""The ASGI `http.response.trailers` extension (issue 22 §2, Extensions):
advertised in a scope's extensions only when the request said `TE:
trailers` (HTTP/1.1); `http.response.start` with `trailers: True` makes the
body chunked, and the `http.response.trailers` messages after the body
(`more_trailers`) are written as the chunked trailer section; trailers
in the wrong order, not advertised, or with fields a header could not have
(or that a trailer must not carry: framing, routing) are the app's error
(logged naming the message; a 500 before the head went out, else the
connection is cut). A real Loop over a real fdcore Table on loopback, one
loop thread (conftest.py's serve_asgi); responses read with h11, a strict
HTTP/1.1 client parser."""
from __future__ import annotations

import logging
import socket

import h11
import pytest

from test_asgi_pathsend import read_until  # noqa: E402
from test_wsgi import raw  # noqa: E402

pytestmark = pytest.mark.timeout(60)

TE = b"TE: trailers\r\n"


def get(path: bytes, extra: bytes = b"", method: bytes = b"GET") -> bytes:
    return method + b" " + path + b" HTTP/1.1\r\nHost: h\r\n" + extra + b"\r\n"


def h11_responses(addr, data: bytes, count: int, method: bytes = b"GET"):
    """count responses to the requests in `data` on one connection, as h11
    reads them: [(Response, body, EndOfMessage)]."""
    client = h11.Connection(h11.CLIENT)
    out = []
    with socket.create_connection(addr, timeout=10) as s:
        s.sendall(data)
        for _ in range(count):
            # h11 needs the request it answers: the raw bytes are sent already
            client.send(h11.Request(method=method, target=b"/", headers=[(b"host", b"h")]))
            client.send(h11.EndOfMessage())
            resp, body = None, b""
            while True:
                ev = client.next_event()
                if ev is h11.NEED_DATA:
                    chunk = s.recv(65536)
                    client.receive_data(chunk)
                    assert chunk or ev, "EOF"
                    continue
                if isinstance(ev, h11.Response):
                    resp = ev
                elif isinstance(ev, h11.Data):
                    body += ev.data
                elif isinstance(ev, h11.EndOfMessage):
                    out.append((resp, body, ev))
                    break
            client.start_next_cycle()
    return out


def trailer_app(messages, seen=None):
    """Sends `messages` for /t, `ok` for anything else."""
    async def app(scope, receive, send):
        if seen is not None:
            seen.append(scope)
        if scope["path"] == "/t":
            for m in messages:
                await send(m)
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
    return app


START_T = {"type": "http.response.start", "status": 200,
           "headers": [(b"content-type", b"text/plain"), (b"trailer", b"x-checksum, x-more")],
           "trailers": True}


@pytest.mark.parametrize("te, version, advertised", [
    (b"TE: trailers\r\n", b"1.1", True),
    (b"TE: gzip;q=0.5, Trailers\r\n", b"1.1", True),
    (b"TE: gzip\r\nte: trailers \r\n", b"1.1", True),
    (b"", b"1.1", False),
    (b"TE: gzip\r\n", b"1.1", False),
    (b"TE: trailersx\r\n", b"1.1", False),
    (b"X-TE: trailers\r\n", b"1.1", False),
    (b"TE: trailers\r\n", b"1.0", False),               # HTTP/1.0 has no chunked body
])
def test_trailers_advertised_only_when_the_client_accepts_them(serve_asgi, te, version, advertised):
    seen = []
    _, addr = serve_asgi(trailer_app([], seen))
    out = raw(addr, b"GET /x HTTP/" + version + b"\r\nHost: h\r\n" + te +
              b"Connection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200 OK"), out
    ext = seen[0]["extensions"]
    assert ("http.response.trailers" in ext) == advertised, ext
    assert "http.response.pathsend" in ext


@pytest.mark.parametrize("body_messages", [
    [{"type": "http.response.body", "body": b"hello world"}],
    [{"type": "http.response.body", "body": b"hello ", "more_body": True},
     {"type": "http.response.body", "body": b"world", "more_body": False}],
])
def test_trailers_follow_the_chunked_body(serve_asgi, body_messages):
    messages = [START_T, *body_messages,
                {"type": "http.response.trailers", "headers": [(b"x-checksum", b"abc123")],
                 "more_trailers": True},
                {"type": "http.response.trailers", "headers": [[b"X-More", b"1"]]}]
    _, addr = serve_asgi(trailer_app(messages))
    # two on one connection, and a plain request pipelined after them
    got = h11_responses(addr, get(b"/t", TE) * 2 + get(b"/ok"), 3)
    for resp, body, end in got[:2]:
        assert resp.status_code == 200
        assert (b"transfer-encoding", b"chunked") in resp.headers
        assert not any(k == b"content-length" for k, _ in resp.headers)
        assert body == b"hello world"
        assert list(end.headers) == [(b"x-checksum", b"abc123"), (b"x-more", b"1")]
    assert got[2][1] == b"ok"


def test_raw_trailer_section_on_the_wire(serve_asgi):
    messages = [START_T, {"type": "http.response.body", "body": b"abc"},
                {"type": "http.response.trailers", "headers": [(b"x-checksum", b"1")]}]
    _, addr = serve_asgi(trailer_app(messages))
    out = raw(addr, get(b"/t", TE + b"Connection: close\r\n"))
    assert out.endswith(b"\r\n\r\n3\r\nabc\r\n0\r\nx-checksum: 1\r\n\r\n"), out


def test_head_with_trailers_has_no_body(serve_asgi):
    messages = [START_T, {"type": "http.response.body", "body": b"abc"},
                {"type": "http.response.trailers", "headers": [(b"x-checksum", b"1")]}]
    _, addr = serve_asgi(trailer_app(messages))
    with socket.create_connection(addr, timeout=10) as s:
        s.sendall(get(b"/t", TE, b"HEAD") + get(b"/ok"))
        buf = read_until(s, b"\r\n\r\nok")
    first, _, second = buf.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200 OK") and second.startswith(b"HTTP/1.1 200 OK"), buf
    assert b"x-checksum: 1" not in buf


def test_no_trailers_flag_and_no_trailers_is_unchanged(serve_asgi):
    """A client that accepts trailers, an app that sends none: framing as
    ever (a Content-Length for a body given whole)."""
    messages = [{"type": "http.response.start", "status": 200, "headers": []},
                {"type": "http.response.body", "body": b"abc"}]
    _, addr = serve_asgi(trailer_app(messages))
    out = raw(addr, get(b"/t", TE + b"Connection: close\r\n"))
    assert b"Content-Length: 3\r\n" in out and out.endswith(b"\r\n\r\nabc"), out


def is_500(out: bytes) -> bool:
    return out.startswith(b"HTTP/1.1 500 Internal Server Error") and \
        out.endswith(b"\r\n\r\nInternal Server Error\n")


def cut(out: bytes) -> bool:
    """The head and the body went out, the trailer section never ended."""
    return out.startswith(b"HTTP/1.1 200 OK") and not out.endswith(b"\r\n\r\n")


BODY = {"type": "http.response.body", "body": b"abc"}
TRAILERS = {"type": "http.response.trailers", "headers": [(b"x-checksum", b"1")]}
START = {"type": "http.response.start", "status": 200, "headers": []}


@pytest.mark.parametrize("messages, te, outcome, says", [
    # trailers: True when the client did not accept them (not advertised)
    ([START_T, BODY, TRAILERS], b"", is_500, "TE: trailers"),
    # trailers without trailers: True in the start
    ([START, BODY, TRAILERS], TE, None, "http.response.trailers"),
    # trailers before the body ended
    ([START_T, {**BODY, "more_body": True}, TRAILERS], TE, cut, "http.response.trailers"),
    ([START_T, TRAILERS], TE, is_500, "http.response.trailers"),
    # trailers with a Content-Length: no chunked body to carry them
    ([{**START_T, "headers": [(b"content-length", b"3")]}, BODY, TRAILERS], TE, is_500,
     "Content-Length"),
    # the app returns without its trailers
    ([START_T, BODY], TE, cut, "trailers"),
    # fields a trailer must not be, or that no header could be
    ([START_T, BODY, {**TRAILERS, "headers": [(b"content-length", b"3")]}], TE, cut,
     "content-length"),
    ([START_T, BODY, {**TRAILERS, "headers": [(b"Transfer-Encoding", b"chunked")]}], TE, cut,
     "Transfer-Encoding"),
    ([START_T, BODY, {**TRAILERS, "headers": [(b"host", b"x")]}], TE, cut, "host"),
    ([START_T, BODY, {**TRAILERS, "headers": [(b"x bad", b"1")]}], TE, cut, "token"),
    ([START_T, BODY, {**TRAILERS, "headers": [(b"x-a", b"1\r\nx-b: 2")]}], TE, cut,
     "control character"),
    ([START_T, BODY, {**TRAILERS, "headers": [(b"", b"1")]}], TE, cut, "empty"),
    ([START_T, BODY, {**TRAILERS, "headers": [("x-a", "1")]}], TE, cut, "bytes"),
    ([START_T, BODY, {**TRAILERS, "headers": 5}], TE, cut, "headers"),
])
def test_wrong_trailers_are_the_apps_error(serve_asgi, caplog, messages, te, outcome, says):
    _, addr = serve_asgi(trailer_app(messages))
    with caplog.at_level(logging.ERROR, logger="sockherd.worker"):
        out = raw(addr, get(b"/t", te + b"Connection: close\r\n"))
        if outcome is None:
            # the body was whole before the wrong message: the response is
            # complete; the app's error is logged
            assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"abc"), out
        else:
            assert outcome(out), out
        assert b"Traceback" not in out and b"x-b: 2" not in out
        assert raw(addr, get(b"/ok", b"Connection: close\r\n")).endswith(b"\r\n\r\nok")
    assert any("app failed on GET /t" in r.getMessage() for r in caplog.records), caplog.text
    assert says in caplog.text, caplog.text


def test_a_pathsend_file_then_trailers(serve_asgi, tmp_path):
    """pathsend is the body: with trailers: True it goes out as one chunk
    (sendfile after its chunk-size line), then the trailer section."""
    data = bytes(range(256)) * 40000 + b"end"           # past what one write takes
    (tmp_path / "f").write_bytes(data)
    messages = [START_T, {"type": "http.response.pathsend", "path": str(tmp_path / "f")},
                {"type": "http.response.trailers", "headers": [(b"x-checksum", b"z")]}]
    _, addr = serve_asgi(trailer_app(messages))
    got = h11_responses(addr, get(b"/t", TE) + get(b"/ok"), 2)
    resp, body, end = got[0]
    assert (b"transfer-encoding", b"chunked") in resp.headers and body == data
    assert list(end.headers) == [(b"x-checksum", b"z")]
    assert got[1][1] == b"ok"
