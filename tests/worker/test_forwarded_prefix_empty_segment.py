"""X-Forwarded-Prefix with an empty segment (issue 35 point 25): a
trusted proxy's `X-Forwarded-Prefix: //evil.example` became SCRIPT_NAME
(ASGI root_path) as it was, and an app that builds its links from it
(`SCRIPT_NAME + "/login"`, url_for) wrote `//evil.example/login`: a
protocol-relative URL, another host's. No mount point has an empty
segment, so a prefix with `//` before its end is refused (ignored, as
every malformed forwarding value is, and logged at debug); a trailing
`/`, which a proxy's `location /app/` gives, is still taken off.

The in-process worker of test_forwarded_headers.py (a real Loop over a
real fdcore Table on loopback), the test as the trusted proxy."""
from __future__ import annotations

import json

import pytest

from test_forwarded_headers import ask, connect, echo, read_response, request
from test_forwarded_headers import serve_on  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(60)

EMPTY_SEGMENT = ["//evil.example", "//evil.example/app", "///evil.example", "/app//evil.example"]


async def echo_scope(scope, receive, send):
    body = json.dumps({"root_path": scope["root_path"], "path": scope["path"]}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


@pytest.mark.parametrize("prefix", EMPTY_SEGMENT)
def test_wsgi_script_name_never_starts_a_protocol_relative_url(serve_on, prefix):
    addr = serve_on(echo, forwarder_headers=["X-Forwarded-Prefix"])
    env = ask(addr, [("X-Forwarded-Prefix", prefix)], path="/x")
    assert (env["SCRIPT_NAME"], env["PATH_INFO"]) == ("", "/x")


@pytest.mark.parametrize("prefix", EMPTY_SEGMENT)
def test_asgi_root_path_never_starts_a_protocol_relative_url(serve_on, prefix):
    addr = serve_on(echo_scope, asgi=True, forwarder_headers=["X-Forwarded-Prefix"])
    with connect(addr) as c:
        c.sendall(request("/x", [("X-Forwarded-Prefix", prefix)]))
        status, body = read_response(c)
    assert status == 200
    assert json.loads(body) == {"root_path": "", "path": "/x"}


@pytest.mark.parametrize("prefix,script_name", [
    ("/app", "/app"), ("/app/", "/app"), ("/app//", "/app"), ("/a/b/", "/a/b"), ("/", ""),
])
def test_a_trailing_slash_is_still_taken_off(serve_on, prefix, script_name):
    addr = serve_on(echo, forwarder_headers=["X-Forwarded-Prefix"])
    env = ask(addr, [("X-Forwarded-Prefix", prefix)], path="/x")
    assert (env["SCRIPT_NAME"], env["PATH_INFO"]) == (script_name, "/x")
