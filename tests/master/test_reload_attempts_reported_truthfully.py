"""What a reload attempt is called, on a real master (issue 19 §10): each
attempt gets its own generation number, a refused one too (before: the
number of a refused reload was given again to the next attempt, so logs,
events and metrics conflated them); a new worker that was READY and is
killed while the rest of its generation starts is reported as such, not as
"exited before ready"."""
from __future__ import annotations

import os
import re
import signal

import pytest

from test_control import ctl, ok_json
from test_reload import answers, write_app
from test_run import master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)


def test_refused_attempts_keep_their_numbers(master, tmp_path):
    write_app(tmp_path, "v1")
    config = tmp_path / "sockherd.toml"
    config.write_text("threads = 1\n")
    m = master("verapp:app", "-w", "1", "-c", str(config), ready=1)
    config.write_text("threads = 'many'\n")
    for gen in (2, 3):
        done = ctl(tmp_path, "reload")
        assert done.returncode == 1 and f"reload refused (generation {gen}): bad setting" \
            in done.stderr, done.stderr
    config.write_text("threads = 1\n")
    write_app(tmp_path, "v4")
    assert ok_json(tmp_path, "reload")["generation"] == 4
    m.wait_log(r"reload: generation 4 serving")
    st = ok_json(tmp_path, "status")
    assert st["generation"] == 4 and st["reloads_failed"] == 2 and st["reloads_ok"] == 1
    assert len(re.findall(r"reload refused \(generation 2\)", m.text())) == 1
    answers(m.port, "v4")


# the first worker to import it goes on; the second waits (for the test's go)
ONE_SLOW = """
import time
try:
    os.close(os.open(os.path.join(os.path.dirname(__file__), "first"),
                     os.O_CREAT | os.O_EXCL | os.O_WRONLY))
except FileExistsError:
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(os.path.dirname(__file__), "go")) \\
            and time.monotonic() < deadline:
        time.sleep(0.05)
"""


def test_a_ready_worker_killed_before_the_commit_is_not_called_unready(master, tmp_path):
    write_app(tmp_path, "v1")
    m = master("verapp:app", "-w", "2")
    write_app(tmp_path, "v2", ONE_SLOW)
    m.proc.send_signal(signal.SIGHUP)
    worker, pid = m.wait_log(r"worker (2\.\d): ready, pid (\d+)")[0]
    os.kill(int(pid), signal.SIGKILL)
    m.wait_log(rf"reload refused \(generation 2\): worker {re.escape(worker)} exited with "
               rf"signal SIGKILL after it was ready, before the commit; generation 1 keeps "
               rf"serving")
    assert "before ready" not in m.text()
    (tmp_path / "go").write_text("")
    answers(m.port, "v1")
