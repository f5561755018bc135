"""A HUP the master refuses before any generation starts (the first one
not ready yet, another reload still starting, a stop under way) is said on
the event stream (`sockherd ctl watch`), not only in the log. A real
master; every wait polls with a deadline."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from test_control import _read_until
from test_run import master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)


def watcher(tmp_path: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "sockherd.master", "ctl", "--runtime-dir",
                             str(tmp_path / "run"), "--json", "watch"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert b"watching" in proc.stderr.readline()
    proc.pending = b""
    return proc


def test_a_hup_refused_before_the_first_generation_is_ready_is_an_event(master, tmp_path):
    """Issue 18 §5: a refused HUP emitted no event on `ctl watch` (the
    refusal was only logged: a watcher, or a deploy script waiting on the
    stream, never learnt the reload did not happen)."""
    m = master("hangapp:app", "-w", "1", "--ready-timeout", "100", ready=None)
    m.wait_log(r"worker 1\.0: spawned")
    watch = watcher(tmp_path)
    seen: list[dict] = []
    try:
        # a subscription takes effect a moment after the connect (ZeroMQ's
        # slow joiner): HUP again until the watcher saw a refusal
        def refused_and_seen():
            m.proc.send_signal(signal.SIGHUP)
            seen.extend(_read_until(watch, "reload_refused", None, within=1.0))
            return [e for e in seen if e["event"] == "reload_refused"]
        got = wait_for(refused_and_seen, 30, lambda: f"a reload_refused event; saw {seen}")
    finally:
        watch.kill()
        watch.communicate(timeout=10)
    assert got[0]["reason"] == "the first generation is not ready yet", got
    assert "reload refused: the first generation is not ready yet" in m.text()
    assert not [e for e in seen if e["event"] in ("reloading", "reload_failed")], seen
