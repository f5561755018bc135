"""proxy_protocol and proxy_allow_from reach the workers of a real master
(`sockherd run --proxy-protocol v2`, the deploy/ HAProxy's `send-proxy-v2`):
a WSGI app answers the client address a v2 header names, a stream app sees
it as conn.peer, a request without a header is closed, and a bad
proxy_allow_from entry stops the start with exit status 2 naming it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from test_run import master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(90)

SIG = b"\r\n\r\n\x00\r\nQUIT\n"


def v2(src: bytes, sport: int) -> bytes:
    """A v2 PROXY TCP4 header from src (4 packed bytes)."""
    return SIG + b"\x21\x11\x00\x0c" + src + b"\x7f\x00\x00\x01" + \
        sport.to_bytes(2, "big") + b"\x00\x50"


def read_all(c) -> bytes:
    out = b""
    try:
        while chunk := c.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def test_wsgi_behind_a_v2_proxy(master, tmp_path: Path):  # noqa: F811
    (tmp_path / "addrapp.py").write_text(
        "def app(environ, start_response):\n"
        "    start_response('200 OK', [('Content-Type', 'text/plain')])\n"
        "    return [('%s:%s' % (environ['REMOTE_ADDR'], environ['REMOTE_PORT'])).encode()]\n")
    m = master("addrapp:app", "-w", "1", "--proxy-protocol", "v2",
               "--proxy-allow-from", "127.0.0.1/32", ready=1)
    with m.connect() as c:
        c.sendall(v2(bytes([203, 0, 113, 77]), 4321) +
                  b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        answer = read_all(c)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"203.0.113.77:4321"), answer
    with m.connect() as c:
        c.sendall(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        assert read_all(c) == b""                   # no header from an allowed peer: closed
    m.wait_log(r"closed the connection from 127\.0\.0\.1:\d+: no PROXY protocol header")


def test_stream_behind_a_v2_proxy(master, tmp_path: Path):  # noqa: F811
    (tmp_path / "peerapp.py").write_text(
        "class Peer:\n"
        "    def on_connect(self, conn):\n"
        "        conn.write(repr(conn.peer).encode())\n"
        "        conn.close()\n"
        "    def on_data(self, conn, data):\n"
        "        pass\n")
    m = master("peerapp:Peer", "-w", "1", "--proxy-protocol", "auto", ready=1)
    with m.connect() as c:
        c.sendall(v2(bytes([198, 51, 100, 1]), 999))
        assert read_all(c) == b"('198.51.100.1', 999)"


def test_a_bad_allow_entry_stops_the_start(tmp_path: Path):
    run = subprocess.run([sys.executable, "-m", "sockherd.master", "run", "--proxy-protocol",
                          "v1", "--proxy-allow-from", "10.0.0.0/33", "-b", "127.0.0.1:0",
                          "--runtime-dir", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert "proxy_allow_from: '10.0.0.0/33'" in run.stderr
