"""The WebSocket codec and adapter under AddressSanitizer + UBSan: the
native extension compiled again with the sanitizers (as
tests/worker/test_http_asan.py does) and, in a child interpreter with
libasan preloaded, the frame codec's rules (test_ws_frame_codec.py), its
fuzz against the Python model (test_ws_frame_fuzz.py; FUZZ_WS_EXAMPLES,
200 here unless set: bench/fuzz_ws.sh --asan runs longer) and the
in-process engine's WebSocket cases over real sockets
(test_ws_protocol.py), permessage-deflate's negotiation, inflate and
deflate paths (test_ws_deflate*.py; the fuzz covers inflate too). conftest.py swaps the build in. Any sanitizer
report fails the run."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from http_asan import run_under_asan

LONGER = int(os.environ.get("FUZZ_WS_TIMEOUT", "0"))
pytestmark = [pytest.mark.timeout(600 + LONGER), pytest.mark.long]

HERE = Path(__file__).resolve().parent


def test_ws_suite_under_asan_and_ubsan(http_asan_env):
    env = dict(http_asan_env, FUZZ_WS_EXAMPLES=os.environ.get("FUZZ_WS_EXAMPLES", "200"))
    files = [HERE / "test_ws_frame_codec.py", HERE / "test_ws_frame_fuzz.py",
             HERE / "test_ws_protocol.py", HERE / "test_ws_deflate.py",
             HERE / "test_ws_deflate_negotiation.py", HERE / "test_ws_queue_account.py"]
    out = run_under_asan(env, [f for f in files if f.exists()], timeout=500 + LONGER)
    # the build under test was the sanitizer's, not the installed module
    assert "asan-build" in out, out[-3000:]
