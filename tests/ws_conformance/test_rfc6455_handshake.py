"""RFC 6455 4.2: the opening handshake (Autobahn's suite assumes it; these
cases check the refusals too). A valid request gets 101 with the accept
key; a missing or malformed Sec-WebSocket-Key is 400; a version other
than 13 is 426 naming 13 (4.2.2: the version(s) the server understands)."""
from __future__ import annotations

import pytest

from rfc6455_client import TEXT, Client, close_frame, frame

pytestmark = pytest.mark.timeout(60)


def test_valid_handshake_is_101_with_the_accept_key(ws_server):
    _, addr = ws_server
    c = Client(addr, key="dGhlIHNhbXBsZSBub25jZQ==")     # RFC 6455 1.3's example
    assert c.status == 101
    assert c.headers["sec-websocket-accept"] == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    assert c.headers["upgrade"].lower() == "websocket"
    assert "upgrade" in c.headers["connection"].lower()
    o = c.send(frame(TEXT, b"after the handshake")).outcome(messages=1)
    o = c.send(close_frame()).outcome(o)
    assert o.messages == [(TEXT, b"after the handshake")] and o.close == 1000


@pytest.mark.parametrize("key", [
    "",                               # no Sec-WebSocket-Key at all
    "c2hvcnQ=",                       # base64, but of 5 bytes, not 16
    "!!!!!!!!!!!!!!!!!!!!!!==",       # not base64
    "dGhlIHNhbXBsZSBub25jZQ",         # 16 bytes' base64 without its padding
], ids=["missing", "short", "not-base64", "unpadded"])
def test_missing_or_invalid_key_is_400(ws_server, key):
    _, addr = ws_server
    assert Client(addr, key=key).status == 400


@pytest.mark.parametrize("version", ["8", "12", "14"])
def test_version_other_than_13_is_426_naming_13(ws_server, version):
    _, addr = ws_server
    c = Client(addr, version=version)
    assert c.status == 426
    assert c.headers.get("sec-websocket-version") == "13"
