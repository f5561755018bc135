"""A trusted proxy's scheme and host over a TLS connection (issue 35 point
20). The TLS step puts HTTPS=on and wsgi.url_scheme https in the environ;
a trusted `X-Forwarded-Proto: http` then said the request was http in
wsgi.url_scheme but left HTTPS=on (an app asking HTTPS, as CGI code and
Django's SECURE_PROXY_SSL_HEADER-less setups do, saw https), and an
`X-Forwarded-Host` without a port gave SERVER_PORT 80 on a TLS
connection whose scheme nothing changed. Now HTTPS is there exactly when
the request's scheme is https, and a host's default port is that
scheme's: the proxy's word if it said one, else the connection's.

A real worker Loop over a real fdcore Table (conftest.py's serve_wsgi /
serve_asgi) on loopback with certfile set (certificates made at test
time), Python's ssl as the client, the test as the trusted proxy."""
from __future__ import annotations

import json

import pytest

from tls_support import make_pki, read_response, tls_connect

pytestmark = pytest.mark.timeout(60)

KEYS = ("wsgi.url_scheme", "HTTPS", "HTTP_HOST", "SERVER_NAME", "SERVER_PORT", "SSL_PROTOCOL")
TRUST = {"forwarded_allow_ips": ["127.0.0.1"], "forwarder_headers": ["X-Forwarded-Host"]}


def app(environ, start_response):
    body = json.dumps({k: environ.get(k) for k in KEYS}).encode()
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]


async def scope_app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = json.dumps({"scheme": scope["scheme"]}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def ask(addr, pki, *fields: str) -> dict:
    head = "".join(f"{f}\r\n" for f in ("GET / HTTP/1.1", "Host: backend.local", *fields))
    with tls_connect(addr, pki.context()) as s:
        s.sendall((head + "Connection: close\r\n\r\n").encode())
        status, body = read_response(s)
    assert status.startswith(b"HTTP/1.1 200 "), status
    return json.loads(body)


def test_proto_http_over_tls_drops_https_on(serve_wsgi, pki):
    _, addr = serve_wsgi(app, **pki.settings(**TRUST))
    env = ask(addr, pki, "X-Forwarded-Proto: http")
    assert (env["wsgi.url_scheme"], env["HTTPS"]) == ("http", None)
    assert env["SSL_PROTOCOL"]                       # the connection's own keys stay
    env = ask(addr, pki)                             # nothing said: the connection's
    assert (env["wsgi.url_scheme"], env["HTTPS"]) == ("https", "on")


def test_a_host_without_port_takes_the_scheme_of_the_request(serve_wsgi, pki):
    _, addr = serve_wsgi(app, **pki.settings(**TRUST))
    env = ask(addr, pki, "X-Forwarded-Host: shop.example")
    assert (env["HTTP_HOST"], env["SERVER_NAME"], env["SERVER_PORT"]) == \
        ("shop.example", "shop.example", "443")
    env = ask(addr, pki, "X-Forwarded-Host: shop.example", "X-Forwarded-Proto: http")
    assert (env["SERVER_PORT"], env["HTTPS"]) == ("80", None)
    env = ask(addr, pki, "X-Forwarded-Host: shop.example:8443", "X-Forwarded-Proto: http")
    assert env["SERVER_PORT"] == "8443"              # a port said is kept


def test_an_untrusted_peer_changes_nothing_over_tls(serve_wsgi, pki):
    _, addr = serve_wsgi(app, **pki.settings(forwarded_allow_ips=[],
                                             forwarder_headers=["X-Forwarded-Host"]))
    env = ask(addr, pki, "X-Forwarded-Proto: http", "X-Forwarded-Host: shop.example")
    assert env == ask(addr, pki)
    assert (env["wsgi.url_scheme"], env["HTTPS"]) == ("https", "on")


def test_asgi_scheme_follows_the_proxy_over_tls(serve_asgi, pki):
    _, addr = serve_asgi(scope_app, **pki.settings(**TRUST))
    assert ask(addr, pki, "X-Forwarded-Proto: http") == {"scheme": "http"}
    assert ask(addr, pki) == {"scheme": "https"}
