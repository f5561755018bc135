"""The native frame codec's rules one by one (ws_frame.c through
WsParser), with no I/O: each RFC 6455 failure and its close code, the
fragment rules, UTF-8 split across fragments and the size bound counted
over a whole fragmented message (a per-frame bound let a message of many
small fragments through: the mutation the fuzz did not reach)."""
from __future__ import annotations

import os

import pytest

from sockherd.worker._http import WsParser, ws_frame
from wsmodel import close_payload, frame

pytestmark = pytest.mark.timeout(60)


def fail_code(data: bytes, max_size: int = 1 << 20):
    events = WsParser(max_size=max_size).feed(data)
    assert events and events[-1][0] == "fail", events
    return events[-1][1]


@pytest.mark.parametrize("data, code", [
    (frame(2, b"x", mask=False), 1002),
    (frame(1, b"x", rsv=4), 1002),
    (frame(3, b""), 1002),
    (frame(0xB, b""), 1002),
    (frame(9, b"p", fin=False), 1002),
    (frame(9, b"p" * 126), 1002),
    (frame(0, b"orphan"), 1002),
    (frame(1, b"a", fin=False) + frame(1, b"b"), 1002),
    (bytes([0x82, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4]), 1002),
    (frame(8, b"\x03"), 1002),
    (frame(8, close_payload(1005)), 1002),
    (frame(8, close_payload(1006)), 1002),
    (frame(8, close_payload(1015)), 1002),
    (frame(8, close_payload(999)), 1002),
    (frame(8, close_payload(2000)), 1002),
    (frame(8, close_payload(5000)), 1002),
    (frame(8, close_payload(1000, b"\xc3")), 1007),
    (frame(1, b"\xed\xa0\x80"), 1007),               # a surrogate
    (frame(1, b"\xc0\xaf"), 1007),                   # overlong
    (frame(1, b"\xe2\x82"), 1007),                   # truncated at the message's end
])
def test_each_failure_has_its_close_code(data, code):
    assert fail_code(data) == code



TOO_LONG = "control frame longer than 125 bytes"
NOT_MINIMAL = "control frame length not in the 7-bit form (not minimally encoded)"


@pytest.mark.parametrize("op", [8, 9, 10], ids=["close", "ping", "pong"])
@pytest.mark.parametrize("n, length, reason", [
    (5, "16", NOT_MINIMAL), (125, "16", NOT_MINIMAL), (0, "64", NOT_MINIMAL),
    (126, "min", TOO_LONG), (126, "64", TOO_LONG), (70000, "min", TOO_LONG),
])
def test_control_frame_length_refusal_says_which_rule(op, n, length, reason):
    """Finding (wsmem brief): a control frame whose 16-bit length said 5
    was refused 1002 as "longer than 125 bytes"; RFC 6455 5.5 bounds the
    payload, 5.2's minimal encoding is what such a frame breaks."""
    payload = (b"\x03\xe8" + b"r" * n)[:n] if op == 8 else b"p" * n
    events = WsParser().feed(frame(op, payload, length=length))
    assert events == [("fail", 1002, reason)]

def test_text_fails_as_soon_as_its_bytes_are_bad():
    # the frame is not whole yet: the bad byte alone decides
    assert WsParser().feed(frame(1, b"ok\xff" + b"x" * 100)[:9])[-1][:2] == ("fail", 1007)


def test_size_bound_counts_the_whole_fragmented_message():
    parts = frame(2, b"a" * 40, fin=False) + frame(0, b"b" * 40, fin=False) + frame(0, b"c" * 40)
    assert fail_code(parts, max_size=100) == 1009
    assert WsParser(max_size=120).feed(parts) == [("binary", b"a" * 40 + b"b" * 40 + b"c" * 40)]
    assert fail_code(frame(2, b"x" * 101), max_size=100) == 1009


def test_utf8_split_across_fragments_with_pings_between():
    data = "h€llo wörld 😀".encode()
    cuts = [2, 3, 4, 14, 15, 16]                     # inside the multi-byte characters
    chunks = [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]
    stream = b""
    for i, chunk in enumerate(chunks):
        stream += frame(1 if i == 0 else 0, chunk, fin=i == len(chunks) - 1)
        stream += frame(9, str(i).encode())
    events = WsParser().feed(stream)
    assert events == [("ping", str(i).encode()) for i in range(len(chunks) - 1)] + \
        [("text", data.decode()), ("ping", str(len(chunks) - 1).encode())]


def test_close_frames():
    assert WsParser().feed(frame(8, b"")) == [("close", 1005, "")]
    assert WsParser().feed(frame(8, close_payload(4000, "bye ✓".encode()))) == \
        [("close", 4000, "bye ✓")]


def test_lengths_in_each_encoding_and_server_frames():
    for n, head in ((125, b"\x82\x7d"), (126, b"\x82\x7e\x00\x7e"),
                    (70000, b"\x82\x7f" + (70000).to_bytes(8, "big"))):
        payload = bytes(range(256)) * (n // 256) + bytes(n % 256)
        assert WsParser().feed(frame(2, payload)) == [("binary", payload)]
        assert ws_frame(2, payload) == head + payload
    # 5.2's minimal encoding holds for data frames too
    assert WsParser().feed(frame(2, b"abc", length="64")) == [
        ("fail", 1002, "payload length in the 64-bit form below 65536 (not minimally encoded)")]
    assert WsParser().feed(frame(2, b"abc", length="16")) == [
        ("fail", 1002, "payload length in the 16-bit form below 126 (not minimally encoded)")]
    assert WsParser().feed(frame(2, bytes(200), length="64"))[0][:2] == ("fail", 1002)


def test_the_build_under_test():
    """Under test_ws_asan.py the sanitizer build must be the one tested
    (conftest.py swaps it in before anything imports the module)."""
    from sockherd.worker import _http
    if os.environ.get("SOCKHERD_HTTP_MODULE"):
        assert _http.__file__ == os.environ["SOCKHERD_HTTP_MODULE"], _http.__file__
        print("asan-build")
