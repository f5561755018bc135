"""TLS counts in the master's metrics and `ctl show proc` (issue 24 §2's
audit): the workers counted failed and abandoned handshakes and plain
HTTP on a TLS port (conn_tls.c) but nothing reached the master, and
completed handshakes and resumed sessions were not counted at all; an
operator could not see whether resumption worked or handshakes failed.
Now each worker's counts are in its "proc" answer (worker/report.py), in
/metrics as sockherd_worker_tls_handshakes{outcome=...} and in show proc."""
from __future__ import annotations

import socket

import pytest

from test_control import ctl, ok_json
from test_metrics import scrape, value
from test_reload import free_port
from test_run import master, wait_for  # noqa: F401 (fixture)
from test_tls_queued_connection_closed_at_drain import client_hello
from tls_support import make_pki, read_response

pytestmark = pytest.mark.timeout(120)

APP = """
def app(environ, start_response):
    start_response("200 OK", [("Content-Length", "2")])
    return [b"ok"]
"""


def test_handshakes_resumed_failed_abandoned_and_plain_http_counted(master, tmp_path):
    pki = make_pki(tmp_path / "pki")
    (tmp_path / "tlsapp.py").write_text(APP)
    mport = free_port()
    m = master("tlsapp:app", "-w", "2", "--certfile", str(pki.cert), "--keyfile", str(pki.key),
               "--metrics", f"127.0.0.1:{mport}")
    ctx = pki.context()
    session, resumed, n = None, 0, 8
    for _ in range(n):                   # each offers the session of the one before
        raw = socket.create_connection(("127.0.0.1", m.port), timeout=10)
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1", session=session) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert read_response(s)[1] == b"ok"
            resumed += s.session_reused
            session = s.session
    assert resumed >= 1, "no session resumed: nothing to count"
    # a client that does not trust the certificate: its alert fails the handshake
    import ssl
    with socket.create_connection(("127.0.0.1", m.port), timeout=10) as raw:
        # a second descriptor keeps the connection open after the failed
        # wrap closed its own, until the server closes: a close right after
        # the alert can reach the server as a reset before it reads the
        # alert (counted nowhere: failed once in CI under load)
        with raw.dup() as keep:
            with pytest.raises(ssl.SSLCertVerificationError):
                ssl.create_default_context().wrap_socket(raw, server_hostname="127.0.0.1")
            keep.settimeout(5)
            try:
                while keep.recv(4096):
                    pass
            except OSError:
                pass
    # a part of a ClientHello, then the client is gone: abandoned
    with socket.create_connection(("127.0.0.1", m.port), timeout=10) as s:
        s.sendall(client_hello(ctx)[:60])
    # plain HTTP to the TLS port: nginx's 400
    with socket.create_connection(("127.0.0.1", m.port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 400")
    want = {"full": n - resumed, "resumed": resumed, "failed": 1, "abandoned": 1,
            "plain_http": 1}

    def counted():
        fams = scrape(mport)
        return {k: value(fams, "sockherd_worker_tls_handshakes_total", outcome=k)
                for k in want}

    wait_for(lambda: counted() == want, 20, lambda: f"{counted()} to be {want}")
    proc = ok_json(tmp_path, "show proc")
    assert sum(w["stats"]["tls"]["handshakes"] for w in proc["workers"]) == n
    assert sum(w["stats"]["tls"]["resumed"] for w in proc["workers"]) == resumed
    head = ctl(tmp_path, "show", "proc").stdout.splitlines()[0]
    assert "HANDSHAKES" in head and "RESUMED" in head, head
