"""ALPN (issue 35 §22; worker/native/conn/conn_tls_ctx.c alpn_select), on a
real engine on loopback with Python's ssl and openssl s_client as clients.

Finding reproduced: a client whose ALPN offer did not contain http/1.1
(only h2, say) went on without ALPN and was served HTTP/1.1, which it had
not offered to speak; RFC 7301 §3.2 says the server refuses it with the
no_application_protocol alert (nginx does; the comment that said nginx
goes on was wrong). Now such a handshake fails with that alert (counted
as failed); an offer with http/1.1 in it gets http/1.1, and a client that
sends no ALPN extension at all is served as before."""
from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess

import pytest

from test_http_parser_and_wsgi_framing import wait_for
from test_tls_http import app
from tls_support import make_pki, read_response, tls_connect

pytestmark = pytest.mark.timeout(90)

CLIENT_ENV = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def hello(s) -> bytes:
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    return read_response(s)[1]


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_an_offer_without_http11_is_refused_with_no_application_protocol(serve_wsgi, pki,
                                                                         version):
    loop, addr = serve_wsgi(app, **pki.settings())
    ctx = pki.context(maximum_version=version)
    ctx.set_alpn_protocols(["h2", "spdy/3"])
    with pytest.raises(ssl.SSLError, match="alert no application protocol"):
        with tls_connect(addr, ctx) as s:
            hello(s)                     # served before: b'hello https'
    wait_for(lambda: loop.engine.tls_counts()["handshake_failed"] == 1, 10, "failed counted")


def test_openssl_s_client_sees_the_alert(serve_wsgi, pki):
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed (make test installs it)")
    _, addr = serve_wsgi(app, **pki.settings())
    r = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{addr[1]}", "-CAfile",
                        str(pki.ca_file), "-alpn", "h2", "-quiet"],
                       input=b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                       capture_output=True, timeout=30, env=CLIENT_ENV)
    assert r.returncode != 0 and b"HTTP/1.1 200" not in r.stdout, r.stdout
    assert b"no application protocol" in r.stderr, r.stderr


def test_an_offer_with_http11_among_others_gets_it(serve_wsgi, pki):
    _, addr = serve_wsgi(app, **pki.settings())
    ctx = pki.context()
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    with tls_connect(addr, ctx) as s:
        assert s.selected_alpn_protocol() == "http/1.1"
        assert hello(s) == b"hello https"


def test_a_client_without_alpn_is_served(serve_wsgi, pki):
    _, addr = serve_wsgi(app, **pki.settings())
    with tls_connect(addr, pki.context()) as s:
        assert s.selected_alpn_protocol() is None
        assert hello(s) == b"hello https"
    raw = socket.create_connection(addr, timeout=10)      # and in TLS 1.2
    with pki.context(maximum_version=ssl.TLSVersion.TLSv1_2).wrap_socket(
            raw, server_hostname="127.0.0.1") as s:
        assert hello(s) == b"hello https"
