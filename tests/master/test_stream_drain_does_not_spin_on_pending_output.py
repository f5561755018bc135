"""A draining stream worker does not spin while a connection's output
waits for its client (issue 20's review). Found on a real `sockherd run`:
a connection with output pending and no byte moved for idle_grace is not
idle (it is not closed) but its idle deadline was in the past, so every
drain step asked poll for a 1 ms timeout: about 800 loop turns a second
(`loops=2843` in 3.5 s, each turn walking every connection of the thread)
until the client read or hard_stop_after.

A real master and worker; the client reads nothing for 2 s after TERM,
then everything: it gets all its output, then the FIN (idle after its
output went), and the worker exits drained before the deadline, having
turned its loop a few times, not thousands."""
from __future__ import annotations

import signal
import time

import pytest

from test_run import children, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

SIZE = 24 << 20          # past what loopback's socket buffers take: most of it waits

APPS = f"""
class Blob:
    def on_connect(self, conn):
        conn.write(b"z" * {SIZE})
    def on_data(self, conn, data):
        pass
"""


def test_a_drain_waits_for_pending_output_without_spinning(master, tmp_path):
    (tmp_path / "protos.py").write_text(APPS)
    m = master("protos:Blob", "--interface", "stream", "-w", "1", "--threads", "1",
               "--idle-grace", "0.2", "--hard-stop-after", "30",
               "--stream-output-limit", str(64 << 20), ready=1)
    pid = children(m.proc.pid)[0]
    c = m.connect()
    c.settimeout(30)
    got = len(c.recv(1))             # on_connect ran: the output is queued
    m.proc.send_signal(signal.SIGTERM)
    m.wait_log(rf"\[worker {pid}\] INFO draining")
    # the client reads nothing for 2 s: the time a spinning drain turns in
    end = time.monotonic() + 2
    wait_for(lambda: time.monotonic() >= end, 5, "2 s of drain with the output waiting")
    while chunk := c.recv(1 << 20):
        got += len(chunk)
    c.close()
    assert got == SIZE
    m.wait_log(rf"exited with status 0 \(drained\), pid {pid}")
    loops = int(m.wait_log(rf"\[worker {pid}\] INFO totals: .*loops=(\d+)")[0])
    assert loops < 300, f"{loops} loop turns in a drain of about 2 s"
    assert m.proc.wait(timeout=30) == 0
