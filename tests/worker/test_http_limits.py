"""Request limits that every byte counts toward, and the header timer (issue
18 §3), on a real socket against a real in-process server.

Every byte a client sends before the app sees the body counts toward a
limit: the request line (leading empty lines included) toward
limit_request_line, each field line (its whitespace included) toward
limit_request_field_size, the field lines toward limit_request_fields,
chunk extensions and leading zeros of chunk sizes toward limit_request_body,
and trailer lines toward the field limits."""
from __future__ import annotations

import select
import socket
import time

import pytest

from test_http_smuggling import SMUGGLED, exchange

pytestmark = pytest.mark.timeout(60)

CHUNKED = b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"


def app(environ, start_response):
    body = environ["wsgi.input"].read()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok %d\n" % len(body)]


def flood(addr, head: bytes, piece: bytes, total: int, timeout: float = 20.0) -> bytes:
    """Sends head, then piece repeated up to total bytes, stopping as soon
    as the server answers; returns the answer (read until close or the
    deadline). A server that never answers lets all of it through."""
    deadline = time.monotonic() + timeout
    sent, out = 0, b""
    with socket.create_connection(addr, timeout=timeout) as c:
        c.sendall(head)
        block = piece * max(1, 65536 // len(piece))
        while sent < total and time.monotonic() < deadline:
            if select.select([c], [], [], 0)[0]:
                break
            try:
                c.sendall(block)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(block)
        c.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            while chunk := c.recv(65536):
                out += chunk
        except (socket.timeout, ConnectionResetError):
            pass
    return out


@pytest.mark.parametrize("head,piece,status", [
    # §3: 2 MB of chunk extensions against limit_request_body = 10
    (CHUNKED + b"1;", b"a", 413),
    (CHUNKED + b"1;a=", b"b", 413),
    # leading zeros of a chunk size
    (CHUNKED, b"0", 413),
    # 5 MB of spaces before a field value; of leading empty lines (the
    # second is refused now: one is all RFC 9112 §2.2 asks a server to skip)
    (b"GET / HTTP/1.1\r\nHost: h\r\nX:", b" ", 431),
    (b"", b"\r\n", 400),
    # spaces after the request-target (refused as syntax, or as length)
    (b"GET /", b" ", 400),
], ids=["chunk-ext-name", "chunk-ext-value", "chunk-size-zeros", "ows-before-value",
        "leading-empty-lines", "request-line-spaces"])
def test_padding_counts_toward_a_limit(serve_wsgi, head, piece, status):
    """Issue 18 §3: these bytes counted toward no limit: 2 MB (5 MB for the
    head) were accepted against limit_request_body=10 and the defaults."""
    _, addr = serve_wsgi(app, limit_request_body=10)
    out = flood(addr, head, piece, 5 << 20)
    assert out.startswith(b"HTTP/1.1 %d " % status), out[:200]


def test_chunk_extensions_within_the_body_limit_are_served(serve_wsgi):
    """Guard for §3: extensions count, but the minimal chunk framing (size
    digits and CRLFs) never does: a 10-byte body in 10 chunks is served with
    limit_request_body=10, and with 1 byte of extension more it is not."""
    _, addr = serve_wsgi(app, limit_request_body=12)
    body = b"".join(b"1\r\nx\r\n" for _ in range(10)) + b"0\r\n\r\n"
    statuses, out, _ = exchange(addr, CHUNKED + body + b"GET / HTTP/1.1\r\nHost: h\r\n"
                                b"Connection: close\r\n\r\n")
    assert statuses == [200, 200] and b"ok 10" in out, out
    statuses, out, closed = exchange(addr, CHUNKED + b"1;ab\r\nx\r\n" + body + SMUGGLED)
    assert statuses == [413] and closed, out


def test_trailer_lines_count_toward_the_field_limits(serve_wsgi):
    """Issue 18 §3: trailer fields count toward limit_request_field_size
    and limit_request_fields like head fields (RFC 9112 §7.1.2)."""
    _, addr = serve_wsgi(app, limit_request_field_size=100, limit_request_fields=5)
    statuses, out, closed = exchange(addr, CHUNKED + b"0\r\nX: " + b"a" * 200 + b"\r\n\r\n"
                                     + SMUGGLED)
    assert statuses == [431] and closed, out
    many = b"".join(b"T%d: 1\r\n" % i for i in range(10))
    statuses, out, closed = exchange(addr, CHUNKED + b"0\r\n" + many + b"\r\n" + SMUGGLED)
    assert statuses == [431] and closed, out


def _closed_after(c: socket.socket, limit: float) -> tuple[float, bytes]:
    """Reads c until the server closes it (or limit passes): (seconds, bytes)."""
    start, out = time.monotonic(), b""
    while time.monotonic() - start < limit:
        if select.select([c], [], [], 0.1)[0]:
            try:
                chunk = c.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            out += chunk
    return time.monotonic() - start, out


def test_leading_empty_lines_start_the_header_timer(serve_wsgi):
    """Issue 18 §3: a client dripping CRLF kept the connection open forever:
    empty lines did not start the header timer and each read re-armed the
    keep-alive one. The header timer starts at the first byte (RFC 9112
    §2.2 lets a server ignore empty lines, not wait for them forever): an
    empty line and then nothing gets 408 at header_timeout, not the 30 s
    keep-alive; a second empty line is refused at once (400)."""
    _, addr = serve_wsgi(app, header_timeout=0.5, keepalive_timeout=30)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"\r\n")
        elapsed, out = _closed_after(c, 10)
    assert elapsed < 5 and out.startswith(b"HTTP/1.1 408 "), (elapsed, out)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"\r\n")
        c.sendall(b"\r\n")
        elapsed, out = _closed_after(c, 10)
    assert elapsed < 5 and out.startswith(b"HTTP/1.1 400 "), (elapsed, out)


def test_keepalive_timer_is_not_rearmed_by_empty_lines_after_a_request(serve_wsgi):
    """Issue 18 §3: after a first request, an empty line is the start of
    the next request: the header timer runs, not a re-armed keep-alive."""
    _, addr = serve_wsgi(app, header_timeout=0.5, keepalive_timeout=30)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        elapsed, out = _closed_after(c, 0.2)          # the answer
        assert out.startswith(b"HTTP/1.1 200 "), out
        c.sendall(b"\r\n")
        elapsed, out = _closed_after(c, 10)
    assert elapsed < 5 and out.startswith(b"HTTP/1.1 408 "), (elapsed, out)


# gunicorn's request corpus (tests/requests/invalid): the shapes of its
# LimitRequestLine / LimitRequestHeaders cases at the default settings
GUNICORN_LIMITS = [
    ("006-line", b"PUT /" + b"q" * 4100 + b" HTTP/1.0\r\n\r\n", 414),
    # an 8189-byte field line: 8191 with its CRLF, gunicorn's count (it was
    # served before the CRLF counted)
    ("008-field-size", b"PUT /stuff/here?foo=bar HTTP/1.0\r\nSomeheader: " + b"a" * 8177 +
     b"\r\n\r\n", 431),
    ("009-fields", b"PUT /stuff/here?foo=bar HTTP/1.0\r\nContent-Length: 0\r\n" +
     b"".join(b"header%d: %d\r\n" % (i, i) for i in range(100)) + b"\r\n", 431),
    ("017-field-size", b"GET /test HTTP/1.1\r\nHost: h\r\nLong-header: " + b"0" * 8180 +
     b"\r\n\r\n", 431),
    ("default-01-field", b"GET / HTTP/1.0\r\nX: " + b"y" * 8200 + b"\r\n\r\n", 431),
]


@pytest.mark.parametrize("data,status", [c[1:] for c in GUNICORN_LIMITS],
                         ids=[c[0] for c in GUNICORN_LIMITS])
def test_gunicorn_limit_cases_at_the_defaults(serve_wsgi, data, status):
    """Issue 18 §3: the line, field size and field count limits are
    separate settings with gunicorn's names and defaults (4094, 8190, 100),
    so its corpus's limit cases are refused at the defaults."""
    _, addr = serve_wsgi(app)
    statuses, out, closed = exchange(addr, data + SMUGGLED)
    assert statuses == [status] and closed, out[:300]


def test_at_the_default_limits_requests_are_served(serve_wsgi):
    """Guard for the defaults: a 4094-byte request line, an 8190-byte field
    line (its CRLF included, as gunicorn counts) and 100 fields are served."""
    _, addr = serve_wsgi(app)
    line = b"GET /" + b"a" * (4094 - len(b"GET / HTTP/1.1")) + b" HTTP/1.1"
    assert len(line) == 4094
    field = b"X: " + b"v" * (8190 - 3 - 2)
    fields = b"Host: h\r\n" + b"".join(b"F%d: 1\r\n" % i for i in range(97))
    statuses, out, _ = exchange(addr, line + b"\r\n" + fields + field + b"\r\n"
                                b"Connection: close\r\n\r\n")
    assert statuses == [200], out[:300]


def test_settings_have_gunicorns_names_and_defaults():
    """Issue 18 §3: one setting per limit, gunicorn's names and defaults;
    limit_request_header_bytes (documented before) is an alias."""
    import argparse

    from sockherd.master.settings import BY_KEY, add_arguments, resolve
    assert BY_KEY["limit_request_line"].default == 4094
    assert BY_KEY["limit_request_field_size"].default == 8190
    assert BY_KEY["limit_request_fields"].default == 100
    assert "limit_request_header_bytes" not in BY_KEY
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = vars(parser.parse_args(["--limit-request-header-bytes", "1000"]))
    assert resolve(flags, env={}).limit_request_field_size == 1000
    env = {"SOCKHERD_LIMIT_REQUEST_HEADER_BYTES": "2000"}
    assert resolve({}, env=env).limit_request_field_size == 2000
    env["SOCKHERD_LIMIT_REQUEST_FIELD_SIZE"] = "3000"
    assert resolve({}, env=env).limit_request_field_size == 3000


@pytest.mark.parametrize("settings,data", [
    ({"limit_request_field_size": 10}, b"GET / HTTP/1.1\r\nHost: h\r\nUser-Agent: x\r\n\r\n"),
    ({"limit_request_fields": 2}, b"GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\n\r\n"),
    ({"limit_request_field_size": 98}, b"GET / HTTP/1.1\r\nHost: h\r\nX:" + b" " * 96 + b"x\r\n\r\n"),
], ids=["010-field-size-10", "011-fields-2", "012-field-size-98-with-ows"])
def test_gunicorn_limit_cases_with_their_settings(serve_wsgi, settings, data):
    """Issue 18 §3: gunicorn's corpus sets small limits for some cases
    (010, 011, 012): the settings take such values and refuse with 431;
    whitespace before a value counts."""
    _, addr = serve_wsgi(app, **settings)
    statuses, out, closed = exchange(addr, data + SMUGGLED)
    assert statuses == [431] and closed, out[:300]


def test_unread_body_drain_is_bounded_by_body_timeout(serve_wsgi):
    """Found by the adversarial review of the parser after issue 18: an app
    answered without reading a request body of Content-Length 10^11; the
    loop thread then drained the unwanted body for as long as the client
    kept sending 64 KiB/s or more (the body deadline grows by a second per
    64 KiB received), serving no other connection meanwhile: past 6 s with
    body_timeout 1 s, it still drained and a second client timed out. The
    drain of a body nobody reads has body_timeout, never more; then the
    connection closes (the answer has gone out already)."""
    def noread(environ, start_response):
        start_response("200 OK", [("Content-Length", "3")])
        return [b"ok\n"]

    _, addr = serve_wsgi(noread, body_timeout=1.0)
    with socket.create_connection(addr) as c:
        c.sendall(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 100000000000\r\n\r\n")
        start = time.monotonic()
        deadline = start + 8.0
        out, closed = b"", False
        c.setblocking(False)
        while time.monotonic() < deadline and not closed:
            try:
                c.send(b"x" * 32768)             # 320 KiB/s: well above the minimum rate
            except BlockingIOError:
                pass
            except OSError:
                closed = True                    # reset after our close: closed too
                break
            readable, _, _ = select.select([c], [], [], 0.1)
            if readable:
                try:
                    data = c.recv(65536)
                except OSError:
                    closed = True
                    break
                out += data
                closed = not data
        assert out.startswith(b"HTTP/1.1 200 OK"), out
        assert closed, "still draining an unread body after 8 s (body_timeout 1 s)"
        assert time.monotonic() - start < 4.0
    statuses, out, _ = exchange(addr, b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
                                timeout=5)
    assert statuses == [200], out
