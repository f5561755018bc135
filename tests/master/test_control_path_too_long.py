"""A runtime directory too deep for a unix socket path: the master refuses
to start saying so. Defect: connect() to a path longer than sun_path fails
with no errno, the liveness probe took that for a live master, and the
refusal said the endpoint "is served by another running master"."""
from __future__ import annotations

import pytest

from test_run import children, master  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(60)


def test_a_control_path_longer_than_sun_path_is_refused_by_its_length(master, tmp_path):
    deep = tmp_path / ("d" * 100)
    m = master("-w", "1", "--runtime-dir", str(deep), ready=None)
    assert m.proc.wait(timeout=30) == 1, m.text()
    said = m.text()
    assert "a unix socket path holds at most 107" in said and "--runtime-dir" in said, said
    assert "another running master" not in said, said
    assert "listening on" not in said          # refused before binding anything
    assert not children(m.proc.pid)


def test_a_control_path_of_107_bytes_is_served(master, tmp_path):
    """The bound is sun_path's own: a path that fits is bound."""
    base = str(tmp_path / "r")
    room = 107 - len(base) - len("/control")
    deep = base + "x" * room
    assert len((deep + "/control").encode()) == 107
    m = master("-w", "1", "--runtime-dir", deep, ready=1)
    m.wait_log(r"control: ipc://")
