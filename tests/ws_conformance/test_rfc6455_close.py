"""RFC 6455 5.5.1, 7.1 and 7.4, after Autobahn's case 7: a close is
answered with a close echoing its code, then the server closes the TCP
connection; codes the RFC does not allow on the wire (0-999, 1004-1006,
1015, 1016-2999, 5000 up) are 1002, as is a 1-byte close payload; frames
after the client's close are not processed."""
from __future__ import annotations

import pytest

from rfc6455_client import PING, TEXT, close_frame, exchange, frame

pytestmark = pytest.mark.timeout(60)

VALID = [1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014,
         3000, 3999, 4000, 4999]
INVALID = [0, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535]


@pytest.mark.parametrize("code", VALID)
def test_valid_close_code_echoed(ws_server, code):
    _, addr = ws_server
    o = exchange(addr, close_frame(code), close=False)
    assert o.close == code and o.eof


@pytest.mark.parametrize("code", INVALID)
def test_invalid_close_code_is_1002(ws_server, code):
    _, addr = ws_server
    o = exchange(addr, close_frame(code), close=False)
    assert o.close == 1002 and o.eof


def test_close_without_payload_answered(ws_server):
    """7.1.5: no code received is 1005 to the app; the answer carries no
    code or 1000 (both fine by 5.5.1)."""
    _, addr = ws_server
    o = exchange(addr, close_frame(None), close=False)
    assert o.close in (1005, 1000) and o.eof


def test_close_with_one_byte_payload_is_1002(ws_server):
    _, addr = ws_server
    o = exchange(addr, frame(0x8, b"\x03"), close=False)
    assert o.close == 1002 and o.eof


def test_close_with_a_123_byte_reason(ws_server):
    _, addr = ws_server
    o = exchange(addr, close_frame(1000, "é".encode() * 61 + b"!"), close=False)
    assert o.close == 1000 and o.eof


def test_message_then_close_in_one_write(ws_server):
    """The echo may or may not precede the close reply (the server may
    answer the close before the app's send; after its close it sends no
    data, 5.5.1), but the close code is echoed either way."""
    _, addr = ws_server
    o = exchange(addr, frame(TEXT, b"last words"), close_frame(4321, b"bye"), close=False)
    assert o.messages in ([], [(TEXT, b"last words")]) and o.close == 4321 and o.eof


def test_frames_after_close_are_ignored(ws_server):
    _, addr = ws_server
    o = exchange(addr, close_frame(1000), frame(TEXT, b"too late"), frame(PING, b"late ping"),
                 close=False)
    assert o.frames == [] and o.close == 1000 and o.eof
