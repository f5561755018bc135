"""RFC 6455 5.4 fragmentation, after Autobahn's case 5: a message in
fragments (of every size down to 1 byte and empty ones) is one message;
control frames may come between fragments and are answered at once; a
continuation with no message started, or a new data frame inside a
fragmented message, is 1002; a control frame may not be fragmented
(1002)."""
from __future__ import annotations

import pytest

from rfc6455_client import BINARY, CLOSE, CONT, PING, PONG, TEXT, exchange, frame

pytestmark = pytest.mark.timeout(60)


def fragments(opcode: int, parts: list[bytes]) -> list[bytes]:
    return [frame(opcode if i == 0 else CONT, p, fin=i == len(parts) - 1)
            for i, p in enumerate(parts)]


@pytest.mark.parametrize("opcode", [TEXT, BINARY], ids=["text", "binary"])
@pytest.mark.parametrize("parts", [
    [b"frag", b"mented"],
    [b"a", b"b", b"c", b"d", b"e", b"f"],
    [b"", b"empty", b"", b"fragments", b""],
    [b"", b""],
    [b"x" * 70000, b"y" * 300, b"z"],
], ids=["two", "one-byte-each", "empty-between", "all-empty", "large-first"])
def test_fragmented_message_is_one_message(ws_server, opcode, parts):
    _, addr = ws_server
    o = exchange(addr, *fragments(opcode, parts), wait=1)
    assert o.messages == [(opcode, b"".join(parts))] and o.close == 1000 and o.eof


def test_pings_between_fragments_answered_in_order(ws_server):
    _, addr = ws_server
    sent = []
    for i, f in enumerate(fragments(TEXT, [b"one ", b"two ", b"three"])):
        sent += [f, frame(PING, b"ping %d" % i)]
    o = exchange(addr, *sent, wait=1)
    assert o.pongs == [b"ping 0", b"ping 1", b"ping 2"]
    assert o.messages == [(TEXT, b"one two three")] and o.close == 1000


def test_pong_between_fragments_is_ignored(ws_server):
    _, addr = ws_server
    a, b = fragments(BINARY, [b"left ", b"right"])
    o = exchange(addr, a, frame(PONG, b"unsolicited"), b, wait=1)
    assert o.frames == [(BINARY, b"left right")] and o.close == 1000


def test_continuation_without_a_message_is_1002(ws_server):
    _, addr = ws_server
    o = exchange(addr, frame(CONT, b"orphan"), frame(TEXT, b"after"))
    assert o.messages == [] and o.close == 1002 and o.eof


def test_continuation_after_a_finished_message_is_1002(ws_server):
    _, addr = ws_server
    o = exchange(addr, frame(TEXT, b"done"), frame(CONT, b"late", fin=True))
    # the echo of "done" may be overtaken by the 1002 (no data after a close)
    assert o.messages in ([], [(TEXT, b"done")]) and o.close == 1002 and o.eof


@pytest.mark.parametrize("second", [TEXT, BINARY], ids=["text", "binary"])
def test_data_frame_inside_a_fragmented_message_is_1002(ws_server, second):
    _, addr = ws_server
    o = exchange(addr, frame(TEXT, b"start", fin=False), frame(second, b"intruder"),
                 frame(CONT, b"end"))
    assert o.messages == [] and o.close == 1002 and o.eof


@pytest.mark.parametrize("opcode", [PING, PONG, CLOSE], ids=["ping", "pong", "close"])
def test_fragmented_control_frame_is_1002(ws_server, opcode):
    _, addr = ws_server
    payload = b"\x03\xe8" if opcode == CLOSE else b"frag"
    o = exchange(addr, frame(opcode, payload, fin=False), frame(CONT, b"ment"),
                 frame(TEXT, b"after"))
    assert o.pongs == [] and o.messages == [] and o.close == 1002 and o.eof
