"""The PROXY protocol's native code (worker/native/parse/proxy_proto.c, the
connection layer's step in conn_proxy.c) under AddressSanitizer + UBSan:
the fuzz target against its reference (test_proxy_protocol_fuzz.py,
FUZZ_PROXY_EXAMPLES examples, 300 unless set: bench/fuzz_proxy.sh --asan
raises it) and the socket tests (HTTP and stream) run against the
sanitizer build in a child interpreter; any report fails the run."""
from __future__ import annotations

import os

import pytest

from test_http_asan import LONGER, run_under_asan

LONGER_PROXY = int(os.environ.get("FUZZ_PROXY_TIMEOUT", "0"))
pytestmark = [pytest.mark.timeout(600 + LONGER + LONGER_PROXY), pytest.mark.long]


def test_proxy_protocol_under_asan_and_ubsan(http_asan_env):
    env = dict(http_asan_env)
    env["FUZZ_PROXY_EXAMPLES"] = os.environ.get("FUZZ_PROXY_EXAMPLES", "300")
    run_under_asan(env, ["test_proxy_protocol_fuzz.py", "test_proxy_protocol_http.py",
                         "test_proxy_protocol_stream.py"], timeout=500 + LONGER_PROXY)
