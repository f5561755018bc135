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

from test_control_odd_and_concurrent_requests import Client, _ask
from test_run import children, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)


def test_a_worker_that_does_not_read_never_stalls_the_master(master, tmp_path):
    m = master("-w", "1", "--heartbeat-interval", "30", "--heartbeat-timeout", "100", ready=1)
    worker, = children(m.proc.pid)
    os.kill(worker, signal.SIGSTOP)
    try:
        # enough `show proc` requests to fill the worker's channel many times over.
        # Each round's replies are all read before the next round is sent,
        # and a round is 50: libzmq's ROUTER drops replies to a client it
        # counts past the high-water mark of 128, and it learns what the
        # client read only in batches, so 100 outstanding already lost 8
        # under load (192 of 200 after 60 s, -n 3 beside busy loops; moving
        # on after 20 s a round lost 5 of 8,000 in CI). A master that waited
        # 1 s per ask would take 50 s a round: past the 30 s deadline.
        got = sent = 0
        with Client(tmp_path) as c:
            for _ in range(160):
                for _ in range(50):
                    c.request("show proc")
                sent += 50
                got += len(c.replies(sent - got, 30))
                assert got == sent, (got, sent)
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
