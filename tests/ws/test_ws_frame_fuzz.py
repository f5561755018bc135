"""The native frame codec (ws_frame.c, through WsParser) against the
Python model (wsmodel.py): generated client streams (valid frames and
every kind of bad one, fragments with control frames between them, text
split inside a code point, lengths in 7/16/64-bit encodings) and garbage,
fed whole and split anywhere, must give the same events, frame by frame
and message by message, with the same close code on a failure.

With permessage-deflate negotiated (RFC 7692) the inflate path is fuzzed
the same way against Python's zlib in the model: messages compressed by a
client that keeps its context or not, fragmented, with a final block,
bombs past max_size, corrupted deflate data, RSV1 where it may not be.

FUZZ_WS_EXAMPLES (default 300) sets the examples per test: bench/fuzz_ws.sh
runs longer rounds, and under ASAN (test_ws_asan.py)."""
from __future__ import annotations

import os
import zlib

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from sockherd.worker._http import WsParser
from wsmodel import close_payload, frame, parse

pytestmark = pytest.mark.timeout(int(os.environ.get("FUZZ_WS_TIMEOUT", "300")))

EXAMPLES = int(os.environ.get("FUZZ_WS_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def native(data: bytes, max_size: int, cuts=(), **pmd) -> list[tuple]:
    p = WsParser(max_size=max_size, **pmd)
    events, at = [], 0
    for cut in sorted(set(cuts)) + [len(data)]:
        events += p.feed(data[at:cut])
        at = cut
        if events and events[-1][0] == "fail":
            break
    # a fail carries the codec's reason: the model's is the code alone
    return [e[:2] if e[0] == "fail" else e for e in events]


TEXTS = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)


@st.composite
def frames(draw):
    kind = draw(st.sampled_from(
        ["text", "text", "binary", "binary", "frag", "ping", "pong", "close", "bad"]))
    key = draw(st.binary(min_size=4, max_size=4))
    # a longer length encoding than needed is a 1002 (5.2's minimal
    # encoding) unless the payload needs it: mostly the minimal one
    length = draw(st.sampled_from(["min", "min", "min", "min", "16", "64"]))
    if kind == "text":
        return frame(1, draw(TEXTS).encode(), key=key, length=length)
    if kind == "binary":
        return frame(2, draw(st.binary(max_size=300)), key=key, length=length)
    if kind == "frag":
        # a message in fragments, split inside code points, control frames between
        data = draw(TEXTS).encode() if draw(st.booleans()) else draw(st.binary(max_size=300))
        op = 1 if draw(st.booleans()) else 2
        cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=4)))
        parts = [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]
        out = b""
        for n, part in enumerate(parts):
            out += frame(op if n == 0 else 0, part, fin=n == len(parts) - 1, key=key)
            if draw(st.booleans()):
                out += frame(9, draw(st.binary(max_size=10)), key=key)
        return out
    if kind in ("ping", "pong"):
        return frame(9 if kind == "ping" else 10, draw(st.binary(max_size=125)), key=key)
    if kind == "close":
        choice = draw(st.sampled_from(["empty", "code", "reason", "badcode", "one", "badutf8"]))
        if choice == "empty":
            return frame(8, b"", key=key)
        if choice == "one":
            return frame(8, b"\x03", key=key)
        if choice == "badutf8":
            return frame(8, close_payload(1000, b"\xff\xfe"), key=key)
        code = draw(st.sampled_from([1000, 1001, 1002, 1003, 1007, 1011, 3000, 4999])) \
            if choice != "badcode" else draw(st.sampled_from([0, 999, 1004, 1005, 1006, 1015,
                                                              1016, 2999, 5000, 65535]))
        reason = draw(TEXTS).encode()[:100] if choice == "reason" else b""
        return frame(8, close_payload(code, reason), key=key)
    bad = draw(st.sampled_from(["unmasked", "rsv", "opcode", "ctlfrag", "ctllong", "cont",
                                "badutf8", "top64", "inside"]))
    if bad == "unmasked":
        return frame(2, b"abc", mask=False)
    if bad == "rsv":
        return frame(1, b"x", rsv=draw(st.integers(1, 7)), key=key)
    if bad == "opcode":
        return frame(draw(st.sampled_from([3, 4, 5, 6, 7, 11, 12, 13, 14, 15])), b"", key=key)
    if bad == "ctlfrag":
        return frame(9, b"p", fin=False, key=key)
    if bad == "ctllong":
        return frame(9, b"p" * 126, key=key)
    if bad == "cont":
        return frame(0, b"orphan", key=key)
    if bad == "badutf8":
        return frame(1, draw(st.sampled_from([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80",
                                              b"ok\xf4\x90\x80\x80", b"\xe2\x82"])), key=key)
    if bad == "top64":
        return bytes([0x82, 0xFF]) + b"\x80" + b"\0" * 7 + key
    return frame(1, b"a", fin=False, key=key) + frame(2, b"b", key=key)


@FUZZ
@given(st.lists(frames(), max_size=8), st.lists(st.integers(0, 4000), max_size=6),
       st.sampled_from([1 << 20, 200, 64]))
def test_generated_streams_match_the_model(parts, cuts, max_size):
    data = b"".join(parts)
    want = parse(data, max_size)
    assert native(data, max_size) == want
    assert native(data, max_size, [c for c in cuts if c <= len(data)]) == want


@FUZZ
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=5))
def test_garbage_matches_the_model(data, cuts):
    want = parse(data, 1 << 20)
    assert native(data, 1 << 20, [c for c in cuts if c <= len(data)]) == want


@FUZZ
@given(st.lists(frames(), min_size=1, max_size=5))
def test_byte_by_byte_is_whole(parts):
    data = b"".join(parts)
    assert native(data, 1 << 20, range(len(data))) == parse(data, 1 << 20)


# ---- permessage-deflate ---------------------------------------------------------------------------

@st.composite
def deflate_streams(draw):
    """(stream, client_no_context_takeover): compressed and plain messages
    from one client whose compressor keeps its context unless reset, and
    the bad ones the inflate path must refuse as the model does."""
    reset = draw(st.booleans())
    comp = zlib.compressobj(draw(st.integers(0, 9)), zlib.DEFLATED, -draw(st.integers(9, 15)))
    key = draw(st.binary(min_size=4, max_size=4))
    out = b""
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["deflate", "deflate", "deflate", "plain", "final", "frag",
                                     "bomb", "corrupt", "garbage", "rsv1cont", "rsv1ctl",
                                     "other"]))
        op = 1 if draw(st.booleans()) else 2
        data = draw(TEXTS).encode() * draw(st.integers(1, 30)) if op == 1 else \
            draw(st.binary(max_size=300)) * draw(st.integers(1, 30))
        if kind == "plain":
            out += frame(op, data, key=key)
            continue
        if kind == "other":
            out += draw(frames())
            continue
        if kind == "rsv1cont":
            out += frame(op, b"x", fin=False, rsv=4, key=key) + frame(0, b"y", rsv=4, key=key)
            continue
        if kind == "rsv1ctl":
            out += frame(9, b"p", rsv=4, key=key)
            continue
        if kind == "garbage":
            out += frame(op, draw(st.binary(max_size=60)), rsv=4, key=key)
            continue
        if kind == "bomb":
            data = bytes(draw(st.integers(100, 5000)))
        z = comp.compress(data)
        if kind == "final":
            # 7.2.3.4: a final block; the client's next message starts afresh
            z += comp.flush(zlib.Z_FINISH)
            comp = zlib.compressobj(wbits=-15)
        else:
            z += comp.flush(zlib.Z_SYNC_FLUSH)
            z = z[:-4] if draw(st.booleans()) else z     # the tail is optional to send
        if kind == "corrupt" and z:
            i = draw(st.integers(0, len(z) - 1))
            z = z[:i] + bytes([z[i] ^ draw(st.integers(1, 255))]) + z[i + 1:]
        if reset:
            comp = zlib.compressobj(wbits=-15)
        if kind == "frag" and len(z) > 1:
            cut = draw(st.integers(1, len(z) - 1))
            out += frame(op, z[:cut], fin=False, rsv=4, key=key) + frame(9, b"", key=key) + \
                frame(0, z[cut:], key=key)
        else:
            out += frame(op, z, rsv=4, key=key)
    return out, reset


@FUZZ
@given(deflate_streams(), st.lists(st.integers(0, 4000), max_size=6),
       st.sampled_from([1 << 20, 2000, 200]))
def test_deflate_streams_match_the_model(stream, cuts, max_size):
    data, reset = stream
    want = parse(data, max_size, deflate=True, reset=reset)
    pmd = {"deflate": True, "client_no_context_takeover": reset}
    assert native(data, max_size, **pmd) == want
    assert native(data, max_size, [c for c in cuts if c <= len(data)], **pmd) == want


@FUZZ
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=5))
def test_garbage_with_deflate_matches_the_model(data, cuts):
    want = parse(data, 1 << 20, deflate=True)
    assert native(data, 1 << 20, [c for c in cuts if c <= len(data)], deflate=True) == want
