"""RFC 6455 5.5, after Autobahn's case 2: a ping is answered by a pong
with the same payload (0 to 125 bytes, binary too); an unsolicited pong
is ignored; a control frame longer than 125 bytes is 1002."""
from __future__ import annotations

import pytest

from rfc6455_client import CLOSE, PING, PONG, TEXT, close_frame, exchange, frame

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("payload", [b"", b"hello", bytes(range(256))[:125],
                                     b"\x00\xff\xfe\xed\xa0\x80"],
                         ids=["empty", "text", "125-bytes", "binary"])
def test_ping_answered_with_its_payload(ws_server, payload):
    _, addr = ws_server
    o = exchange(addr, frame(PING, payload))
    assert o.frames == [(PONG, payload)] and o.close == 1000


def test_ten_pings_ten_pongs_in_order(ws_server):
    _, addr = ws_server
    o = exchange(addr, *[frame(PING, b"ping %d" % i) for i in range(10)])
    assert o.pongs == [b"ping %d" % i for i in range(10)] and o.close == 1000


def test_ping_between_messages(ws_server):
    _, addr = ws_server
    o = exchange(addr, frame(TEXT, b"one"), frame(PING, b"p"), frame(TEXT, b"two"), wait=2)
    # the pong may overtake the app's echo of "one": the server answers it
    assert o.messages == [(TEXT, b"one"), (TEXT, b"two")] and o.pongs == [b"p"]
    assert o.close == 1000


@pytest.mark.parametrize("payload", [b"", b"unsolicited", b"x" * 125])
def test_unsolicited_pong_is_ignored(ws_server, payload):
    _, addr = ws_server
    o = exchange(addr, frame(PONG, payload), frame(TEXT, b"still here"), wait=1)
    assert o.frames == [(TEXT, b"still here")] and o.close == 1000


@pytest.mark.parametrize("opcode", [PING, PONG, CLOSE], ids=["ping", "pong", "close"])
@pytest.mark.parametrize("n", [126, 65536])
def test_control_frame_over_125_bytes_is_1002(ws_server, opcode, n):
    _, addr = ws_server
    payload = (b"\x03\xe8" + b"r" * n)[:n] if opcode == CLOSE else b"p" * n
    o = exchange(addr, frame(opcode, payload), frame(TEXT, b"after"))
    assert o.pongs == [] and o.messages == [] and o.close == 1002 and o.eof
