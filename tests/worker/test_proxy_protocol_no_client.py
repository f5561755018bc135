"""A PROXY header that names no client hands no trust to it (issue 35
point 16): v1 `PROXY UNKNOWN`, v2 LOCAL and v2 PROXY over UNSPEC leave the
socket's addresses, and the connection used to keep the trust of the
socket's peer, the proxy (127.0.0.1, in the default forwarded_allow_ips):
the client's own X-Forwarded-For and X-Forwarded-Proto were believed.
HAProxy sends such a header for every connection of a unix-socket
frontend to a TCP server (v1 UNKNOWN; v2 LOCAL, UNSPEC), so any client of
it could choose its REMOTE_ADDR and scheme. The bytes after the header are
the unnamed client's, which only "*" trusts.

A real worker Loop over a real fdcore Table (conftest.py's serve_wsgi /
serve_asgi) on loopback, the test as the proxy sending the header; and,
when haproxy is installed, HAProxy itself with a unix-socket frontend in
front of it."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time

import pytest

import proxy_reference as ref
from test_proxy_protocol_http import body_of, exchange, scope_app

pytestmark = pytest.mark.timeout(60)

NO_CLIENT = {
    "v1 UNKNOWN": b"PROXY UNKNOWN\r\n",
    "v1 UNKNOWN with addresses": b"PROXY UNKNOWN 1.2.3.4 5.6.7.8 1 2\r\n",
    "v2 LOCAL": ref.v2(command=0),
    "v2 LOCAL UNSPEC": ref.v2(command=0, fam=0x00, addresses=b""),
    "v2 PROXY UNSPEC": ref.v2(fam=0x00, addresses=b""),
}
SPOOF = (b"GET /x HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 10.9.9.9\r\n"
         b"X-Forwarded-Proto: https\r\nForwarded: for=10.8.8.8;proto=https\r\n\r\n")


def app(environ, start_response):
    body = json.dumps({k: environ.get(k) for k in
                       ("REMOTE_ADDR", "wsgi.url_scheme", "HTTPS", "proxy.local")}).encode()
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(body)))])
    return [body]


@pytest.mark.parametrize("name", sorted(NO_CLIENT))
def test_an_unnamed_client_is_not_trusted_with_forwarding_fields(serve_wsgi, name):
    _, a = serve_wsgi(app, proxy_protocol="auto", proxy_allow_from=["127.0.0.0/8"],
                      forwarded_allow_ips=["127.0.0.1", "::1", "unix"])
    seen = body_of(exchange(a, NO_CLIENT[name] + SPOOF))
    assert seen == {"REMOTE_ADDR": "127.0.0.1", "wsgi.url_scheme": "http", "HTTPS": None,
                    "proxy.local": True}


@pytest.mark.parametrize("name", sorted(NO_CLIENT))
def test_star_trusts_it_as_every_peer(serve_wsgi, name):
    _, a = serve_wsgi(app, proxy_protocol="auto", proxy_allow_from=["127.0.0.0/8"],
                      forwarded_allow_ips=["*"])
    seen = body_of(exchange(a, NO_CLIENT[name] + SPOOF))
    assert (seen["REMOTE_ADDR"], seen["wsgi.url_scheme"]) == ("10.8.8.8", "https")


def test_the_same_in_the_asgi_scope(serve_asgi):
    _, a = serve_asgi(scope_app, proxy_protocol="auto", proxy_allow_from=["127.0.0.0/8"])
    for header in NO_CLIENT.values():
        seen = body_of(exchange(a, header + SPOOF))
        assert seen["client"][0] == "127.0.0.1", (header, seen)


def test_a_named_client_still_judged_by_its_address(serve_wsgi):
    """Unchanged: a header naming a trusted client keeps its fields."""
    _, a = serve_wsgi(app, proxy_protocol="v2", proxy_allow_from=["127.0.0.0/8"],
                      forwarded_allow_ips=["203.0.113.0/24"])
    seen = body_of(exchange(a, ref.v2("203.0.113.9", "127.0.0.1", 4444, 80) + SPOOF))
    assert (seen["REMOTE_ADDR"], seen["wsgi.url_scheme"]) == ("10.8.8.8", "https")


# ---- HAProxy's unix-socket frontend ---------------------------------------------------------

HAPROXY = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy")
                                      else None)
CFG = """
global
    maxconn 100
defaults
    mode tcp
    timeout connect 5s
    timeout client 10s
    timeout server 10s
frontend unixfront
    bind unix@{sock}
    default_backend app
backend app
    server s1 127.0.0.1:{port} {send}
"""


@pytest.mark.skipif(HAPROXY is None, reason="no haproxy installed")
@pytest.mark.parametrize("send", ["send-proxy", "send-proxy-v2"])
def test_through_haproxys_unix_socket_frontend(serve_wsgi, tmp_path, send):
    _, (host, port) = serve_wsgi(app, proxy_protocol="auto", proxy_allow_from=["127.0.0.0/8"])
    sock = tmp_path / "front.sock"
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(CFG.format(sock=sock, port=port, send=send))
    with open(tmp_path / "haproxy.log", "wb") as log:
        proc = subprocess.Popen([HAPROXY, "-db", "-f", str(cfg)], stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while not sock.exists():
            assert proc.poll() is None, (tmp_path / "haproxy.log").read_text()
            assert time.monotonic() < deadline, "haproxy never bound its socket"
            time.sleep(0.05)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.settimeout(10)
            c.connect(str(sock))
            c.sendall(SPOOF.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
            answer = b"".join(iter(lambda: c.recv(65536), b""))
    finally:
        proc.kill()
        proc.wait(timeout=10)
    seen = body_of(answer)
    assert seen["proxy.local"] is True, seen
    assert (seen["REMOTE_ADDR"], seen["wsgi.url_scheme"]) == ("127.0.0.1", "http")
