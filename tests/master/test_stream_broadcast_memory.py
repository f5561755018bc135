"""A broadcast to slow readers cannot grow a stream worker without bound
(issue 20, finding 3: a chat-style broadcast to 4 slow readers took a
worker to 989 MB in 6 s). A real master and worker on loopback: one client
floods a chat room whose 4 other members never read, for 4 s; the
worker's RSS is sampled all along."""
from __future__ import annotations

import re
import socket
import threading
import time

import pytest

from test_run import children, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

LIMIT = 4 << 20
MiB = 1 << 20

CHAT = """
import threading
ROOM = set()
LOCK = threading.Lock()

class Chat:
    '''Everything a member says goes to every other member; deaf to
    flow control (the limit is what bounds it).'''
    polite = False
    def on_connect(self, conn):
        self.paused = False
        with LOCK:
            ROOM.add(conn)
        conn.write(b"joined\\n")
    def on_data(self, conn, data):
        with LOCK:
            members = list(ROOM)
        for other in members:
            if other is not conn and not (self.polite and other.writing_paused):
                other.write(data)
    def on_close(self, conn):
        with LOCK:
            ROOM.discard(conn)

class PoliteChat(Chat):
    '''Skips a member whose output is paused (pause_writing): it misses
    messages instead of costing memory.'''
    polite = True
"""


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) * 1024


def flood(master, tmp_path, app: str, seconds: float = 4.0):
    """Runs the room (app, with a 4 MiB output limit): 4 silent readers,
    one flooding writer. Returns (the master, the worker's peak RSS - its
    RSS before, readers the server closed)."""
    (tmp_path / "chat.py").write_text(CHAT)
    m = master(app, "--interface", "stream", "-w", "1",
               "--stream-output-limit", str(LIMIT), ready=1)
    pid = children(m.proc.pid)[0]
    readers = []
    for _ in range(4):
        r = m.connect()
        r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        assert r.recv(7) == b"joined\n"          # in the room
        readers.append(r)
    base = rss(pid)
    peak = [base]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], rss(pid))
            stop.wait(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    w = m.connect()
    assert w.recv(7) == b"joined\n"
    chunk = b"m" * (64 << 10)
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            w.sendall(chunk)
    finally:
        stop.set()
        sampler.join(10)
    closed = 0
    for r in readers:
        r.setblocking(False)
        try:
            while r.recv(1 << 20):
                pass
        except BlockingIOError:
            continue                      # open: data left and no end
        except OSError:
            pass
        closed += 1
    for s in readers + [w]:
        s.close()
    return m, peak[0] - base, closed


def test_a_broadcast_that_ignores_flow_control_is_bounded_by_the_output_limit(master,
                                                                               tmp_path):
    m, grew, closed = flood(master, tmp_path, "chat:Chat")
    assert grew < 4 * LIMIT + 32 * MiB, f"worker RSS grew by {grew / MiB:.0f} MiB"
    assert closed == 4
    m.wait_log(r"past stream_output_limit \(4194304\): closing it", count=4)


def test_a_broadcast_that_honours_pause_writing_stays_near_the_high_water_mark(master,
                                                                                tmp_path):
    m, grew, closed = flood(master, tmp_path, "chat:PoliteChat")
    assert grew < 4 * (MiB + (64 << 10)) + 32 * MiB, f"worker RSS grew by {grew / MiB:.0f} MiB"
    assert closed == 0
    assert "past stream_output_limit" not in m.text()
