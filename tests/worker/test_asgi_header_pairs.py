"""The scope's header pairs shared across requests (worker/native/
asgi_scope.c, header_pair): a common name with a common value is one
tuple for every scope, and under a common name the last pair seen is
reused when the next value is the same (at most 64 bytes); never for
Sec-WebSocket-Key, cookie or authorization. Sharing must never show: each
scope carries exactly the bytes its request sent, whatever came before
(a pair kept from another value is never handed out). In process
(conftest.py's serve_asgi), raw sockets."""
from __future__ import annotations

import pytest

from test_wsgi import raw  # noqa: E402

pytestmark = pytest.mark.timeout(60)


class Recorder:
    """Keeps every scope's header list (the objects themselves)."""

    def __init__(self):
        self.headers = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        self.headers.append(scope["headers"])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def request(addr, *fields: str) -> None:
    head = "GET / HTTP/1.1\r\n" + "".join(f + "\r\n" for f in fields) + "Connection: close\r\n\r\n"
    assert raw(addr, head.encode()).startswith(b"HTTP/1.1 204")


def pair(headers, name: bytes):
    (p,) = [p for p in headers if p[0] == name]
    return p


def test_each_scope_has_its_own_values_and_equal_pairs_are_shared(serve_asgi):
    rec = Recorder()
    _, addr = serve_asgi(rec)
    hosts = ["a.example", "b.example", "b.example", "a.example", "x" * 65, "x" * 65,
             "A.example"]
    for h in hosts:
        request(addr, f"Host: {h}", "Accept: */*", "Cookie: s=1", "Authorization: Basic eA==",
                "X-Custom: v")
    got = [pair(hs, b"host") for hs in rec.headers]
    assert [p[1] for p in got] == [h.encode() for h in hosts]        # never another's value
    assert got[2] is got[1]                                           # the last pair, kept
    assert got[3] is not got[0]                                       # only the last one
    assert got[5] is not got[4] and got[5] == got[4]                  # > 64 bytes: not kept
    accept = [pair(hs, b"accept") for hs in rec.headers]
    assert all(p is accept[0] for p in accept)                        # common name and value
    for name in (b"cookie", b"authorization", b"x-custom"):
        ps = [pair(hs, name) for hs in rec.headers]
        assert len({id(p) for p in ps}) == len(ps), name              # credentials: never kept
        assert all(p == ps[0] for p in ps)


def test_websocket_keys_are_never_shared(serve_asgi):
    scopes = []

    async def app(scope, receive, send):
        if scope["type"] == "websocket":
            scopes.append(scope)
            await receive()
            await send({"type": "websocket.close"})

    _, addr = serve_asgi(app)
    req = (b"GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    for _ in range(2):
        assert raw(addr, req).startswith(b"HTTP/1.1 403")
    k0, k1 = (pair(s["headers"], b"sec-websocket-key") for s in scopes)
    assert k0 == k1 and k0 is not k1
    assert pair(scopes[0]["headers"], b"upgrade") is pair(scopes[1]["headers"], b"upgrade")
    assert pair(scopes[0]["headers"], b"host") is pair(scopes[1]["headers"], b"host")
