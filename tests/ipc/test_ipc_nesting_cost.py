"""The ipc layer's nesting check (ipc/nesting.py) is cheap whatever a peer
sends: one pass in C, never a Python step per item."""
from __future__ import annotations

import time

import pytest

from sockherd.ipc import messages as m
from sockherd.ipc.frames import MAX_FRAME
from sockherd.ipc.nesting import first_too_deep

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
