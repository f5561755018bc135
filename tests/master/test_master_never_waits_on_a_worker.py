"""The master never waits on a worker that does not read its channel
(found while merging issue 19 §6's fix: `ProcessTable.feed` sent a Drain
with a blocking send of up to 5 s and `Asker.ask` each stats request with
one of up to 1 s. A stopped or wedged worker whose socket buffer had filled
— thousands of `show proc` requests — froze the master's loop: every later
control request waited a second per ask). Now messages to a worker are
posted: what its socket does not take stays in its channel's outbox and is
written when the socket becomes writable; a stats request to a worker that
has not taken the last one is answered "no answer" at once."""
from __future__ import annotations

import os
import signal
import time

import pytest

from test_control_review import Client, _ask
from test_run import children, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)


def test_a_worker_that_does_not_read_never_stalls_the_master(master, tmp_path):
    m = master("-w", "1", "--heartbeat-interval", "30", "--heartbeat-timeout", "100", ready=1)
    worker, = children(m.proc.pid)
    os.kill(worker, signal.SIGSTOP)
    try:
        # enough `show proc` requests to fill the worker's channel many times over
        # (in rounds of 100: the control socket drops replies past its
        # send high-water mark of 128 to a client that does not read)
        got = 0
        with Client(tmp_path) as c:
            for _ in range(80):
                for _ in range(100):
                    c.request("show proc")
                got += len(c.replies(100, 20))
            # a round's late replies are counted in the next: the last
            # round's, to a deadline (7,992 by the 20 s of the last round
            # at load 28, 3 busy loops beside -n 4)
            got += len(c.replies(8000 - got, 60))
        assert got == 8000, got
        # the loop is free: a request is answered at once (not 1 s per ask)
        worst = 0.0
        for _ in range(20):
            t0 = time.monotonic()
            assert _ask(tmp_path, "status")["result"]["pid"] == m.proc.pid
            worst = max(worst, time.monotonic() - t0)
        assert worst < 0.9, f"status took {worst:.2f}s while a worker does not read"
        # TERM: the Drain is queued for the stopped worker, the loop goes on
        t0 = time.monotonic()
        m.proc.send_signal(signal.SIGTERM)
        os.kill(worker, signal.SIGCONT)      # it reads again: drains and exits
        wait_for(lambda: m.proc.poll() is not None, 60, "the master stopped")
        assert m.proc.returncode == 0, m.text()
        assert "drained" in m.text(), m.text()
        print(f"worst status {worst * 1000:.0f} ms; stop in {time.monotonic() - t0:.1f}s")
    finally:
        try:
            os.kill(worker, signal.SIGCONT)
        except ProcessLookupError:
            pass
