"""http.response.start's headers as the codec takes them
(worker/native/proto/http1/h1_head_asgi.c): every byte of a field name is checked
against RFC 9110's tchar and every byte of a value against its CTL rule
(HTAB allowed, DEL not), whatever its place in the value (the check goes
eight bytes at a time); the fields the server acts on are told by name
whatever their case, and names of the same lengths that differ pass
through untouched. A real Loop over a real fdcore Table on loopback
(conftest.py's serve_asgi), raw sockets."""
from __future__ import annotations

import json
import re

import pytest

from test_wsgi import raw  # noqa: E402

pytestmark = pytest.mark.timeout(60)

TCHAR = set(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def value_ok(b: int) -> bool:
    return not ((b < 0x20 and b != 0x09) or b == 0x7F)


# (length, where) of a value with one byte under test: inside an 8-byte
# block, at a block's last byte, in the tail after whole blocks
PLACES = [(1, 0), (8, 0), (8, 7), (9, 8), (17, 3), (17, 16), (24, 15)]


@pytest.fixture
def serve(serve_asgi):
    return serve_asgi


async def refusals(scope, receive, send):
    """Tries a start for each name byte and each value byte at each place
    that RFC 9110 rules out; answers which were refused (a refused start
    leaves nothing behind). One taken makes every later start a
    RuntimeError (sent twice), the last one too: a 500."""
    bad_names, bad_values = [], []
    for b in range(256):
        if b not in TCHAR:
            try:
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"x-" + bytes([b]) + b"-y", b"v")]})
            except ValueError:
                bad_names.append(b)
    for n, at in PLACES:
        for b in range(256):
            if not value_ok(b):
                value = bytearray(b"v" * n)
                value[at] = b
                try:
                    await send({"type": "http.response.start", "status": 200,
                                "headers": [(b"x-v", bytes(value))]})
                except ValueError:
                    bad_values.append([n, at, b])
    body = json.dumps({"names": bad_names, "values": bad_values}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def test_every_name_and_value_byte_ruled_out_is_refused(serve):
    """A start whose header carries a byte outside RFC 9110's rules is
    refused (ValueError raised into the app), whatever its place."""
    _, addr = serve(refusals)
    out = raw(addr, b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), out[:300]
    got = json.loads(body)
    assert got["names"] == [b for b in range(256) if b not in TCHAR]
    assert got["values"] == [[n, at, b] for n, at in PLACES for b in range(256)
                             if not value_ok(b)]


async def allowed(scope, receive, send):
    """Every allowed name byte and value byte, at each place, in one start."""
    names = [b"x-" + bytes([b]) + b"-y" for b in sorted(TCHAR)]
    values = []
    for n, at in PLACES:
        for b in range(256):
            if value_ok(b):
                value = bytearray(b"v" * n)
                value[at] = b
                values.append(bytes(value))
    headers = [(name, b"1") for name in names] + [(b"x-v%d" % i, v) for i, v in enumerate(values)]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


def test_every_allowed_name_and_value_byte_is_taken(serve):
    """...and one with only allowed bytes is taken, each field sent as given."""
    _, addr = serve(allowed)
    out = raw(addr, b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and body == b"ok", out[:300]
    assert b"x-a-y: 1\r\n" in head and b"x-~-y: 1\r\n" in head
    values = [line for line in head.split(b"\r\n") if re.match(rb"x-v[0-9]+: ", line)]
    assert len(values) == sum(1 for n, at in PLACES for b in range(256) if value_ok(b))


def fields_app(status, headers, body=b"abcdef"):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    return app


def test_the_fields_we_act_on_are_told_by_name_whatever_their_case(serve):
    """CONTENT-LENGTH frames the body, the app's Transfer-Encoding and
    Connection are not passed on (ours are), Date and Server are the
    app's (ours left out); names of the same lengths that differ pass
    through as they are."""
    headers = [(b"CONTENT-LENGTH", b"6"), (b"Transfer-Encoding", b"gzip"),
               (b"CONNECTION", b"Close"), (b"DaTe", b"then"), (b"SERVER", b"app"),
               (b"content-lengtx", b"1"), (b"transfer-encodinx", b"2"), (b"connectiox", b"3"),
               (b"datx", b"4"), (b"servex", b"5")]
    _, addr = serve(fields_app(200, headers))
    out = raw(addr, b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")        # the app's close ends it
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")[1:]
    assert body == b"abcdef", out[:500]
    assert lines.count(b"CONTENT-LENGTH: 6") == 1
    assert not any(line.lower().startswith(b"content-length: 6") for line in lines
                   if line != b"CONTENT-LENGTH: 6")
    assert b"Transfer-Encoding: gzip" not in lines and b"CONNECTION: Close" not in lines
    assert b"Connection: close" in lines and not any(b"chunked" in line for line in lines)
    assert b"DaTe: then" in lines and b"SERVER: app" in lines
    assert not any(line.startswith((b"Date:", b"Server:")) for line in lines)
    for line in (b"content-lengtx: 1", b"transfer-encodinx: 2", b"connectiox: 3", b"datx: 4",
                 b"servex: 5"):
        assert line in lines


def test_204_drops_the_apps_content_length(serve):
    _, addr = serve(fields_app(204, [(b"Content-Length", b"6"), (b"x-a", b"b")], body=b""))
    out = raw(addr, b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 204") and body == b"", out[:300]
    assert b"Content-Length" not in head and b"x-a: b" in head
