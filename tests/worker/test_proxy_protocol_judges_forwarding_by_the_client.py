"""The PROXY protocol and the trusted proxy headers together (found at the
merge of the two branches): the client a PROXY header names is who the
forwarded_allow_ips rules judge, not the proxy that sent the header. A
proxy allowed by proxy_allow_from (here loopback, also in the default
forwarded_allow_ips) must not lend its trust to the client's own
X-Forwarded-For: before conn_proxy.c's judge(), trust was decided once, at
accept, for the proxy's address, and a client behind HAProxy could choose
its REMOTE_ADDR with one header."""
from __future__ import annotations

import pytest

import proxy_reference as ref
from test_proxy_protocol_http import GET, body_of, environ_app, exchange

pytestmark = pytest.mark.timeout(60)

SPOOF = b"GET /x HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 10.9.9.9\r\n\r\n"


@pytest.mark.parametrize("header", [ref.v1("203.0.113.9", "127.0.0.1", 4444, 80),
                                    ref.v2("203.0.113.9", "127.0.0.1", 4444, 80)],
                         ids=["v1", "v2"])
def test_a_client_behind_the_proxy_is_not_trusted_with_forwarding_fields(serve_wsgi, header):
    _, a = serve_wsgi(environ_app, proxy_protocol="auto", proxy_allow_from=["127.0.0.0/8"],
                      forwarded_allow_ips=["127.0.0.1", "::1"])
    seen = body_of(exchange(a, header + SPOOF))
    assert seen["REMOTE_ADDR"] == "203.0.113.9"


def test_a_client_in_forwarded_allow_ips_is_trusted(serve_wsgi):
    _, a = serve_wsgi(environ_app, proxy_protocol="v2", proxy_allow_from=["127.0.0.0/8"],
                      forwarded_allow_ips=["203.0.113.0/24"])
    seen = body_of(exchange(a, ref.v2("203.0.113.9", "127.0.0.1", 4444, 80) + SPOOF))
    assert seen["REMOTE_ADDR"] == "10.9.9.9"


def test_a_local_header_does_not_lend_the_proxys_trust(serve_wsgi):
    """v2 LOCAL: no client named, the socket's peer stays as REMOTE_ADDR,
    but not its trust: HAProxy sends LOCAL for connections it relays too
    (issue 35 point 16, test_proxy_protocol_no_client.py)."""
    _, a = serve_wsgi(environ_app, proxy_protocol="v2", proxy_allow_from=["127.0.0.0/8"],
                      forwarded_allow_ips=["127.0.0.1"])
    seen = body_of(exchange(a, ref.v2(command=0) + SPOOF))
    assert seen["REMOTE_ADDR"] == "127.0.0.1"
    assert body_of(exchange(a, ref.v2(command=0) + GET))["REMOTE_ADDR"] == "127.0.0.1"
