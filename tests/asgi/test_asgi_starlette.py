"""A real Starlette app (tests/apps/asgi_starlette.py) served by a real
server, httpx as the client (issue 22 §4): routing, the scope as the ASGI
spec words it (percent-decoded path beside raw_path, lower-cased headers in
order, client and server), request bodies whole and chunked, a streaming
response, and request.is_disconnected() turning true when the client goes
away during a long poll. Each test runs against every server kind of
conftest.py (uvicorn only with SOCKHERD_ASGI_REFERENCE=1)."""
from __future__ import annotations

import hashlib
import os
import socket
import uuid

import httpx
import pytest

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def starlette_app(shared_asgi_server):
    """One server for the module's tests that only send requests; what a
    test leaves in the records carries a tag of its own (fresh())."""
    return shared_asgi_server("asgi_starlette:app")


def fresh(name: str) -> str:
    """name made unique to this run of the test (the records dir is shared)."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def test_routes_and_query(starlette_app):
    with httpx.Client(base_url=starlette_app.url, timeout=30) as c:
        r = c.get("/")
        assert r.status_code == 200 and r.text == "starlette home"
        assert r.headers["content-length"] == str(len("starlette home"))
        assert c.get("/hello/ada", params={"q": "x y"}).text == "hello ada q=x y"
        assert c.get("/missing").status_code == 404
        assert c.post("/").status_code == 405


def test_scope_fields(starlette_app):
    srv = starlette_app
    headers = [("X-First", "One"), ("X-Dup", "a"), ("X-Dup", "b")]
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        s = c.get("/scope/caf%C3%A9/x%2Fy?b=1&a=%20", headers=headers).json()
    assert s["type"] == "http" and s["asgi"]["version"] == "3.0" and "spec_version" in s["asgi"]
    assert (s["http_version"], s["method"], s["scheme"]) == ("1.1", "GET", "http")
    assert s["path"] == "/scope/café/x/y"                       # percent-decoded UTF-8
    assert s["raw_path"] == "/scope/caf%C3%A9/x%2Fy"
    assert s["query_string"] == "b=1&a=%20" and s["root_path"] == ""
    names = [k for k, _ in s["headers"]]
    assert all(k == k.lower() for k in names)
    assert [h for h in s["headers"] if h[0].startswith("x-")] == \
        [["x-first", "One"], ["x-dup", "a"], ["x-dup", "b"]]
    assert ["host", f"127.0.0.1:{srv.port}"] in s["headers"]
    assert s["client"][0] == "127.0.0.1" and isinstance(s["client"][1], int)
    assert s["server"] == ["127.0.0.1", srv.port]


def test_request_body_whole_and_chunked(starlette_app):
    data = os.urandom(2 << 20)
    want = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    with httpx.Client(base_url=starlette_app.url, timeout=60) as c:
        assert c.post("/body", content=data).json() == want

        def blocks():                           # no length: Transfer-Encoding: chunked
            for i in range(0, len(data), 100_000):
                yield data[i:i + 100_000]
        assert c.post("/body", content=blocks()).json() == want
        assert c.post("/body", content=b"").json() == {"size": 0,
                                                       "sha256": hashlib.sha256(b"").hexdigest()}


def test_streaming_response(starlette_app):
    with httpx.Client(base_url=starlette_app.url, timeout=30) as c:
        r = c.get("/stream", params={"n": 50})
        assert r.status_code == 200
        assert r.text == "".join(f"chunk {i};" for i in range(50))
        assert r.headers.get("transfer-encoding") == "chunked"
        assert "content-length" not in r.headers
        assert c.get("/").text == "starlette home"          # the connection serves on


def test_is_disconnected_turns_true_when_the_client_goes(starlette_app):
    srv, d1 = starlette_app, fresh("d1")
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    try:
        s.sendall(f"GET /wait-disconnect/{d1} HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n\r\n"
                  .encode())
        srv.record(f"waiting-{d1}")
    finally:
        s.close()
    rec = srv.record(f"disconnected-{d1}", timeout=15)
    assert "timed_out" not in rec, rec


def test_file_response_goes_out_by_pathsend(starlette_app):
    """Starlette's FileResponse sends http.response.pathsend when the scope
    advertises it (issue 22 §2, Extensions): the file whole, its length,
    HEAD without a body, the connection kept."""
    srv, blob = starlette_app, fresh("blob")
    data = os.urandom(5 << 20) + b"end"
    (srv.records / f"{blob}.bin").write_bytes(data)
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        r = c.get(f"/file/{blob}.bin", headers={"X-Record": blob})
        assert r.status_code == 200 and r.content == data
        assert r.headers["content-length"] == str(len(data))
        h = c.head(f"/file/{blob}.bin")
        assert h.status_code == 200 and h.content == b""
        assert h.headers["content-length"] == str(len(data))
        assert c.get("/").text == "starlette home"          # the connection serves on
    sent = srv.record(f"sends-{blob}")["types"]
    if srv.kind == "sockherd":                             # uvicorn has no pathsend
        assert sent == ["http.response.start", "http.response.pathsend"], sent


def test_a_slow_file_download_leaves_the_worker_serving(asgi_server):
    """One worker with one loop thread: a 40 MB FileResponse to a client
    that reads a little and then pauses never holds that thread: other
    clients are answered meanwhile; then the download completes intact."""
    srv = asgi_server("asgi_starlette:app", "--threads", "1", workers=1)
    data = os.urandom(40 << 20)
    (srv.records / "big.bin").write_bytes(data)
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        s.sendall(f"GET /file/big.bin HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n\r\n".encode())
        got = bytearray(s.recv(65536))
        assert got.startswith(b"HTTP/1.1 200 OK") and b"\r\n\r\n" in got, got[:200]
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            for i in range(10):
                assert c.get("/hello/x", params={"q": str(i)}).text == f"hello x q={i}"
        want = got.index(b"\r\n\r\n") + 4 + len(data)
        while len(got) < want:
            chunk = s.recv(1 << 20)
            assert chunk, f"EOF after {len(got)} bytes"
            got += chunk
    finally:
        s.close()
    assert bytes(got).partition(b"\r\n\r\n")[2] == data
