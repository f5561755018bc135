"""The ipc layer's nesting check (ipc/nesting.py) is cheap whatever a peer
sends: one pass in C, never a Python step per item."""
from __future__ import annotations

import time

import pytest

from sockherd.ipc import messages as m
from sockherd.ipc.frames import MAX_FRAME
from sockherd.ipc.nesting import first_bad_string, first_too_deep, scan

from hypothesis import given, settings, strategies as st

pytestmark = pytest.mark.timeout(60)


def _slowest(n: int) -> bytes:
    """An array32 of n empty arrays: every byte a container header, each one
    item of the walk (the payload the pure-Python walk was slowest on)."""
    return b"\xdd" + n.to_bytes(4, "big") + b"\x90" * n


def test_a_16_mb_frame_built_to_be_slow_is_checked_in_milliseconds():
    """Defect: the depth check was a pure-Python walk, 2-4 s for a 16 MB
    frame (the channel's MAX_FRAME) built of container headers."""
    payload = _slowest(MAX_FRAME - 5)
    best = min(_timed(payload) for _ in range(3))
    # CPU time of this thread (the walk runs in it): the machine's load does
    # not count; the Python walk took 2-4 s, the C one ~0.05 s
    assert best < 0.5, f"{best:.3f}s for {len(payload)} bytes"


def _timed(payload: bytes) -> float:
    t = time.thread_time()
    assert first_too_deep(payload, m.MAX_DEPTH) is None
    return time.thread_time() - t


def test_the_deep_one_is_still_found_at_its_header():
    """The same walk finds the first header past the limit, anywhere."""
    deep = b"\x91" * (m.MAX_DEPTH + 5) + b"\x00"
    assert first_too_deep(deep, m.MAX_DEPTH) == m.MAX_DEPTH
    wide_then_deep = b"\x92" + _slowest(1000) + deep
    assert first_too_deep(wide_then_deep, m.MAX_DEPTH) == 1 + 1005 + m.MAX_DEPTH - 1
    assert first_too_deep(memoryview(deep), m.MAX_DEPTH) == m.MAX_DEPTH
    assert first_too_deep(b"\x91\xc1", 4) is None          # reserved: the decoder's
    assert first_too_deep(b"\xdc\x00", 4) is None          # truncated: the decoder's
    with pytest.raises(ValueError):
        first_too_deep(deep, -1)


def _str8(raw: bytes) -> bytes:
    return b"\xd9" + bytes([len(raw)]) + raw


@settings(max_examples=3000, deadline=None)
@given(st.one_of(st.binary(max_size=40),
                 st.text(max_size=12).map(lambda t: t.encode("utf-8", "surrogatepass")),
                 st.lists(st.sampled_from([b"\xc0", b"\xc2", b"\x80", b"\xbf", b"\xe0",
                                           b"\xed", b"\xa0", b"\xf0", b"\xf4", b"\x90",
                                           b"\x8f", b"\xf5", b"\xff", b"a", b"\xe2\x82\xac",
                                           b"\xf0\x9f\x98\x80"]),
                          max_size=8).map(b"".join)))
def test_the_utf8_check_agrees_with_pythons_strict_codec(raw):
    """first_bad_string judges a string as Python's strict UTF-8 codec does
    (overlongs, surrogates, past U+10FFFF, truncated sequences), in a fixstr
    and in a str 8, and reports where its bytes are."""
    try:
        raw.decode()
        valid = True
    except UnicodeDecodeError:
        valid = False
    payload = b"\x92\x01" + _str8(raw)
    assert first_bad_string(payload) == (None if valid else (4, len(raw)))
    assert scan(payload, m.MAX_DEPTH) == (None, first_bad_string(payload))
    if len(raw) < 32:
        payload = b"\x92\x01" + bytes([0xa0 | len(raw)]) + raw
        assert first_bad_string(payload) == (None if valid else (3, len(raw)))


def test_the_first_bad_string_is_the_one_named_and_bins_are_not_strings():
    assert first_bad_string(b"\x93\xc4\x01\xff\xa1\xfe\xa1\xff") == (5, 1)
    assert first_bad_string(b"\x91\xc4\x01\xff") is None         # bin: any bytes
    assert first_bad_string(b"\x91\xa3\xff") is None              # truncated: the decoder's


def test_one_scan_reports_both_findings():
    """messages.decode takes both from one pass: the depth as first_too_deep
    says it, the bad string as first_bad_string does, none past the container
    that is too deep."""
    deep = b"\x91" * (m.MAX_DEPTH + 5) + b"\x00"
    bad_then_deep = b"\x92\xa1\xff" + deep
    assert scan(bad_then_deep, m.MAX_DEPTH) == (first_too_deep(bad_then_deep, m.MAX_DEPTH),
                                                (2, 1))
    deep_then_bad = b"\x92" + b"\x91" * (m.MAX_DEPTH + 5) + b"\xa1\xff"
    assert first_too_deep(deep_then_bad, m.MAX_DEPTH) is not None
    assert scan(deep_then_bad, m.MAX_DEPTH) == (first_too_deep(deep_then_bad, m.MAX_DEPTH), None)
    assert scan(b"\x91\x01", m.MAX_DEPTH) == (None, None)
    with pytest.raises(ValueError):
        scan(deep, 1025)
