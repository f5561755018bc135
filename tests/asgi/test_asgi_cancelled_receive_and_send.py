"""A receive() or send() the app stops waiting for (asyncio.wait_for's
timeout, a cancelled task) leaves the request readable and the response
writable (review of issue 22's
adapter, finding 2): the cancelled future stayed the call's waiting
receive, so the app's next receive() was refused as "called while another
receive() waits" (a 500), and body bytes that came meanwhile were taken
out of the parser for that dead future and lost."""
from __future__ import annotations

import socket

import httpx
import pytest

pytestmark = pytest.mark.timeout(120)


def read_response(s: socket.socket) -> bytes:
    out = b""
    while b"\r\n\r\n" not in out or not out.endswith(b"hello"):
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
    return out


@pytest.mark.parametrize("query", ["", "late"])
def test_a_receive_that_timed_out_leaves_the_body_to_the_next(asgi_server, query):
    """The next receive() comes before the body (""), or after the server
    read it with no receive() waiting ("late": it was taken for the dead
    future, and that receive() waited forever)."""
    # --body-buffer 0: the app runs before its body came (else the loop
    # reads a small body whole first and receive() never waits)
    srv = asgi_server("asgi_misbehaving:app", "--body-buffer", "0")
    with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as s:
        s.sendall(f"POST /receive-with-timeout?{query} HTTP/1.1\r\nHost: h\r\n"
                  f"Content-Length: 5\r\n\r\n".encode())
        srv.record("receive-timed-out")
        s.sendall(b"hello")
        (srv.records / "body-sent").write_text("{}")
        out = read_response(s)
    assert out.startswith(b"HTTP/1.1 200 ") and out.endswith(b"\r\n\r\nhello"), \
        f"{out!r}\n{srv.text()}"


def test_a_send_that_timed_out_leaves_the_response_to_the_next(asgi_server):
    """The same for a send() waiting for its client to read (past the
    high water mark): its cancelled future refused the app's next send()
    ("while another send() waits") and the response was cut."""
    srv = asgi_server("asgi_misbehaving:app")
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        with c.stream("GET", "/send-with-timeout") as r:
            sent = srv.record("send-timed-out")["sent"]      # read nothing before this
            body = r.read()
    # the send that timed out wrote its chunk before it waited (sockherd), or
    # waited before writing it (uvicorn): either way nothing else is lost
    assert r.status_code == 200 and len(body) - 3 in (sent, sent - 65536) and \
        body.endswith(b"xend"), f"{len(body)} bytes of {sent} + 3\n{srv.text()}"
