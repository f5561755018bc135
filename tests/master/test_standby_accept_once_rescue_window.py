"""Issue 36 review 4 of the reload switch (3b13202), on real masters.

1. standby() mails the gate's half (_standby_gate: polling off, then the
   HTTP engine's accept-once, or a stream worker's 0.4 s rescue window) to
   the first loop thread not busy in the app, else to the first alive. With
   every loop thread in the app at the transition, that half runs when
   position 0's call ends, however late (a sibling's standby_tick has
   turned polling off meanwhile, so nothing else marks the transition):
   the "connections made before we stood by" accept-once, and the stream
   rescue window, then take connections made seconds after the standby
   began. Fails on 3b13202 (HTTP: the old code answers a connection made
   3.5 s after the HUP, taken at 8 s; stream: all four). With the long call
   on position 1 instead (the mail goes to the short one) both pass: the
   late mail is the cause.

Fixed: the gate's half is mailed to every loop thread and made once, by
the first to turn (a numbered standby), deciding its accept-once or rescue
window there, by whether a sibling is out of the app (may be asleep in its
poll); standby_tick never turns polling off before it.

Held up (pass on 3b13202): an idle new generation takes everything while
the gate's half waits; a trickling slow reader does not hold a drain past
hard_stop_after although its output keeps moving last_active.
"""
from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from test_run import master, wait_for  # noqa: F401 (fixture)
from test_standby_switch_under_load import _answer

pytestmark = pytest.mark.timeout(120)

# /hold: the loop thread at position 0 (the lowest sockherd-N) sleeps LONG,
# any other SHORT; a mark file per call says it is in the app
APP = """
import os, threading, time
VERSION = {version!r}
MARKS = {marks!r}
LONG, SHORT = {long!r}, {short!r}
def _position():
    names = sorted(int(t.name.split("-")[1]) for t in threading.enumerate()
                   if t.name.startswith("sockherd-") and t.name.split("-")[1].isdigit())
    me = int(threading.current_thread().name.split("-")[1])
    return names.index(me)
def app(environ, start_response):
    if environ["PATH_INFO"] == "/hold":
        pos = _position()
        open(os.path.join(MARKS, "in-%s-%d" % (VERSION, pos)), "w").close()
        time.sleep(LONG if pos == 0 else SHORT)
    body = ("%s %d" % (VERSION, os.getpid())).encode()
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(body)))])
    return [body]
"""


def write(path: Path, version: str, long: float = 0.0, short: float = 0.0) -> Path:
    marks = path / "marks"
    marks.mkdir(exist_ok=True)
    (path / "holdapp.py").write_text(APP.format(version=version, marks=str(marks),
                                                long=long, short=short))
    return marks


def _get(port: int, target: str = "/", timeout: float = 20) -> tuple[float, str]:
    t = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        got = _answer(s)
    return t, got.partition(b"\r\n\r\n")[2].decode().split(" ")[0] if got else "none"


def test_held_up_idle_new_generation_takes_what_comes_while_the_gate_half_waits(master, tmp_path):
    """(held up) both loop threads in the app as the standby begins; the
    one the gate's half is mailed to (position 0) stays 8 s, its sibling
    2.5 s. With the new generation idle, every connection made after the
    sibling is back goes to the new code (its pollers come first in the
    listener's wait queue: the old ones requeued at their accepts)."""
    marks = write(tmp_path, "v1", long=8.0, short=2.5)
    m = master("holdapp:app", "-w", "1", "--threads", "2", "--reload-probation", "30",
               ready=1)
    holds: list = []
    for _ in range(2):
        t = threading.Thread(target=lambda: holds.append(_get(m.port, "/hold", 30)),
                             daemon=True)
        t.start()
        holds.append(t)
        time.sleep(0.2)
    wait_for(lambda: all((marks / f"in-v1-{p}").exists() for p in (0, 1)), 10,
             "both loop threads in the app")
    t_in = time.monotonic()
    write(tmp_path, "v2")
    m.proc.send_signal(1)                                  # HUP
    m.wait_log(r"reload: generation 2 ready in [\d.]+s; on probation", timeout=30)
    m.wait_log(r"\[worker \d+\] INFO standing by", timeout=10)
    assert time.monotonic() - t_in < 2.3, "the standby began after the short call ended"
    # the sibling (2.5 s) is back in its poll; position 0 is in the app until t_in + 8
    wait_for(lambda: time.monotonic() > t_in + 3.0, 10, "the short call over")
    seen = []
    while time.monotonic() < t_in + 7.0:
        seen.append(_get(m.port))
        time.sleep(0.02)
    late = [round(t - t_in, 2) for t, v in seen if v != "v2"]
    assert seen and not late, (f"{len(late)} of {len(seen)} connections made after the "
                               f"standby began were answered by the old code (or none): {late[:10]}")


def test_the_accept_once_is_at_the_standby_not_when_the_mailed_thread_leaves_the_app(master, tmp_path):
    """1: as above, but the new generation's two threads are busy too (a
    burst of slow requests just after the commit). The old worker's
    sibling, back from its 2.5 s call, is the first sleeper in the
    listener's wait queue and accepts every new connection while its
    position 0 stays in its 12 s call: the old code answers connections
    made seconds after the standby began (the gate's half not applied)."""
    marks = write(tmp_path, "v1", long=8.0, short=2.5)
    m = master("holdapp:app", "-w", "1", "--threads", "2", "--reload-probation", "30",
               ready=1)
    holds: list = []

    def hold():
        holds.append(_get(m.port, "/hold", 40))
    for _ in range(2):
        threading.Thread(target=hold, daemon=True).start()
        time.sleep(0.2)
    wait_for(lambda: all((marks / f"in-v1-{p}").exists() for p in (0, 1)), 10,
             "both old loop threads in the app")
    t_in = time.monotonic()
    write(tmp_path, "v2", long=14.0, short=14.0)
    m.proc.send_signal(1)                                  # HUP
    m.wait_log(r"reload: generation 2 ready in [\d.]+s; on probation", timeout=30)
    m.wait_log(r"\[worker \d+\] INFO standing by", timeout=10)
    assert time.monotonic() - t_in < 2.3, "the standby began after the short call ended"
    for _ in range(2):                                     # the new generation busy
        threading.Thread(target=hold, daemon=True).start()
        time.sleep(0.2)
    wait_for(lambda: all((marks / f"in-v2-{p}").exists() for p in (0, 1)), 10,
             "both new loop threads in the app")
    # the old sibling (2.5 s) is back in its poll; position 0 in the app until t_in + 12
    wait_for(lambda: time.monotonic() > t_in + 3.5, 10, "the old short call over")  # position 0 is back at t_in + 8
    made = time.monotonic()
    got: list = []
    clients = [threading.Thread(target=lambda: got.append(_get(m.port, "/", 30)), daemon=True)
               for _ in range(4)]
    for c in clients:
        c.start()
        time.sleep(0.1)
    for c in clients:
        c.join(timeout=40)
    old = [round(t - t_in, 2) for t, v in got if v == "v1"]
    assert len(got) == 4 and "none" not in {v for _, v in got}, got
    assert not old, (f"the old code answered connections made {old} s after the HUP "
                     f"({round(made - t_in, 2)} s: the standby had begun)")


STREAM_APP = """
import os, threading, time
VERSION = {version!r}
MARKS = {marks!r}
LONG, SHORT = {long!r}, {short!r}
def _position():
    names = sorted(int(t.name.split("-")[1]) for t in threading.enumerate()
                   if t.name.startswith("sockherd-") and t.name.split("-")[1].isdigit())
    return names.index(int(threading.current_thread().name.split("-")[1]))
class Hold:
    def on_connect(self, conn):
        conn.write(VERSION.encode() + b"\\n")
    def on_data(self, conn, data):
        if data.startswith(b"hold"):
            pos = _position()
            open(os.path.join(MARKS, "in-%s-%d" % (VERSION, pos)), "w").close()
            time.sleep(LONG if pos == 0 else SHORT)
            conn.write(b"held\\n")
"""


def write_stream(path: Path, version: str, long: float = 0.0, short: float = 0.0) -> Path:
    marks = path / "marks"
    marks.mkdir(exist_ok=True)
    (path / "holdstream.py").write_text(STREAM_APP.format(version=version, marks=str(marks),
                                                          long=long, short=short))
    return marks


def _greeting(port: int, hold: bool = False, timeout: float = 40) -> tuple[float, str]:
    t = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        got = b""
        while not got.endswith(b"\n"):
            chunk = s.recv(100)
            if not chunk:
                return t, "none"
            got += chunk
        if hold:
            s.sendall(b"hold")
            s.recv(100)
    return t, got.decode().strip()


def test_stream_rescue_window_starts_when_the_gate_half_runs_not_at_the_standby(master, tmp_path):
    """1, --interface stream: the rescue window (0.4 s) opens when the
    mailed thread (position 0, 8 s in a handler) gets to its mail, not at
    the transition; with the new generation's threads busy, the queue is
    non-empty over two checks then and the old code takes connections made
    seconds after the standby began."""
    marks = write_stream(tmp_path, "v1", long=8.0, short=2.5)
    m = master("holdstream:Hold", "--interface", "stream", "-w", "1", "--threads", "2",
               "--reload-probation", "30", ready=1)
    for _ in range(2):
        threading.Thread(target=lambda: _greeting(m.port, hold=True), daemon=True).start()
        time.sleep(0.2)
    wait_for(lambda: all((marks / f"in-v1-{p}").exists() for p in (0, 1)), 10,
             "both old loop threads in a handler")
    t_in = time.monotonic()
    write_stream(tmp_path, "v2", long=14.0, short=14.0)
    m.proc.send_signal(1)                                  # HUP
    m.wait_log(r"reload: generation 2 ready in [\d.]+s; on probation", timeout=30)
    m.wait_log(r"\[worker \d+\] INFO standing by", timeout=10)
    assert time.monotonic() - t_in < 2.3, "the standby began after the short call ended"
    for _ in range(2):                                     # the new generation busy
        threading.Thread(target=lambda: _greeting(m.port, hold=True), daemon=True).start()
        time.sleep(0.2)
    wait_for(lambda: all((marks / f"in-v2-{p}").exists() for p in (0, 1)), 10,
             "both new loop threads in a handler")
    wait_for(lambda: time.monotonic() > t_in + 3.5, 10, "the old short call over")
    got: list = []
    clients = [threading.Thread(target=lambda: got.append(_greeting(m.port)), daemon=True)
               for _ in range(4)]
    for c in clients:
        c.start()
        time.sleep(0.1)
    for c in clients:
        c.join(timeout=40)
    old = [round(t - t_in, 2) for t, v in got if v == "v1"]
    assert len(got) == 4 and "none" not in {v for _, v in got}, got
    assert not old, f"the old code answered connections made {old} s after the HUP"


BIG_APP = """
def app(environ, start_response):
    body = b"x" * (32 << 20)
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(body)))])
    return [body]
"""


def test_held_up_a_trickling_slow_reader_does_not_hold_a_drain_past_hard_stop_after(master, tmp_path):
    """(held up) output while draining moves last_active (conn_io.c), so a
    slow reader's connection is never idle; the drain still ends at
    hard_stop_after."""
    (tmp_path / "bigapp.py").write_text(BIG_APP)
    m = master("bigapp:app", "-w", "1", "--hard-stop-after", "3", "--idle-grace", "0.5",
               ready=1)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(10)
    s.connect(("127.0.0.1", m.port))
    stop = threading.Event()
    try:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(1024)

        def trickle():
            while not stop.is_set():
                try:
                    if not s.recv(2048):
                        return
                except OSError:
                    return
                time.sleep(0.02)
        threading.Thread(target=trickle, daemon=True).start()
        t0 = time.monotonic()
        m.proc.send_signal(15)                              # TERM: a drain
        m.proc.wait(timeout=20)
        took = time.monotonic() - t0
        assert took < 3 + 3, f"the drain took {took:.1f} s (hard_stop_after 3)"
    finally:
        stop.set()
        s.close()
