"""A worker's only loop thread goes to sleep with one epoll_wait, not two.

Finding (issue 21's "while here" figure, bench/RESULTS.md 2026-11-26
hello_syscalls): every engine turn first polled without waiting under the
GIL, then, finding nothing, polled again to sleep: a WSGI hello request
cost 0.89 epoll_wait against the C epoll reference's 0.46. With one loop
thread nobody else wants the GIL between turns, so the turn sleeps at once.

Observed through fdcore's `loops` counter (one per fdc_poll call) in the
worker's `totals:` line at its exit: sequential requests on one keep-alive
connection, each sent once the loop thread sleeps in epoll_wait (its
/proc wchan); before the fix each request cost two polls (the one that woke
with it, then the empty one before the sleep), now one.
"""
from __future__ import annotations

import os
import re
import signal

import pytest

from test_dispatch_to_idle_threads import read_response
from test_run import gone, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

REQUESTS = 100


def _sleeping_in_epoll(pid: int) -> list[int]:
    """The threads of pid asleep in epoll_wait (the loop thread, once idle;
    the main thread waits in select)."""
    found = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                if "epoll_wait" in f.read():
                    found.append(int(tid))
        except OSError:
            pass
    return found


def test_sequential_requests_cost_one_poll_each(master):
    m = master("wsgiapp:app", "-w", "1", "--threads", "1", ready=1)
    pid = int(m.wait_log(r"worker \d+\.\d+: ready, pid (\d+)")[0])
    with m.connect() as c:
        for _ in range(REQUESTS):
            # each request wakes a thread asleep in its poll
            wait_for(lambda: _sleeping_in_epoll(pid), 10, "the loop thread asleep")
            c.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
            read_response(c, bytearray())
    m.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: m.proc.poll() is not None, 60, "the master's exit")
    wait_for(lambda: gone(pid), 30, "the worker's exit")
    line = m.wait_log(r"totals: (.*)")[0]
    totals = dict(kv.split("=") for kv in line.split())
    loops = int(totals["loops"])
    # the fix: about 1 per request (plus the start, the drain, a heartbeat);
    # before it about 2
    assert loops < 1.4 * REQUESTS, f"{loops} polls for {REQUESTS} requests: {line}"
    assert re.search(r"exited with status 0", m.text()), m.text()
