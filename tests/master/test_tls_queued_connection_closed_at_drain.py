"""The 503 a draining worker gives a queued connection no loop thread got
to (worker/loop.py refuse_posted) went out in clear to TLS clients too
(issue 24 §2's audit): a TLS client, in its handshake, read
"HTTP/1.1 503 ..." as a record and failed with a garbled-record error.
Now a connection from a TLS listener is closed without a byte (what nginx
and HAProxy do when they cannot serve one), while a plain bind of the same
server still gets its 503."""
from __future__ import annotations

import re
import signal
import socket
import ssl
import threading

import pytest

from test_reload import free_port
from test_run import master, wait_for  # noqa: F401 (fixture)
from test_term_queued_connections import SLOW_APP, _established, _get
from tls_support import make_pki

pytestmark = pytest.mark.timeout(90)


def client_hello(ctx: ssl.SSLContext) -> bytes:
    """The first flight of a real TLS client (Python's ssl), as bytes."""
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname="127.0.0.1")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


def _hello_then_read(port: int, hello: bytes, out: dict) -> None:
    """A TLS client's ClientHello, then everything the server sends until
    its end: out["tls"] = the bytes (or the error)."""
    data = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
            s.sendall(hello)
            while chunk := s.recv(4096):
                data += chunk
        out["tls"] = data
    except OSError as exc:
        out["tls"] = repr(exc)


def test_a_tls_client_queued_at_a_drain_is_closed_and_a_plain_one_gets_503(master, tmp_path):
    pki = make_pki(tmp_path / "pki")
    (tmp_path / "slowapp.py").write_text(SLOW_APP)
    tls_port, plain_port = free_port(), free_port()
    m = master("slowapp:app", "-w", "1", "--threads", "1", "--certfile", str(pki.cert),
               "--keyfile", str(pki.key), "-b", f"tls://127.0.0.1:{tls_port}",
               "-b", f"127.0.0.1:{plain_port}", bind=None, ready=1)
    got: dict = {}
    slow = threading.Thread(target=_get, args=(plain_port, "/slow", got))
    slow.start()
    wait_for(lambda: (tmp_path / "in-slow").exists(), 10, "the slow handler")
    # both queued behind it: the kernel's handshakes done, nobody accepted them
    queued = threading.Thread(target=_get, args=(plain_port, "/queued", got))
    queued.start()
    tls = threading.Thread(target=_hello_then_read,
                           args=(tls_port, client_hello(pki.context()), got))
    tls.start()
    wait_for(lambda: _established(plain_port) >= 2 and _established(tls_port) >= 1, 10,
             "the queued connections' handshakes")
    m.proc.send_signal(signal.SIGTERM)
    # both refused, in one line or in two: under load (xdist on a box at
    # load ~20) the two posted connections' refusals were logged apart, 1 + 1
    wait_for(lambda: sum(map(int, re.findall(r"refused (\d+) queued connection\(s\) no loop "
                                             r"thread got to", m.text()))) >= 2, 20,
             lambda: "2 queued connections refused\n" + m.text()[-3000:])
    for t in (queued, tls, slow):
        t.join(20)
    assert got["tls"] == b"", f"a TLS client was sent {got['tls']!r}"
    assert got["/queued"][0] == "HTTP/1.1 503 Service Unavailable", got
    assert got["/slow"][0] == "HTTP/1.1 200 OK", got
    assert m.proc.wait(timeout=30) == 0
