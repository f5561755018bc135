"""The head of a response: the app's Date and Server win over ours (never
twice), an app's 1xx final status is a 500 (a 1xx is not a final
response: the next answer would pair with the wrong request), and the
responses the engine makes itself carry a Date. Issue 18 section 4."""
from __future__ import annotations

import socket

import pytest

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def serve(serve_wsgi):
    return serve_wsgi                   # conftest.py


def exchange(addr, data: bytes, timeout: float = 10.0) -> bytes:
    """Sends data, returns everything until the server closes."""
    with socket.create_connection(addr, timeout=timeout) as c:
        c.sendall(data)
        out = b""
        while chunk := c.recv(65536):
            out += chunk
        return out


def head_fields(response: bytes) -> list[bytes]:
    return [line.split(b":", 1)[0].lower()
            for line in response.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]]


def test_app_date_and_server_are_not_doubled(serve):
    """Defect: an app that sets Date or Server got both its own and ours."""
    def app(environ, start_response):
        start_response("200 OK", [("Date", "Thu, 01 Jan 1970 00:00:00 GMT"),
                                  ("server", "myapp/1"), ("Content-Length", "2")])
        return [b"ok"]

    _, addr = serve(app, server_header="sockherd")
    out = exchange(addr, b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    fields = head_fields(out)
    assert fields.count(b"date") == 1 and fields.count(b"server") == 1, out
    assert b"Date: Thu, 01 Jan 1970 00:00:00 GMT\r\n" in out
    assert b"server: myapp/1\r\n" in out and b"Server: sockherd" not in out


def test_our_date_and_server_when_the_app_gives_none(serve):
    """The usual case stays: Date and the configured Server are ours."""
    def app(environ, start_response):
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]

    _, addr = serve(app, server_header="sockherd")
    out = exchange(addr, b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    fields = head_fields(out)
    assert fields.count(b"date") == 1 and b"Server: sockherd\r\n" in out


@pytest.mark.parametrize("status", ["100 Continue", "101 Switching Protocols", "103 Early Hints"])
def test_app_final_1xx_status_is_a_500(serve, status):
    """Defect: an app's final 1xx status went out as the response and the
    connection kept alive, so the next request's answer paired with this
    one: the 1xx is refused (500) and the next request gets its own answer."""
    def app(environ, start_response):
        if environ["PATH_INFO"] == "/bad":
            start_response(status, [])
            return [b""]
        start_response("200 OK", [("Content-Length", "4")])
        return [b"good"]

    _, addr = serve(app)
    out = exchange(addr, b"GET /bad HTTP/1.1\r\nHost: h\r\n\r\n"
                         b"GET /ok HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 500 "), out
    assert b"HTTP/1.1 1" not in out
    # the 500 closes the connection or the next answer is /ok's own
    assert out.count(b"HTTP/1.1 ") == 1 or out.endswith(b"good")


@pytest.mark.parametrize("request_bytes", [
    b"GET / HTTP/1.1\r\n\r\n",                                   # 400: no Host
    b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: h\r\n\r\n",    # 414
    b"GET / HTTP/1.1\r\nHost: h\r\nX: " + b"b" * 40000 + b"\r\n\r\n",   # 431
])
def test_engine_refusals_carry_a_date(serve, request_bytes):
    """Defect: the responses the engine makes itself (400, 408, 413, 414,
    431) had no Date (RFC 9110 6.6.1: an origin server with a clock sends it)."""
    _, addr = serve(lambda e, s: [])
    out = exchange(addr, request_bytes)
    assert out.startswith(b"HTTP/1.1 4"), out[:80]
    assert head_fields(out).count(b"date") == 1, out[:300]


@pytest.mark.parametrize("settings,request_bytes,status", [
    ({"header_timeout": 0.5}, b"GET / HTTP/1.1\r\nHost: h\r\n", b"408"),
    ({"limit_request_body": 5}, b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n"
     b"0123456789", b"413"),
], ids=["408", "413"])
def test_engine_refusals_on_timers_and_body_limits_carry_a_date(serve, settings, request_bytes,
                                                                  status):
    """The same for the refusals of a timer and of the body limit (found by
    the acceptance audit of issue 18: only 400, 414, 431 and 500 were pinned)."""
    _, addr = serve(lambda e, s: [], **settings)
    out = exchange(addr, request_bytes)
    assert out.startswith(b"HTTP/1.1 " + status + b" "), out[:80]
    assert head_fields(out).count(b"date") == 1, out[:300]


def test_app_500_carries_a_date(serve):
    """The 500 the engine makes for a failing app has its Date too."""
    def app(environ, start_response):
        raise RuntimeError("boom")

    _, addr = serve(app)
    out = exchange(addr, b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 500 ") and head_fields(out).count(b"date") == 1
