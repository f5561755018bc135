"""A stopped (SIGSTOP) or wedged worker is killed and replaced within the
heartbeat timeout (issue 19 §10: with the default heartbeat_interval of
25 s, and a timeout of 75 s, such a worker held its connections for over a
minute). The defaults are now 5 s / 15 s: three heartbeats missed in a row,
as HAProxy's `fall 3`."""
from __future__ import annotations

import os
import signal
import time

import pytest

from test_run import children, echo, gone, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)


def _stop_one_and_time_its_end(m, within: float) -> float:
    """SIGSTOPs one worker; seconds until it is gone (killed and reaped),
    polled up to `within`; then its slot serves again."""
    stopped = children(m.proc.pid)[0]
    os.kill(stopped, signal.SIGSTOP)
    start = time.monotonic()
    try:
        wait_for(lambda: gone(stopped), within, "the stopped worker killed")
    finally:
        if not gone(stopped):
            os.kill(stopped, signal.SIGKILL)
    took = time.monotonic() - start
    m.wait_log(r"worker 1\.\d: no heartbeat for \d+s: killed")
    m.wait_log(rf"exited with signal SIGKILL \(killed\), pid {stopped}")
    m.wait_log(r"worker \d+\.\d+: ready", count=3, timeout=30)
    kids = children(m.proc.pid)
    assert stopped not in kids and len(kids) == 2
    assert echo(m, b"alive") == b"alive"
    return took


def test_a_stopped_worker_is_replaced_within_the_default_heartbeat_timeout(master):
    """Defaults: the stopped worker is gone within 15 s (plus the check's
    slack and a loaded machine's margin), never the 75 s it was."""
    from sockherd.master.settings import BY_KEY

    m = master("echoapp:Echo", "--interface", "stream", "-w", "2")
    took = _stop_one_and_time_its_end(m, 15.0 + 5.0)
    print(f"stopped worker gone after {took:.1f}s (default heartbeat settings)")
    assert (BY_KEY["heartbeat_interval"].default, BY_KEY["heartbeat_timeout"].default) \
        == (5.0, 15.0)


def test_a_stopped_worker_is_detected_within_a_short_heartbeat_timeout(master):
    """Short settings: killed within the timeout of 2 s (plus a second of
    margin for a loaded machine), its slot respawned."""
    m = master("echoapp:Echo", "--interface", "stream", "-w", "2",
               "--heartbeat-interval", "0.5", "--heartbeat-timeout", "2")
    took = _stop_one_and_time_its_end(m, 2.0 + 1.0)
    print(f"stopped worker gone after {took:.1f}s (timeout 2 s)")
