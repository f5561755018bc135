"""Writes from a thread of the app's own (not a loop thread) are flow
controlled like the others, and take bytes only (issue 20's review). Found
on a real `sockherd run --threads 1`:

- such a write is posted to the owning loop thread's mail, and `pending`
  did not count it until that thread ran it: a producer thread that honours
  `pending` (writes 1 MiB while it is under 2 MiB), to a client reading
  all the time, posted dozens of MiB at once; the worker grew from 23 to
  147 MB and the connection was closed "past stream_output_limit", its
  output dropped. Same for one that honours `writing_paused` (set only once
  the owner ran the writes); one that ignores both took the worker to 65 MB
  (the limit only checked once the owner ran each write);
- `conn.write(5)` from such a thread sent five NUL bytes (bytes(5)); from a
  loop thread it is a TypeError.

A real master and worker on loopback."""
from __future__ import annotations

import threading

import pytest

from test_run import children, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

TOTAL = 96

APPS = f"""
import threading, time

class Producer:
    '''b"pending" / b"paused": a thread of its own sends {TOTAL} MiB in 1 MiB
    writes, holding back while conn.pending is past 2 MiB, or while
    conn.writing_paused; then closes.'''
    def on_data(self, conn, data):
        by_pending = data.startswith(b"pending")
        def run():
            for _ in range({TOTAL}):
                while (conn.pending > (2 << 20) if by_pending else conn.writing_paused):
                    if conn.closed:
                        return
                    time.sleep(0.001)
                conn.write(b"q" * (1 << 20))
            conn.close()
        threading.Thread(target=run, daemon=True).start()

class Flood:
    '''A thread of its own writes 1 MiB pieces, 200 MiB, holding back for nothing.'''
    def on_connect(self, conn):
        def run():
            for _ in range(200):
                conn.write(b"f" * (1 << 20))
        threading.Thread(target=run, daemon=True).start()
    def on_data(self, conn, data):
        pass

class Typed:
    '''Writes what the client names, from a thread of its own.'''
    def on_data(self, conn, data):
        value = eval(data)
        def run():
            try:
                conn.write(value)
                conn.write(b"written")
            except TypeError:
                conn.write(b"TypeError")
        threading.Thread(target=run, daemon=True).start()
"""


def rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) >> 10


@pytest.mark.parametrize("honours", ["pending", "paused"])
def test_a_producer_thread_that_honours_flow_control_is_bounded_and_served(master, tmp_path,
                                                                           honours):
    (tmp_path / "protos.py").write_text(APPS)
    m = master("protos:Producer", "--interface", "stream", "-w", "1", "--threads", "1", ready=1)
    pid = children(m.proc.pid)[0]
    base = rss_mb(pid)
    peak, done = [base], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], rss_mb(pid))
            done.wait(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with m.connect() as c:
            c.settimeout(30)
            c.sendall(honours.encode())
            got = 0
            while chunk := c.recv(1 << 20):
                got += len(chunk)
    finally:
        done.set()
        watcher.join()
    assert got == TOTAL << 20, m.text()
    assert "stream_output_limit" not in m.text()
    # the 16 MiB limit would do; a producer that holds back needs much less
    assert peak[0] - base < 20, f"worker RSS {base} -> {peak[0]} MB"
    assert children(m.proc.pid) == [pid]


def test_a_producer_thread_that_ignores_flow_control_is_cut_at_the_limit(master, tmp_path):
    """Its writes are refused once what waits (queued or buffered) passes
    stream_output_limit: the connection is closed with the log line, and the
    worker never held much more than the limit."""
    (tmp_path / "protos.py").write_text(APPS)
    m = master("protos:Flood", "--interface", "stream", "-w", "1", "--threads", "1", ready=1)
    pid = children(m.proc.pid)[0]
    base = rss_mb(pid)
    peak = [base]
    with m.connect() as c:               # reads nothing until the log line
        wait_for(lambda: (peak.__setitem__(0, max(peak[0], rss_mb(pid))) or
                          "past stream_output_limit" in m.text()), 30, "the limit's log line")
        c.settimeout(30)
        while c.recv(1 << 20):
            pass
    assert peak[0] - base < 16 + 20, f"worker RSS {base} -> {peak[0]} MB"
    assert children(m.proc.pid) == [pid]


@pytest.mark.parametrize("value", ["5", "[65, 66]", "'text'", "None"])
def test_a_write_from_an_app_thread_takes_bytes_only(master, tmp_path, value):
    """Not bytes-like: a TypeError in the writing thread, nothing sent (the
    same as from a loop thread)."""
    (tmp_path / "protos.py").write_text(APPS)
    m = master("protos:Typed", "--interface", "stream", "-w", "1", ready=1)
    for v, answer in ((value, b"TypeError"), ("b'ok'", b"okwritten"),
                      ("bytearray(b'ok')", b"okwritten"), ("memoryview(b'ok')", b"okwritten")):
        with m.connect() as c:
            c.sendall(v.encode())
            got = b""
            while len(got) < len(answer):       # recv waits at most the socket's timeout
                chunk = c.recv(100)
                assert chunk, got
                got += chunk
            assert got == answer, v
    assert "loop thread" not in m.text()
