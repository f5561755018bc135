"""TERM while every loop thread of a worker is inside a slow handler: what
the kernel has queued on the listeners is accepted at once and answered, and
new connections are refused, never queued behind the handler (README: TERM
refuses new connections, never accepts then resets them)."""
from __future__ import annotations

import re
import signal
import socket
import threading
import time

import pytest

from test_run import master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(60)

SLOW_APP = """\
import os, time

def app(environ, start_response):
    if environ["PATH_INFO"] == "/slow":
        open(os.path.join(os.path.dirname(__file__), "in-slow"), "w").close()
        time.sleep(3)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"done " + environ["PATH_INFO"].encode()]
"""


def _get(port: int, path: str, out: dict) -> None:
    """One request; out[path] = (status line or the error, seconds)."""
    t = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            data = b""
            while b"done" not in data and (chunk := s.recv(4096)):
                data += chunk
        out[path] = (data.split(b"\r\n")[0].decode() or "EOF", time.monotonic() - t)
    except OSError as exc:
        out[path] = (repr(exc), time.monotonic() - t)


def test_a_connection_queued_behind_a_busy_thread_at_term(master, tmp_path):
    """Defect: at TERM with the only loop thread in a 3 s handler, a
    connection already queued waited for the handler's end to be accepted
    (up to hard_stop_after, then reset at the worker's exit), and the
    listener kept queueing new connections meanwhile (they were accepted
    after the TERM instead of refused)."""
    (tmp_path / "slowapp.py").write_text(SLOW_APP)
    m = master("slowapp:app", "-w", "1", "-t", "1", ready=1)
    got: dict = {}
    slow = threading.Thread(target=_get, args=(m.port, "/slow", got))
    slow.start()
    wait_for(lambda: (tmp_path / "in-slow").exists(), 10, "the slow handler")
    queued = threading.Thread(target=_get, args=(m.port, "/queued", got))
    queued.start()
    time.sleep(0.2)                 # its handshake is done by the kernel: queued
    term_at = time.time()
    m.proc.send_signal(signal.SIGTERM)
    took = m.wait_log(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d+) \[worker \d+\] INFO drain: "
                      r"took 1 connection", timeout=10)[0]
    taken_at = time.mktime(time.strptime(took[0], "%Y-%m-%d %H:%M:%S")) + int(took[1]) / 1000
    assert taken_at - term_at < 1.0, "the queued connection waited for the handler"
    # a new connection after the TERM: refused at once, not queued
    wait_for(lambda: re.search(r"draining \(", m.text()), 10, "the worker's drain")
    late: dict = {}
    _get(m.port, "/late", late)
    assert "ConnectionRefusedError" in late["/late"][0], late
    for t in (slow, queued):
        t.join(20)
    assert got["/slow"][0] == "HTTP/1.1 200 OK", got
    assert got["/queued"][0] == "HTTP/1.1 200 OK", got    # answered, never reset
    assert m.proc.wait(timeout=30) == 0
