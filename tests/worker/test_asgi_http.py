"""ASGI 3 HTTP on the native engine (issue 22 §2): the scope built in C,
request bodies as http.request messages read as the app asks, responses
framed by the codec (Content-Length or chunked, HEAD/204/304 without a
body, keep-alive and pipelining in order), streaming. A real Loop over a
real fdcore Table on loopback (conftest.py's serve_asgi), raw sockets and
http.client."""
from __future__ import annotations

import asyncio
import http.client
import json
import socket
import time

import pytest

from test_wsgi import raw  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def serve(serve_asgi):
    return serve_asgi


async def hello(scope, receive, send):
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello " + scope["path"].encode()})


def _plain(v):
    if isinstance(v, bytes):
        return {"bytes": v.decode("latin-1")}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


async def echo_scope(scope, receive, send):
    body = json.dumps(_plain(scope)).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [[b"content-type", b"application/json"]]})
    await send({"type": "http.response.body", "body": body})


def head_body(out: bytes) -> tuple[bytes, bytes]:
    head, _, body = out.partition(b"\r\n\r\n")
    return head, body


def test_hello_keep_alive(serve):
    _, addr = serve(hello)
    conn = http.client.HTTPConnection(*addr, timeout=10)
    for path in ("/a", "/b%20c"):
        conn.request("GET", path)
        r = conn.getresponse()
        assert r.status == 200 and r.reason == "OK"
        assert r.read() == b"hello " + path.replace("%20", " ").encode()
        assert r.getheader("Content-Length") and r.getheader("Date")
        assert r.getheader("Content-Type") == "text/plain"
    conn.close()


def test_scope_fields(serve):
    """Every key the spec lists, from the request as sent."""
    _, addr = serve(echo_scope, root_path="/mnt")
    req = (b"POST /mnt/caf%C3%A9%2Fx?q=%20a&b HTTP/1.1\r\nHost: example.org\r\n"
           b"X-Mixed-Case: One \r\nx-mixed-case: two\r\nContent-Length: 0\r\n"
           b"Connection: close\r\n\r\n")
    head, body = head_body(raw(addr, req))
    assert head.startswith(b"HTTP/1.1 200 OK")
    s = json.loads(body)
    assert s["type"] == "http"
    assert s["asgi"] == {"version": "3.0", "spec_version": "2.4"}
    assert s["http_version"] == "1.1" and s["method"] == "POST" and s["scheme"] == "http"
    assert s["path"] == "/mnt/café/x"                     # decoded, UTF-8, %2F too
    assert s["raw_path"] == {"bytes": "/mnt/caf%C3%A9%2Fx"}
    assert s["query_string"] == {"bytes": "q=%20a&b"}
    assert s["root_path"] == "/mnt"
    assert s["headers"] == [[{"bytes": "host"}, {"bytes": "example.org"}],
                            [{"bytes": "x-mixed-case"}, {"bytes": "One"}],
                            [{"bytes": "x-mixed-case"}, {"bytes": "two"}],
                            [{"bytes": "content-length"}, {"bytes": "0"}],
                            [{"bytes": "connection"}, {"bytes": "close"}]]
    assert s["client"][0] == "127.0.0.1" and isinstance(s["client"][1], int)
    assert s["server"] == [addr[0], addr[1]]
    assert "state" not in s


def test_scope_http10_and_state_copied(serve):
    """HTTP/1.0; the lifespan state is shallow-copied into each request."""
    state = {"db": "pool"}
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["state"])
        scope["state"]["mutated"] = True              # never reaches the next request
        await echo_scope(scope, receive, send)

    _, addr = serve(app, state=state)
    for _ in range(2):
        head, body = head_body(raw(addr, b"GET / HTTP/1.0\r\n\r\n"))
        assert head.startswith(b"HTTP/1.1 200 OK") and b"Connection: close" in head
        s = json.loads(body)
        assert s["http_version"] == "1.0" and s["state"]["db"] == "pool"
    assert seen[0] is not seen[1] and state == {"db": "pool"}


def test_keys_an_app_adds_to_its_scope_stay_in_that_request(serve):
    """Each request's scope is a copy of a base the Server keeps sized for a
    whole scope (asgi_scope.c asgi_scope_base): what an app adds to one
    (as Starlette and FastAPI add their keys; past the room kept, too) and
    what it changes in the asgi dict reach no later request, and the keys
    come in the base's order first."""
    seen = []

    async def app(scope, receive, send):
        seen.append(list(scope))
        for i in range(40):
            scope[f"app_{i}"] = i
        scope["asgi"]["app"] = True
        scope["type"] = "changed"
        await echo_scope(scope, receive, send)

    _, addr = serve(app)
    conn = http.client.HTTPConnection(*addr, timeout=10)
    for _ in range(3):
        conn.request("GET", "/")
        r = conn.getresponse()
        s = json.loads(r.read())
        assert r.status == 200 and s["app_39"] == 39 and s["type"] == "changed"
    conn.close()
    assert seen[0] == seen[1] == seen[2]
    assert seen[0][:4] == ["type", "asgi", "scheme", "root_path"]
    assert not any(k.startswith("app_") for k in seen[2])


def test_body_in_pieces_as_the_app_asks(serve):
    """A body larger than body_buffer streams: each receive() gives what is
    here, more_body until the end; the client's pieces arrive while the app
    already runs."""
    got = []

    async def app(scope, receive, send):
        while True:
            msg = await receive()
            assert msg["type"] == "http.request"
            got.append(msg["body"])
            if not msg["more_body"]:
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"%d" % len(b"".join(got))})

    _, addr = serve(app, body_buffer=0)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 300000\r\n\r\n")
        for _ in range(3):
            c.sendall(b"x" * 100000)
            time.sleep(0.05)
        out = b""
        while not out.endswith(b"300000"):
            chunk = c.recv(65536)
            assert chunk, out
            out += chunk
    assert out.startswith(b"HTTP/1.1 200 OK")
    assert b"".join(got) == b"x" * 300000 and len(got) > 1


def test_chunked_request_body(serve):
    async def app(scope, receive, send):
        parts = []
        more = True
        while more:
            msg = await receive()
            parts.append(msg["body"])
            more = msg["more_body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"|".join(parts)})

    _, addr = serve(app)
    out = raw(addr, b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
                    b"Connection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
    head, body = head_body(out)
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert body.replace(b"|", b"") == b"hello world"


def test_whole_body_then_disconnect_after_response(serve):
    """A small body comes whole in one message; after the response, a
    receive() says http.disconnect at once (ASGI 2.4)."""
    after = []

    async def app(scope, receive, send):
        msg = await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": msg["body"][::-1]})
        after.append(await receive())

    _, addr = serve(app)
    out = raw(addr, b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nConnection: close\r\n"
                    b"\r\nabcde")
    assert head_body(out)[1] == b"edcba"
    deadline = time.monotonic() + 5
    while not after and time.monotonic() < deadline:
        time.sleep(0.01)
    assert after == [{"type": "http.disconnect"}]


def test_streaming_first_chunk_before_the_second(serve):
    """Time to first byte: the first part is on the wire while the app
    still waits to send the second; no Content-Length: chunked."""
    release = asyncio.Event()
    loops = []

    async def app(scope, receive, send):
        loops.append(asyncio.get_running_loop())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        await release.wait()
        await send({"type": "http.response.body", "body": b"second", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    _, addr = serve(app)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        out = b""
        while b"first" not in out:
            chunk = c.recv(65536)
            assert chunk, out
            out += chunk
        assert b"Transfer-Encoding: chunked" in out and b"second" not in out
        loops[0].call_soon_threadsafe(release.set)
        while True:
            chunk = c.recv(65536)
            if not chunk:
                break
            out += chunk
    assert out.endswith(b"5\r\nfirst\r\n6\r\nsecond\r\n0\r\n\r\n")


def test_head_204_304_have_no_body(serve):
    async def app(scope, receive, send):
        status = int(scope["path"][1:] or 200)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-length", b"4")] if status == 200 else []})
        await send({"type": "http.response.body", "body": b"body"})

    _, addr = serve(app)
    out = raw(addr, b"HEAD / HTTP/1.1\r\nHost: h\r\n\r\nGET /204 HTTP/1.1\r\nHost: h\r\n\r\n"
                    b"GET /304 HTTP/1.1\r\nHost: h\r\n\r\nGET /200 HTTP/1.1\r\nHost: h\r\n"
                    b"Connection: close\r\n\r\n")
    parts = out.split(b"HTTP/1.1 ")[1:]
    assert [p[:3] for p in parts] == [b"200", b"204", b"304", b"200"]
    assert b"content-length: 4\r\n" in parts[0] and parts[0].endswith(b"\r\n\r\n")  # HEAD
    assert parts[1].endswith(b"\r\n\r\n") and b"body" not in parts[1]
    assert parts[2].endswith(b"\r\n\r\n") and b"body" not in parts[2]
    assert parts[3].endswith(b"\r\n\r\nbody")


def test_pipelined_requests_answered_in_order(serve_asgi):
    """Pipelined requests, arriving while the first one's app still runs:
    each waits for the one before (slower than it); the answers come in
    request order on one connection."""
    async def app(scope, receive, send):
        n = int(scope["path"][1:])
        await asyncio.sleep(0.05 * (5 - n))         # the first is the slowest
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"<%d>" % n})

    _, addr = serve_asgi(app)
    with socket.create_connection(addr, timeout=10) as c:
        for i in range(5):
            c.sendall(b"GET /%d HTTP/1.1\r\nHost: h\r\n\r\n" % i)
            time.sleep(0.02)                        # a read of its own, the first app runs
        c.sendall(b"GET /5 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        out = b""
        while chunk := c.recv(65536):
            out += chunk
    bodies = [p.rsplit(b"\r\n\r\n", 1)[1] for p in out.split(b"HTTP/1.1 200 OK")[1:]]
    assert bodies == [b"<%d>" % i for i in range(6)]


def test_app_content_length_and_connection_close(serve):
    """The app's Content-Length frames the body (sent in parts); its
    Connection: close ends the connection after the response."""
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"Content-Length", b"6"), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": b"abc", "more_body": True})
        await send({"type": "http.response.body", "body": b"def"})

    _, addr = serve(app)
    out = raw(addr, b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")      # the server closes
    head, body = head_body(out)
    assert head.startswith(b"HTTP/1.1 201 Created") and b"Content-Length: 6" in head
    assert b"Connection: close" in head and b"chunked" not in head and body == b"abcdef"


def test_expect_100_continue_when_the_app_reads(serve):
    async def app(scope, receive, send):
        msg = await receive()
        body = msg["body"]
        while msg["more_body"]:
            msg = await receive()
            body += msg["body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    _, addr = serve(app, body_buffer=0)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nExpect: 100-continue\r\n"
                  b"Connection: close\r\n\r\n")
        assert c.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        c.sendall(b"ping")
        out = b""
        while chunk := c.recv(65536):
            out += chunk
    assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"\r\n\r\nping")
