"""deploy/haproxy/haproxy.cfg, run: HAProxy (Debian's) in front of a real
sockherd master started as the file's comment says (`--proxy-protocol v2`),
the file's ports swapped for free ephemeral ones. A client from 127.0.0.2
through HAProxy (127.0.0.1) is seen by the app as 127.0.0.2 with a v2
header's keys: send-proxy-v2 reaches the app (issue 24 §1). Skipped with
the reason when haproxy is not installed."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CFG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
HAPROXY = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy")
                                      else None)

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(HAPROXY is None, reason="no haproxy installed")]

APP = """
def app(environ, start_response):
    body = ("%s %s" % (environ["REMOTE_ADDR"], environ.get("proxy.version"))).encode()
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(body)))])
    return [body]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port: int, source: str = "127.0.0.1") -> tuple[int, bytes]:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5,
                                      source_address=(source, 0)) as c:
            c.sendall(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
            data = b"".join(iter(lambda: c.recv(65536), b""))
    except OSError:
        return 0, b""
    m = re.match(rb"HTTP/1\.\d (\d+)", data)
    return (int(m.group(1)) if m else 0), data.partition(b"\r\n\r\n")[2]


def wait_for(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL if p.args[0] == HAPROXY else signal.SIGINT)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def test_the_client_address_reaches_the_app_through_haproxy(tmp_path: Path, procs):
    front, app_port, metrics = free_port(), free_port(), free_port()
    text = CFG.read_text()
    assert "send-proxy-v2" in text and "127.0.0.1:8000" in text
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(text.replace("127.0.0.1:8080", f"127.0.0.1:{front}")
                   .replace("127.0.0.1:8000", f"127.0.0.1:{app_port}")
                   .replace("port 9100", f"port {metrics}"))
    (tmp_path / "addrapp.py").write_text(APP)
    with open(tmp_path / "sockherd.log", "wb") as log, \
            open(tmp_path / "haproxy.log", "wb") as hlog:
        start(procs, tmp_path, app_port, metrics, cfg, log, hlog)
    wait_for(lambda: get(front)[0] == 200, 60,
             "HAProxy to serve (its check of /-/ready up)")
    status, body = get(front, source="127.0.0.2")
    assert (status, body) == (200, b"127.0.0.2 2"), (tmp_path / "sockherd.log").read_text()
    # the app port itself, from HAProxy's host with no header: closed, no answer
    assert get(app_port) == (0, b"")


def start(procs, tmp_path, app_port, metrics, cfg, log, hlog) -> None:
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "sockherd.master", "run", "addrapp:app", "-w", "1",
         "-b", f"127.0.0.1:{app_port}", "--metrics", f"127.0.0.1:{metrics}",
         "--proxy-protocol", "v2", "--proxy-allow-from", "127.0.0.1",
         "--runtime-dir", str(tmp_path / "run"), "--chdir", str(tmp_path)],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path))
    procs.append(subprocess.Popen([HAPROXY, "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL,
                                  stderr=hlog))
