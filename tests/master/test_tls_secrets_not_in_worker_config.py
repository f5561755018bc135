"""Issue 35 review of §28 / §26 (ticket keys ratcheted for forward
secrecy; the TLS files read by the master and sent in the assignment):
the worker's C side ratchets the ticket secret and "a process that moved
on forgets the old secret" (conn_tls_tickets.c), but the worker's Python
assignment config keeps, for the worker's whole life, the secret it was
spawned with (hex, master/tls.py TICKET_SECRET) and the private key's
bytes (hex, TLS_FILES key_pem): from the former every ticket key of every
epoch since the spawn can be derived again, which is what the rotation
was to prevent. The same dict is the hooks' `worker.cfg` (worker/
bootstrap.py _post_worker_init), so an operator's hook that logs its
worker's config (a common gunicorn-conf habit) writes the private key and
the ticket secret into the error log.

A real master with one worker on loopback serving TLS; the app reports
what the running worker's Python config still holds."""
from __future__ import annotations

import pytest

from test_run import master  # noqa: F401 (fixture)
from tls_support import make_pki

pytestmark = pytest.mark.timeout(120)

APP = """
def app(environ, start_response):
    from sockherd.worker import bootstrap
    cfg = bootstrap.WORKER[0].cfg
    key = open(cfg["keyfile"], "rb").read().hex()
    kept = [k for k in ("tls_ticket_secret",) if cfg.get(k)]
    kept += ["key_pem"] if key in repr(cfg) else []
    body = (",".join(kept) or "none").encode()
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]
"""


def test_a_serving_worker_keeps_no_ticket_secret_nor_key_bytes(master, tmp_path):
    import socket

    pki = make_pki(tmp_path / "pki")
    (tmp_path / "secretsapp.py").write_text(APP)
    m = master("secretsapp:app", "-w", "1", "--certfile", str(pki.cert), "--keyfile",
               str(pki.key), ready=1)
    raw = socket.create_connection(("127.0.0.1", m.port), timeout=10)
    with pki.context().wrap_socket(raw, server_hostname="127.0.0.1") as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        got = b"".join(iter(lambda: s.recv(65536), b""))
    assert got.startswith(b"HTTP/1.1 200"), got
    assert got.split(b"\r\n\r\n", 1)[1] == b"none"
