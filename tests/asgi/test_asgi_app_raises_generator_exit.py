"""An app that raises GeneratorExit itself is answered as any other
raising app (review of issue 22's adapter, finding 3): the runner let
GeneratorExit through untouched (taking it for its own coroutine being
closed), so the call never ended: no 500, the connection held open with
nothing to say until the client gave up."""
from __future__ import annotations

import socket

import pytest

pytestmark = pytest.mark.timeout(120)


def exchange(port: int, path: str) -> bytes:
    """The whole answer to one request, until the server closes."""
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: h\r\n\r\n".encode())
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_generator_exit_before_the_response_is_a_500(asgi_server):
    srv = asgi_server("asgi_misbehaving:app")
    out = exchange(srv.port, "/generator-exit")
    assert out.startswith(b"HTTP/1.1 500 ") and b"Traceback" not in out, out
    if srv.master:                                    # sockherd's words (uvicorn has its own)
        srv.master.wait_log(r"app failed on GET /generator-exit")


def test_generator_exit_mid_body_cuts_the_connection(asgi_server):
    srv = asgi_server("asgi_misbehaving:app")
    out = exchange(srv.port, "/generator-exit-mid-body")
    assert out.startswith(b"HTTP/1.1 200 ") and b"first" in out and not out.endswith(b"0\r\n\r\n")
    if srv.master:
        srv.master.wait_log(r"app failed on GET /generator-exit-mid-body")
