"""A reload whose workers cannot be sent their assignment is refused, and
nothing a signal or a timer handles ends the master's loop (adversarial
review of issue 19). A settings file with a string setting of 17 MB (the
assignment a worker is sent carries the settings: over the channel's
16 MiB frame cap) made `spawn` raise ValueError, which only OSError and
IPCError were caught for: on a HUP it escaped the loop and the master
exited with a traceback, every worker with it ("the master is gone");
from `ctl reload` the command's boundary caught it, but the reload was
left half-started and every later one was refused ("generation 2 is
still starting"). Signals and timers had no boundary of their own.
Now such a worker "cannot start" like one whose fork fails, the reload is
refused with why, and the loop contains what a signal or a timer raises."""
from __future__ import annotations

import pytest

from test_control_odd_and_concurrent_requests import _ask
from test_run import children, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

HUGE = 17 * 1024 * 1024


def test_a_reload_too_large_to_send_is_refused_and_the_master_serves_on(master, tmp_path):
    conf = tmp_path / "conf.toml"
    conf.write_text("workers = 2\n")
    m = master("-c", str(conf), "--reload-probation", "0")
    workers = sorted(children(m.proc.pid))
    conf.write_text(f'workers = 2\nroot_path = "/{"r" * HUGE}"\n')
    m.proc.send_signal(1)                                 # SIGHUP
    m.wait_log(r"reload refused \(generation 2\): worker 2\.0 cannot start: message of "
               r"\d+ bytes exceeds cap \d+", timeout=60)
    assert m.proc.poll() is None, m.text()
    assert sorted(children(m.proc.pid)) == workers
    got = _ask(tmp_path, "reload", timeout=60)
    assert got is not None and not got["ok"], got
    assert "reload refused (generation 3): worker 3.0 cannot start: message of" \
        in got["error"], got
    # the settings fixed: the next reload goes through
    conf.write_text("workers = 2\n")
    got = _ask(tmp_path, "reload", timeout=60)
    assert got is not None and got["ok"] and got["result"]["generation"] == 4, got
    wait_for(lambda: not set(workers) & set(children(m.proc.pid)), 30,
             "the first generation drained")
    assert m.proc.poll() is None
    assert "Traceback" not in m.text(), m.text()
