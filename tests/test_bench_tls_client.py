"""bench/tls_hello.py's clients measure what they say: its full-handshake
client (bench/tls_handshake_client.c) never resumes a session, although the
server issues tickets and wrk, on its reconnects, resumes (the finding that
made the C client necessary: a `Connection: close` wrk run is resumed
handshakes, 543 of 545 against a Python ssl server); its resumption probe
counts resumed sessions; rotations turn the servers' order so that each
server takes each place. Real sockets on loopback, a certificate made by the
openssl CLI at test time; no figure is asserted."""
from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import benchlib as B          # noqa: E402
import http_hello as H        # noqa: E402
import rotations as R         # noqa: E402
import tls_hello as T         # noqa: E402

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("openssl") is None or shutil.which("gcc") is None,
                       reason="needs the openssl CLI and gcc"),
    pytest.mark.skipif(not Path("/usr/include/openssl/ssl.h").exists(),
                       reason="needs libssl-dev"),
]

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\nConnection: close\r\n\r\nHello, world!"


class TLSServer:
    """A threaded HTTPS server answering every request with the hello body
    and closing; it records, per handshake, whether the session was resumed.
    One SSLContext: its tickets are good for every connection."""

    def __init__(self, cert: str, key: str):
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self.sock.getsockname()[1]
        self.reused: list[bool] = []
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.stopping = False
        self.acceptor = threading.Thread(target=self.accept_loop, daemon=True)
        self.acceptor.start()

    def accept_loop(self):
        while not self.stopping:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self.serve, args=(c,), daemon=True)
            self.threads.append(t)
            t.start()

    def serve(self, raw):
        raw.settimeout(10)
        try:
            with self.ctx.wrap_socket(raw, server_side=True) as s:
                with self.lock:
                    self.reused.append(s.session_reused)
                buf = b""
                while b"\r\n\r\n" not in buf:
                    d = s.recv(4096)
                    if not d:
                        return
                    buf += d
                s.sendall(RESPONSE)
        except (OSError, ssl.SSLError):
            pass
        finally:
            raw.close()

    def close(self):
        self.stopping = True
        self.sock.close()
        self.acceptor.join(5)
        for t in self.threads:
            t.join(5)


@pytest.fixture
def server(tmp_path):
    cert, key = T.make_cert(str(tmp_path), "ec256")
    srv = TLSServer(cert, key)
    try:
        yield srv
    finally:
        srv.close()


def test_handshake_client_makes_full_handshakes_only(server):
    binary = B.build_c("tls_handshake_client", ["-pthread"], ["-lssl", "-lcrypto"])
    res = H.parse_result(subprocess.run([binary, str(server.port), "4", "1.5"],
                                        capture_output=True, text=True, timeout=60,
                                        check=True).stdout)
    assert res["requests"] > 0
    assert res["status"] == 0 and res["connect"] == 0
    assert res["reused"] == 0
    with server.lock:
        seen = list(server.reused)
    # every request the client counted was one handshake the server saw, none resumed
    assert len(seen) >= res["requests"]
    assert not any(seen), f"{sum(seen)} of {len(seen)} handshakes were resumed"


def test_resumption_probe_counts_resumed_sessions(server):
    """The same server resumes a session offered again (so the test above
    could fail): the probe tls_hello.py prints per server says 10/10."""
    class Srv:
        port = server.port
        tls = H.client_tls()
    assert T.resumes(Srv(), 10) == "10/10"
    with server.lock:
        assert sum(server.reused) == 10


def test_rotations_put_every_server_in_every_place():
    names = ["a", "b", "c"]
    rounds = [R.rotated(names, r) for r in (1, 2, 3)]
    assert rounds == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    for place in range(3):
        assert sorted(r[place] for r in rounds) == names
