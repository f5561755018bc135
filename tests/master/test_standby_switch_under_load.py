"""A reload's switch to the new code under load (issue 36 §3, measured by
bench/reload_under_load.py), on real masters: three faults the bench found,
each fixed here, each test failing before its fix.

1. At the probation's end the standing-by generation drains, and the drain
   took what its listeners' queue held (the sweep for a wake-up lost at a
   drain's start): connections made 10 s after the HUP were answered by
   the old code. A generation that stood by takes nothing (gate.stood_by).
2. The standby's rescue (a wake-up lost at the transition: polling again
   for one look when the queue stays non-empty over two checks) was
   allowed in its first 8 looks, and a thread 3 s in a slow app took its
   looks after it: the old code answered connections made 1.9 s after
   the HUP. Now a window in time (0.4 s from the transition), none for a
   worker of one loop thread (no sibling asleep in its poll can lose a
   wake-up), and the HTTP engine's worker with siblings takes the queue
   once at the transition instead of the window (under load "queued
   over two checks" nearly always held). Shown by the bench (--threads 1
   and 4), not here: on 2 cores a test could not make it happen at will.
3. A keep-alive answer written after a slow app call (it waited behind
   it) counted the connection idle since its request came: the standby
   (or a drain) closed it as the client sent its next request, a
   keep-alive race. Output while draining is activity (conn_io.c).
"""
from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path

import pytest

from test_run import master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

APP = """
import os, time
VERSION = {version!r}
def app(environ, start_response):
    if environ["PATH_INFO"].startswith("/sleep"):
        open(os.path.join(os.path.dirname(__file__), "sleeping"), "w").close()
        time.sleep(float(environ["PATH_INFO"][len("/sleep"):]))
    body = ("%s %d" % (VERSION, os.getpid())).encode()
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(body)))])
    return [body]
"""


def write(path: Path, version: str) -> None:
    (path / "switchapp.py").write_text(APP.format(version=version))


def _answer(s: socket.socket) -> bytes:
    """One response on s (its Content-Length), b"" if it closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    n = int(re.search(rb"Content-Length: (\d+)", head, re.I).group(1))
    while len(body) < n:
        chunk = s.recv(4096)
        if not chunk:
            return b""
        body += chunk
    return head + b"\r\n\r\n" + body


def _get(port: int, target: str = "/") -> tuple[float, str]:
    """(when the connection was made, the version that answered)."""
    t = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        got = _answer(s)
    return t, got.partition(b"\r\n\r\n")[2].decode().split(" ")[0] if got else "none"


def test_after_the_commit_no_new_connection_gets_the_old_code(master, tmp_path):
    write(tmp_path, "v1")
    m = master("switchapp:app", "-w", "1", "--threads", "1", "--reload-probation", "1.5",
               ready=1)
    seen: list[tuple[float, str]] = []
    stop = threading.Event()

    def load():
        while not stop.is_set():
            seen.append(_get(m.port))
    loaders = [threading.Thread(target=load, daemon=True) for _ in range(16)]
    for t in loaders:
        t.start()
    try:
        wait_for(lambda: len(seen) > 50, 10, "the load answered")
        for gen in range(2, 6):                           # four rounds: a race each
            write(tmp_path, f"v{gen}")
            m.proc.send_signal(1)                         # HUP
            m.wait_log(rf"reload: generation {gen} ready in [\d.]+s; on probation",
                       timeout=60)
            # the new worker's only thread busy across the probation's end,
            # so connections queue on the listener as the old one drains
            slow = threading.Thread(target=lambda: seen.append(_get(m.port, "/sleep2.5")),
                                    daemon=True)
            slow.start()
            m.wait_log(rf"reload: generation {gen} serving \(ready in", timeout=60)
            slow.join(timeout=20)
    finally:
        stop.set()
        for t in loaders:
            t.join(timeout=20)
    for old, new in ((f"v{g - 1}", f"v{g}") for g in range(2, 6)):
        first = min(t for t, v in seen if v == new)
        # the old worker accepts until the master's Standby reaches it: on
        # a loaded box up to ~0.3 s after the new one's first answer; the
        # faults here are at the probation's end (1.5 s)
        late = [round(t - first, 3) for t, v in seen if v == old and t > first + 0.5]
        assert not late, f"{old} answered connections made this long after {new}'s first: {late}"
    assert "none" not in {v for _, v in seen}, "a connection got no answer"
    assert sum(v == "v5" for _, v in seen) > 20


def test_a_standby_pending_behind_a_slow_call_takes_nothing_at_the_commit(master, tmp_path):
    """The old worker's only thread in the app across the standby and the
    commit: its standby's gate half is not made, and the drain must not
    sweep the listener's queue (the new generation's) into that thread."""
    write(tmp_path, "v1")
    m = master("switchapp:app", "-w", "1", "--threads", "1", "--reload-probation", "1.5",
               ready=1)
    seen: list[tuple[float, str]] = []
    stop = threading.Event()

    def load():
        while not stop.is_set():
            seen.append(_get(m.port))
    slow = threading.Thread(target=lambda: seen.append(_get(m.port, "/sleep6")), daemon=True)
    slow.start()                          # v1's only thread asleep across standby and commit
    wait_for(lambda: (tmp_path / "sleeping").exists(), 10, "v1's thread in its slow call")
    loaders = [threading.Thread(target=load, daemon=True) for _ in range(16)]
    for t in loaders:
        t.start()
    try:
        write(tmp_path, "v2")
        m.proc.send_signal(1)
        m.wait_log(r"reload: generation 2 serving \(ready in", timeout=60)
        committed = time.monotonic()
        slow.join(timeout=20)
    finally:
        stop.set()
        for t in loaders:
            t.join(timeout=20)
    late = [round(t - committed, 3) for t, v in seen if v != "v2" and t > committed - 0.2]
    assert not late, f"not the new code, for connections made at the commit: {late}"


def test_a_keep_alive_answer_written_after_a_slow_call_is_not_closed_as_idle(master, tmp_path):
    """3: the answer waits behind a slow call of the same thread; it is
    written, after it, while the worker stands by; the client's next
    request on that connection is answered (Connection: close), never cut."""
    write(tmp_path, "v1")
    m = master("switchapp:app", "-w", "1", "--threads", "1", "--reload-probation", "30",
               ready=1)
    held = socket.create_connection(("127.0.0.1", m.port), timeout=15)
    first = socket.create_connection(("127.0.0.1", m.port), timeout=15)
    slow = socket.create_connection(("127.0.0.1", m.port), timeout=15)
    try:
        # the thread busy 1 s; meanwhile the keep-alive request and a 3 s one
        # come, and are read in one turn once it is free: the quick one's
        # answer queued behind the slow call (h1_conn.c owe)
        first.sendall(b"GET /sleep1 HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.3)
        held.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        slow.sendall(b"GET /sleep3 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"v1 " in _answer(first)
        time.sleep(0.2)                      # into the 3 s call
        write(tmp_path, "v2")
        m.proc.send_signal(1)
        m.wait_log(r"\[worker \d+\] INFO standing by", timeout=30)
        one = _answer(held)                  # written after the slow call
        assert b"v1 " in one, one
        held.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        two = _answer(held)
        assert two, "the kept-alive connection was closed under its next request"
        assert b"Connection: close" in two, two
    finally:
        for s in (held, first, slow):
            s.close()
