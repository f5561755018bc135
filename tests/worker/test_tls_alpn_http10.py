"""Issue 35 review of §22 (ALPN without http/1.1 refused): the fix refuses
every offer that lacks "http/1.1", including one of "http/1.0" alone,
which is HTTP sockherd speaks. `curl --http1.0` offers exactly that
(ALPN "http/1.0"), and so do other HTTP/1.0 clients: their handshake now
fails with no_application_protocol where it was served before. nginx,
which the fix cites, selects from "http/1.1", "http/1.0" and "http/0.9"
(ngx_http_ssl_alpn_select, NGX_HTTP_ALPN_PROTOS) and serves them.

A real engine on loopback with Python's ssl as the client (as
test_tls_alpn.py)."""
from __future__ import annotations

import ssl

import pytest

from test_tls_http import app
from tls_support import make_pki, read_response, tls_connect

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_an_offer_of_http10_alone_is_served(serve_wsgi, pki, version):
    _, addr = serve_wsgi(app, **pki.settings())
    ctx = pki.context(maximum_version=version)
    ctx.set_alpn_protocols(["http/1.0"])
    with tls_connect(addr, ctx) as s:
        assert s.selected_alpn_protocol() == "http/1.0"
        s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        assert read_response(s)[1] == b"hello https"
