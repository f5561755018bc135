"""`ctl scale` during a reload's probation says it was refused
(adversarial review of issue 19). TTIN and TTOU are ignored while a
generation is on probation (the kept generation and the new one are
counted apart), but the scale command checked only for a reload still
starting: `ctl scale 3` answered ok, "scale: 2 -> 2 workers", exit 0, and
nothing changed. Now it is refused with why, as during a reload."""
from __future__ import annotations

import pytest

from test_control_odd_and_concurrent_requests import Client, _ask
from test_run import children, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)


def test_scale_during_probation_is_refused_with_why(master, tmp_path):
    m = master("-w", "2", "--reload-probation", "60")
    with Client(tmp_path) as c:
        c.request("reload")                  # answered once probation is over: not waited for
        m.wait_log(r"generation 2 ready in [\d.]+s; on probation for 60s", timeout=60)
        got = _ask(tmp_path, "scale", {"workers": 3})
    assert got is not None and not got["ok"], got
    assert "generation 2 is on probation" in got["error"], got
    assert len(children(m.proc.pid)) == 4            # both generations, unchanged
    assert m.proc.poll() is None
