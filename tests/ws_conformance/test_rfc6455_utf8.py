"""RFC 6455 5.6 and 8.1, after Autobahn's case 6: a text message must be
valid UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing past
U+10FFFF), else 1007; valid text is echoed whatever fragment boundaries
cut its characters, split at every byte; a close reason not UTF-8 is
1007 too."""
from __future__ import annotations

import pytest

from rfc6455_client import CONT, TEXT, Client, close_frame, exchange, frame

pytestmark = pytest.mark.timeout(120)

VALID = {
    "ascii": b"Hello-\x7f",
    "two-byte": "κόσμε".encode(),                                   # Autobahn 6.2's text
    "three-byte": "€ ∞ 中文".encode(),
    "four-byte": "😀 𝄞".encode(),
    "edges": "\u0080\u07ff\u0800\ud7ff\ue000\ufffd\uffff\U00010000\U0010ffff".encode(),
    "nul-and-bom": b"\x00\xef\xbb\xbf",
}
INVALID = {
    "lone-continuation": b"ab\x80cd",
    "bad-start-fe": b"\xfe",
    "bad-start-ff": b"\xff",
    "overlong-slash-2": b"\xc0\xaf",
    "overlong-slash-3": b"\xe0\x80\xaf",
    "overlong-slash-4": b"\xf0\x80\x80\xaf",
    "overlong-max-2": b"\xc1\xbf",
    "surrogate-high": b"\xed\xa0\x80",
    "surrogate-low": b"\xed\xbf\xbf",
    "past-10ffff": b"\xf4\x90\x80\x80",
    "five-byte-form": b"\xf8\x88\x80\x80\x80",
    "truncated-at-end": "κόσμε".encode()[:-1],
    "missing-continuation": b"\xe2\x82(",
    "after-valid-text": "κόσμε".encode() + b"\xed\xa0\x80edited",
}


@pytest.mark.parametrize("name", VALID)
def test_valid_text_echoed(ws_server, name):
    _, addr = ws_server
    o = exchange(addr, frame(TEXT, VALID[name]), wait=1)
    assert o.messages == [(TEXT, VALID[name])] and o.close == 1000


@pytest.mark.parametrize("name", INVALID)
def test_invalid_text_is_1007(ws_server, name):
    _, addr = ws_server
    o = exchange(addr, frame(TEXT, INVALID[name]))
    assert o.messages == [] and o.close == 1007 and o.eof


def split_answers(addr, data: bytes) -> list:
    """The server's answer to data sent as two text fragments, cut at each
    byte in turn: (cut, messages, close code) per cut."""
    out = []
    for cut in range(len(data) + 1):
        o = exchange(addr, frame(TEXT, data[:cut], fin=False), frame(CONT, data[cut:]), wait=1)
        out.append((cut, o.messages, o.close))
    return out


def test_valid_text_split_across_fragments_at_every_byte(ws_server):
    _, addr = ws_server
    data = "κ€😀\U0010ffff".encode()
    assert split_answers(addr, data) == [(cut, [(TEXT, data)], 1000)
                                         for cut in range(len(data) + 1)]


@pytest.mark.parametrize("name", ["surrogate-high", "overlong-slash-4", "past-10ffff",
                                  "truncated-at-end"])
def test_invalid_text_split_across_fragments_at_every_byte(ws_server, name):
    _, addr = ws_server
    data = b"ok " + INVALID[name]
    assert split_answers(addr, data) == [(cut, [], 1007) for cut in range(len(data) + 1)]


def test_text_in_one_byte_fragments(ws_server):
    _, addr = ws_server
    data = "κόσμε 😀".encode()
    frames = [frame(TEXT if i == 0 else CONT, data[i:i + 1], fin=i == len(data) - 1)
              for i in range(len(data))]
    o = exchange(addr, *frames, wait=1)
    assert o.messages == [(TEXT, data)] and o.close == 1000


@pytest.mark.parametrize("reason", [b"\xc3\x28", b"bye \xed\xa0\x80", b"\xff"],
                         ids=["bad-continuation", "surrogate", "ff"])
def test_invalid_utf8_in_close_reason_is_1007(ws_server, reason):
    _, addr = ws_server
    o = exchange(addr, close_frame(1000, reason), close=False)
    assert o.close == 1007 and o.eof


@pytest.mark.parametrize("bad", [b"\xce\xba\xff", b"\xed\xa0\x80", b"\xf4\x90"],
                         ids=["ff", "surrogate", "past-10ffff-prefix"])
def test_invalid_text_fails_fast_before_the_message_ends(ws_server, bad):
    """Autobahn 6.4: the 1007 comes as soon as the bytes in hand cannot be
    UTF-8, the message's last fragment never sent."""
    _, addr = ws_server
    c = Client(addr)
    o = c.send(frame(TEXT, b"valid so far " + bad, fin=False)).outcome()
    assert o.close == 1007 and o.eof
