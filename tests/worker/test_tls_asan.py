"""TLS in the engine (worker/native/conn_tls.c and its hooks in the
connection layer and the adapters) under AddressSanitizer + UBSan: the
TLS socket tests (WSGI, ASGI, wss, curl, openssl s_client, the slow
reader, renegotiation, PROXY then TLS, the handshake's misbehaving
clients) run against the sanitizer build in a child interpreter; any
report fails the run."""
from __future__ import annotations

import pytest

from test_http_asan import LONGER, build_asan, run_under_asan

pytestmark = pytest.mark.timeout(900 + LONGER)


def test_tls_under_asan_and_ubsan(tmp_path):
    env = build_asan(tmp_path)
    run_under_asan(env, ["test_tls_http.py", "test_tls_asgi.py", "test_tls_clients.py"],
                   timeout=850 + LONGER)
