"""Writing to a worker's channel never blocks the master's loop
(adversarial review of issue 19, the other half of §6). The master asked
a worker for its figures (`show proc`, a metrics scrape) with a blocking
send of up to 1 s, and told it to drain with one of up to 5 s. A worker
that does not read its channel (stopped, wedged, or app code) has its
socket buffer full after a few hundred questions, and from then on every
question froze the loop for a second: with one worker stopped and 1,000
`show proc` requests queued, every `status` took 1.00 s for as long as
they lasted, and the other worker, healthy, crashed: its own reply timed
out while the master sat in that send (ChannelTimeout in the worker).
Now the master queues without waiting: a worker that has not taken what
was sent before is not asked again (no answer, as for a slow one), and a
drain goes out once it reads (or its hard stop kills it)."""
from __future__ import annotations

import os
import signal
import time

import pytest

from test_control_odd_and_concurrent_requests import Client
from test_run import children, master, wait_for  # noqa: F401 (fixture)
from test_worker_half_frame_never_blocks_the_master import _status_latency

pytestmark = pytest.mark.timeout(120)


def test_a_stopped_worker_never_blocks_the_loop_nor_its_healthy_sibling(master, tmp_path):
    """One worker SIGSTOPped, 1,000 `show proc` queued by one client:
    `status` from another client is answered within half a second
    throughout (it took 1 s each), the healthy worker lives on, and
    a graceful drain of the stopped worker does not block either."""
    m = master("-w", "2", "--heartbeat-timeout", "60", "--hard-stop-after", "3")
    stopped, healthy = children(m.proc.pid)[:2]
    os.kill(stopped, signal.SIGSTOP)
    try:
        with Client(tmp_path) as flood, Client(tmp_path) as c:
            for _ in range(1000):
                flood.request("show proc")
            start, worst, n = time.monotonic(), 0.0, 0
            while time.monotonic() - start < 8.0:
                worst, n = max(worst, _status_latency(c)), n + 1
            print(f"{n} status requests during the flood, worst {worst * 1000:.0f} ms")
            assert worst < 0.5, f"`status` took {worst:.2f}s with a worker stopped"
            # replaced, then told to drain: its Drain cannot be written either
            c.request("drain", {"target": str(stopped)})
            assert c.replies(1, 30)
            m.wait_log(rf"replaced by pid \d+; draining pid {stopped}", timeout=30)
            worst = max(_status_latency(c) for _ in range(20))
            assert worst < 0.5, f"`status` took {worst:.2f}s after the drain"
        assert healthy in children(m.proc.pid), m.text()
        assert "crashed" not in m.text(), m.text()
    finally:
        os.kill(stopped, signal.SIGCONT)
    assert m.proc.poll() is None
