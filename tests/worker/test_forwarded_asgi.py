"""Trusted proxy headers in the ASGI scope (issue 24 §1, first bullet: "the
same rules fill the ASGI scope's client/scheme"): from a trusted peer,
X-Forwarded-For / Forwarded set `client`, the scheme headers and proto=
set `scheme`, X-Forwarded-Prefix (when named) goes before `root_path` and
`path`; from an untrusted peer the scope is what it was, headers included.
The same in-process worker as test_forwarded_headers.py, asgi interface."""
from __future__ import annotations

import json

import pytest

from test_forwarded_headers import ALL_FORWARDER, SPOOF, connect, read_response, request
from test_forwarded_headers import serve_on  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(60)


async def echo_scope(scope, receive, send):
    body = json.dumps({
        "client": scope["client"], "scheme": scope["scheme"], "root_path": scope["root_path"],
        "path": scope["path"], "raw_path": scope["raw_path"].decode(),
        "headers": [[k.decode(), v.decode()] for k, v in scope["headers"]],
    }).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def ask(addr, headers=(), source=None, path="/") -> dict:
    with connect(addr, source) as c:
        c.sendall(request(path, headers))
        status, body = read_response(c)
    assert status == 200, body
    return json.loads(body)


def test_trusted_peer_sets_client_and_scheme(serve_on):
    addr = serve_on(echo_scope, asgi=True)
    scope = ask(addr, [("X-Forwarded-For", "203.0.113.7, 127.0.0.1"),
                       ("X-Forwarded-Proto", "https")])
    assert scope["client"] == ["203.0.113.7", 0] and scope["scheme"] == "https"
    scope = ask(addr, [("Forwarded", 'for="[2001:db8::17]:4711";proto=https'),
                       ("X-Forwarded-For", "198.51.100.1")])
    assert scope["client"] == ["2001:db8::17", 4711] and scope["scheme"] == "https"
    scope = ask(addr)
    assert scope["client"][0] == "127.0.0.1" and scope["client"][1] > 0
    assert scope["scheme"] == "http"


def test_untrusted_peer_scope_unchanged(serve_on):
    addr = serve_on(echo_scope, asgi=True, forwarded_allow_ips=["127.0.0.2"],
                    forwarder_headers=ALL_FORWARDER)
    plain = ask(addr, source="127.0.0.1", path="/x")
    scope = ask(addr, SPOOF, source="127.0.0.1", path="/x")
    assert scope["client"][0] == "127.0.0.1" and scope["scheme"] == "http"
    assert (scope["root_path"], scope["path"]) == (plain["root_path"], plain["path"]) == ("", "/x")
    # the raw headers are the app's, as sent
    assert ["x-forwarded-for", "203.0.113.66"] in scope["headers"]
    scope = ask(addr, SPOOF, source="127.0.0.2", path="/x")
    assert scope["client"] == ["198.51.100.9", 0] and scope["scheme"] == "https"
    assert (scope["root_path"], scope["path"], scope["raw_path"]) == ("/evil", "/evil/x", "/x")


def test_prefix_before_root_path(serve_on):
    addr = serve_on(echo_scope, asgi=True, forwarder_headers=["X-Forwarded-Prefix"],
                    root_path="/app")
    scope = ask(addr, [("X-Forwarded-Prefix", "/edge/")], path="/app/items")
    assert (scope["root_path"], scope["path"]) == ("/edge/app", "/edge/app/items")


def test_unix_socket_client(serve_on):
    path = serve_on(echo_scope, asgi=True, where="unix")
    assert ask(path, [("X-Forwarded-For", "192.0.2.5")])["client"] is None
    path = serve_on(echo_scope, asgi=True, where="unix", forwarded_allow_ips=["unix"])
    scope = ask(path, [("X-Forwarded-For", "192.0.2.5"), ("X-Forwarded-Ssl", "on")])
    assert scope["client"] == ["192.0.2.5", 0] and scope["scheme"] == "https"


def test_malformed_is_ignored(serve_on):
    addr = serve_on(echo_scope, asgi=True)
    scope = ask(addr, [("X-Forwarded-For", "bogus"), ("Forwarded", "for=")])
    assert scope["client"][0] == "127.0.0.1" and scope["scheme"] == "http"
