"""A PROXY v2 header whose source is AF_UNIX, on a TCP connection (issue 35
point 21): the path is raw bytes the proxy copied, no address. It used to
become REMOTE_ADDR (REMOTE_PORT ""), the ASGI `client` None and `server`
`[[host, port], None]`, and CR/LF in it forged a line of the access log.
Now the socket's addresses are kept (the path stays in proxy.src), and the
access log writes every value's control bytes as \\xHH (nginx's escaping),
whoever wrote the value: a PROXY path, a request header, the app's
environ key.

A real worker Loop over a real fdcore Table (conftest.py's serve_wsgi /
serve_asgi) on loopback, the test as the proxy; the access log a real
file, read after each response with a deadline."""
from __future__ import annotations

import json
import socket
import time

import pytest

import proxy_reference as ref
from test_proxy_protocol_http import body_of, scope_app

pytestmark = pytest.mark.timeout(60)

FORGED = b"/run/c.sock\r\n6.6.6.6 GET /admin HTTP/1.1 200\r\n"
BLOCK = FORGED.ljust(108, b"\0") + b"/run/server.sock".ljust(108, b"\0")
HEADER = ref.v2(addresses=BLOCK, fam=0x31)
GET = b"GET /x HTTP/1.1\r\nHost: h\r\nUser-Agent: ua\x9bx\r\n\r\n"


def app(environ, start_response):
    environ["x.note"] = "one\ntwo"                   # the app's own key, logged by %({x.note}e)s
    body = json.dumps({k: environ.get(k) for k in
                       ("REMOTE_ADDR", "REMOTE_PORT", "SERVER_NAME", "SERVER_PORT",
                        "proxy.src", "proxy.local")}).encode()
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(body)))])
    return [body]


def talk(addr, data: bytes) -> tuple[bytes, tuple, tuple]:
    """The answer, and the client socket's own and peer addresses."""
    with socket.create_connection(addr, timeout=10) as c:
        mine, theirs = c.getsockname(), c.getpeername()
        c.sendall(data)
        c.shutdown(socket.SHUT_WR)
        return b"".join(iter(lambda: c.recv(65536), b"")), mine, theirs


def test_the_socket_addresses_are_kept_in_the_environ(serve_wsgi):
    _, a = serve_wsgi(app, proxy_protocol="v2", proxy_allow_from=["127.0.0.0/8"])
    answer, mine, theirs = talk(a, HEADER + GET)
    seen = body_of(answer)
    assert (seen["REMOTE_ADDR"], seen["REMOTE_PORT"]) == (mine[0], str(mine[1]))
    assert (seen["SERVER_NAME"], seen["SERVER_PORT"]) == (theirs[0], str(theirs[1]))
    assert seen["proxy.src"] == FORGED.decode()     # what the header told, given whole


def test_the_asgi_client_and_server_stay_host_port_pairs(serve_asgi):
    _, a = serve_asgi(scope_app, proxy_protocol="v2", proxy_allow_from=["127.0.0.0/8"])
    answer, mine, theirs = talk(a, HEADER + GET)
    seen = body_of(answer)
    assert seen["client"] == [mine[0], mine[1]]
    assert seen["proxy"]["src"] == FORGED.decode()


def test_asgi_server_is_the_socket_address(serve_asgi):
    async def server_app(scope, receive, send):
        if scope["type"] != "http":
            return
        body = json.dumps({"server": scope["server"], "client": scope["client"]}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    _, a = serve_asgi(server_app, proxy_protocol="v2", proxy_allow_from=["127.0.0.0/8"])
    answer, mine, theirs = talk(a, HEADER + GET)
    assert body_of(answer) == {"server": [theirs[0], theirs[1]], "client": [mine[0], mine[1]]}


def test_a_unix_source_is_judged_as_a_unix_peer(serve_wsgi):
    """Its forwarding fields believed with "unix" in forwarded_allow_ips
    only (the client is a unix-socket frontend's)."""
    spoof = b"GET /x HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 10.9.9.9\r\n\r\n"
    _, a = serve_wsgi(app, proxy_protocol="v2", proxy_allow_from=["127.0.0.0/8"])
    answer, mine, _ = talk(a, HEADER + spoof)
    assert body_of(answer)["REMOTE_ADDR"] == mine[0]
    _, a = serve_wsgi(app, proxy_protocol="v2", proxy_allow_from=["127.0.0.0/8"],
                      forwarded_allow_ips=["unix"])
    answer, _, _ = talk(a, HEADER + spoof)
    assert body_of(answer)["REMOTE_ADDR"] == "10.9.9.9"


def read_lines(path, n: int) -> list[str]:
    deadline = time.monotonic() + 10             # the line follows the response
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= n or time.monotonic() > deadline:
            return lines
        time.sleep(0.01)


def test_the_access_log_escapes_control_bytes(serve_wsgi, tmp_path):
    log = tmp_path / "access.log"
    _, a = serve_wsgi(app, proxy_protocol="v2", proxy_allow_from=["127.0.0.0/8"],
                      access_logfile=str(log),
                      access_log_format="%(h)s %({proxy.src}e)s %(a)s %({x.note}e)s %(s)s %(B)d")
    answer, mine, _ = talk(a, HEADER + GET)
    size = len(answer.split(b"\r\n\r\n", 1)[1])
    lines = read_lines(log, 1)
    time.sleep(0.2)                              # nothing more comes
    assert log.read_text().splitlines() == lines
    assert lines == [f"{mine[0]} /run/c.sock\\x0d\\x0a6.6.6.6 GET /admin HTTP/1.1 200\\x0d\\x0a "
                     f"ua\\x9bx one\\x0atwo 200 {size}"]
