"""Review of "a turn's answers written together" on WSGI --threads 1
(worker/native/proto/http1/h1_conn.c: owe): an answer that ends < 0.5 ms after the
thread's previous one is queued and written at the turn's end. A request
whose body goes to the slow path (larger than body_buffer: wsgi.py's
serve_slow) makes the loop thread wait on its client's upload, inside the
turn: an answer queued before it waited for a stranger's upload, as long
as that client took (up to body_timeout), where it went at once before the
owed list. Found in review; the fix writes the thread's list before the
slow path runs.

Real master and worker, raw sockets (tests/master/test_run.py's fixture)."""
from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
APPS = HERE.parent / "apps"
sys.path.insert(0, str(HERE.parent / "master"))
sys.path.insert(0, str(HERE.parent))
from test_run import master, wait_for  # noqa: E402,F401  (the fixture)
from tls_support import read_response  # noqa: E402

pytestmark = pytest.mark.timeout(120)

HOLD = 3.0           # seconds the uploading client waits before its body's rest


def read_answer(s: socket.socket) -> bytes:
    head, body = read_response(s)
    return head + b"\r\n\r\n" + body


def test_answers_not_held_by_a_strangers_slow_upload(master, tmp_path):
    m = master("wsgi_owed:app", "-w", "1", "--threads", "1", "--pythonpath", str(APPS),
               "--body-buffer", "1024", ready=1)
    addr = ("127.0.0.1", m.port)
    mark = tmp_path / "busy"
    busy = socket.create_connection(addr, timeout=30)
    fast = [socket.create_connection(addr, timeout=30) for _ in range(4)]
    up = socket.create_connection(addr, timeout=30)
    try:
        for s in fast + [up]:                   # accepted and idle: one turn each, not now
            s.sendall(b"GET /fast HTTP/1.1\r\nHost: t\r\n\r\n")
            assert read_answer(s).endswith(b"ok")
        # the loop thread busy 300 ms: what follows arrives meanwhile and is
        # one poll's batch, in this order (the fast ones, then the upload)
        busy.sendall(f"GET /sleep?ms=300&mark={mark} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        wait_for(mark.exists, 10, lambda: "the app's sleep")
        for s in fast:
            s.sendall(b"GET /fast HTTP/1.1\r\nHost: t\r\n\r\n")
        up.sendall(b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n"
                   + b"x" * 100)
        assert read_answer(busy).endswith(b"slept")
        t0 = time.monotonic()
        # the upload ends HOLD seconds from now, whatever the reads below see
        rest = threading.Timer(HOLD, up.sendall, (b"x" * (100000 - 100),))
        rest.start()
        waited = []
        for s in fast:
            assert read_answer(s).endswith(b"ok")
            waited.append(round(time.monotonic() - t0, 3))
        rest.join()
        assert read_answer(up).endswith(b"100000")
        assert max(waited) < HOLD / 2, \
            f"answers already whole waited {waited} s for another client's upload"
    finally:
        for s in fast + [busy, up]:
            s.close()
