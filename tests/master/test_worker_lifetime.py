"""max_worker_lifetime counts from when a worker serves (its READY), as the
setting says ("a worker serving for this long"). A real master; every wait
polls with a deadline."""
from __future__ import annotations

import pytest

from test_reload_upgrade_takeover_races import write_slow_app
from test_run import master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)


def test_a_worker_slower_to_start_than_its_lifetime_is_still_replaced(master, tmp_path):
    """Found by test_max_worker_lifetime_replaces_each_worker failing under
    load: the lifetime timer was armed at spawn; one that fired while the
    worker was still STARTING was refused (not ready) and never armed again,
    so that worker served for ever."""
    write_slow_app(tmp_path, "v1")
    (tmp_path / "slow").write_text("")            # every worker takes 2 s to import
    m = master("verapp:app", "-w", "1", "--max-worker-lifetime", "1", ready=1)
    first = int(m.wait_log(r"worker 1\.0: ready, pid (\d+)")[0])
    m.wait_log(r"worker 1\.0: max_worker_lifetime \(1s\): starting its replacement")
    m.wait_log(rf"worker 1\.0: replaced by pid \d+; draining pid {first}")
    wait_for(lambda: m.proc.poll() is None, 1, "the master alive")
