"""TLS in the engine (worker/native/conn/conn_tls.c and its hooks in the
connection layer and the adapters) under AddressSanitizer + UBSan: the
TLS socket tests (WSGI, ASGI, wss, curl, openssl s_client, the slow
reader, renegotiation, PROXY then TLS, the handshake's misbehaving
clients, every way a handshake ends and its one outcome) run against the
sanitizer build in child interpreters, one per file (one child over all
three was a single test of many minutes: on its own at the end of an
xdist run it made the tail); any report fails the run."""
from __future__ import annotations

import pytest

from http_asan import run_under_asan
from test_http_asan import LONGER

pytestmark = [pytest.mark.timeout(900 + LONGER), pytest.mark.long]


@pytest.mark.parametrize("part", ["test_tls_http.py", "test_tls_asgi.py", "test_tls_clients.py",
                                  "test_tls_handshake_outcomes.py",
                                  # issue 35 §19, §22, §26: small files, one child
                                  "test_tls_alpn.py test_tls_key_errors.py "
                                  "test_tls_sni_not_utf8.py"])
def test_tls_under_asan_and_ubsan(http_asan_env, part):
    # the build the run shares (tests/http_asan.py), not one of its own
    run_under_asan(dict(http_asan_env), part.split(), timeout=850 + LONGER)
