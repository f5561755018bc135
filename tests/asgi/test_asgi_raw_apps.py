"""Hand-written ASGI 3 apps served by a real server (issue 22 §2, §4):
tests/apps/asgi_hello.py (no lifespan support: it raises on the lifespan
scope, and must be served all the same) and tests/apps/asgi_lifespan.py
(startup state copied into every request's scope, shutdown at a graceful
stop). Each test runs against every server kind of conftest.py (uvicorn
only with SOCKHERD_ASGI_REFERENCE=1)."""
from __future__ import annotations

import socket

import httpx
import pytest

pytestmark = pytest.mark.timeout(120)


def read_responses(s: socket.socket, count: int) -> list[bytes]:
    """`count` whole responses with Content-Length bodies from s."""
    buf, out = b"", []
    while len(out) < count:
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            assert chunk, f"EOF after {len(out)} responses: {buf!r}"
            buf += chunk
        head, buf = buf.split(b"\r\n\r\n", 1)
        length = int(next(ln.split(b":", 1)[1] for ln in head.split(b"\r\n")
                          if ln.lower().startswith(b"content-length:")))
        while len(buf) < length:
            chunk = s.recv(65536)
            assert chunk, "EOF in a body"
            buf += chunk
        out.append(head + b"\r\n\r\n" + buf[:length])
        buf = buf[length:]
    return out


def test_hello_without_lifespan_support(asgi_server):
    srv = asgi_server("asgi_hello:app")
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        for _ in range(20):                                   # one kept-alive connection
            r = c.get("/")
            assert r.status_code == 200 and r.content == b"Hello, world!"
            assert r.headers["content-length"] == "13"
        r = c.head("/")
        assert r.status_code == 200 and r.content == b""


def test_hello_pipelined_requests_answered_in_order(asgi_server):
    srv = asgi_server("asgi_hello:app")
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        req = f"GET /{{}} HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n\r\n"
        s.sendall("".join(req.format(i) for i in range(3)).encode())
        got = read_responses(s, 3)
    assert all(r.startswith(b"HTTP/1.1 200 ") and r.endswith(b"\r\n\r\nHello, world!")
               for r in got), got


def test_lifespan_state_reaches_each_request_as_a_copy(asgi_server):
    srv = asgi_server("asgi_lifespan:app")
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        first = c.get("/").json()
        assert first["greeting"] == "hello from startup" and first["startup_recorded"] is True
        assert first["state_pid"] == first["pid"]
        assert "added" in c.get("/mutate").json()["keys"]
        # the mutation was made on that request's copy of the state
        assert c.get("/").json()["keys"] == ["greeting", "pid"]
    pid = first["pid"]
    assert srv.record(f"lifespan-startup-{pid}")["pid"] == pid
    assert not (srv.records / f"lifespan-shutdown-{pid}").exists()
    srv.stop()
    assert srv.record(f"lifespan-shutdown-{pid}")["served"] == 3
