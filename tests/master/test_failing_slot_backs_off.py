"""A worker slot that keeps failing, on a real master (issue 19 §7): it is
retried with a capped back-off for as long as the master lives, never given
up on; the master stays up, unready (`/-/ready` 503) while no worker
serves, the slot's failures in `ctl status` and the metrics, and serves
again once a respawn works. It exits only when told to stop. Before: "gave
up after 5 failures in a row", then "every worker slot was given up on:
exiting", and the listeners closed with it."""
from __future__ import annotations

import os
import signal

import pytest

from test_control import ctl, ok_json
from test_metrics import ready, scrape, value
from test_reload import free_port
from test_run import children, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(150)

# serves until the file `broken` exists next to it; from then each new
# worker dies 0.3 s after its import (READY or not yet: a failure either way)
FLAKY = """
import os, threading
if os.path.exists(os.path.join(os.path.dirname(__file__), "broken")):
    threading.Timer(0.3, os._exit, (3,)).start()
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]
"""


def test_a_failing_slot_backs_off_and_the_master_stays(master, tmp_path):
    (tmp_path / "flaky.py").write_text(FLAKY)
    mport = free_port()
    m = master("flaky:app", "-w", "1", "--metrics", f"127.0.0.1:{mport}", ready=1)
    wait_for(lambda: ready(mport)[0] == 200, 10, "/-/ready to answer 200")
    (tmp_path / "broken").write_text("")
    os.kill(children(m.proc.pid)[0], signal.SIGKILL)
    # 0.5, 1, 2, 4 s, then 8 s: past the 5 failures that used to end it
    m.wait_log(r"worker slot 0: respawn in 8\.0s \(5 failures in a row\)", timeout=90)
    assert m.proc.poll() is None
    assert "gave up" not in m.text() and "exiting" not in m.text()
    st = ok_json(tmp_path, "status")
    assert st["ready"] is False
    assert [(b["slot"], b["failures"]) for b in st["backing_off"]] == [(0, 5)], st
    assert 0 < st["backing_off"][0]["next_try_in"] <= 8
    table = ctl(tmp_path, "status").stdout
    assert "worker slot 0: backing off, 5 failures in a row, next try in" in table, table
    assert "not ready: /-/ready answers 503" in table, table
    assert ready(mport)[0] == 503
    fams = scrape(mport)
    assert value(fams, "sockherd_worker_slots_backing_off") == 1
    assert value(fams, "sockherd_worker_slot_failures", slot="0") == 5
    # the fault passes: the next try serves, and the slot is no longer listed
    (tmp_path / "broken").unlink()
    wait_for(lambda: ready(mport)[0] == 200, 30, "ready again")
    assert ok_json(tmp_path, "status")["backing_off"] == []
    # only a stop ends the master
    m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(timeout=30) == 0
