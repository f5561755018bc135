"""Two masters of one user on one host: each has its control endpoint, or
the second refuses to start saying how to get one (a real master each)."""
from __future__ import annotations

import json

import pytest

from test_control import ctl
from test_run import children, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(60)


def test_a_second_master_on_the_same_runtime_dir_refuses_to_start(master, tmp_path):
    """Defect: a second master with default settings logged a warning and
    waited for the first one's control endpoint, serving meanwhile without
    one, and `sockherd ctl` silently talked to the first."""
    first = master("-w", "1", ready=1)
    second = master("-w", "1", ready=None)
    assert second.proc.wait(timeout=30) == 1, second.text()
    said = second.text()
    assert "served by another running master" in said and "--runtime-dir" in said \
        and "--control" in said, said
    assert "listening on" not in said          # refused before binding anything
    assert not children(second.proc.pid)
    done = ctl(tmp_path, "--json", "status")
    assert done.returncode == 0 and json.loads(done.stdout)["pid"] == first.proc.pid


def test_a_second_master_with_its_own_runtime_dir_serves_its_own_ctl(master, tmp_path):
    """The way out the refusal names: --runtime-dir gives each its own."""
    first = master("-w", "1", ready=1)
    other = tmp_path / "run2"
    second = master("-w", "1", "--runtime-dir", str(other), ready=1)
    done = ctl(tmp_path, "--json", "status", extra=("--runtime-dir", str(other)))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["pid"] == second.proc.pid != first.proc.pid
