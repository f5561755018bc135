"""An http.response.start with a 1xx status is the app's error, answered
500 (review of issue 22's adapter, finding 4): a 1xx is an interim
response, never a request's answer; the adapter sent it as the final one,
so the client kept waiting for the real answer and then took the next
pipelined request's response for it (101: took the connection for
switched to another protocol)."""
from __future__ import annotations

import socket

import pytest

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("status", [100, 101, 103, 199])
def test_a_1xx_response_start_is_a_500(asgi_server, status):
    if asgi_server.kind != "sockherd":
        pytest.skip("sockherd's own rule: uvicorn's h11 closes without a response, its "
                    "httptools sends the 1xx as the answer")
    srv = asgi_server("asgi_misbehaving:app")
    out = b""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as s:
        s.sendall(f"GET /informational-status?{status} HTTP/1.1\r\nHost: h\r\n\r\n"
                  f"GET /pid HTTP/1.1\r\nHost: h\r\n\r\n".encode())
        while chunk := s.recv(65536):
            out += chunk
    assert out.startswith(b"HTTP/1.1 500 ") and b"Connection: close" in out, out
    assert out.count(b"HTTP/1.1 ") == 1, out
    srv.master.wait_log(r"status .* informational")
