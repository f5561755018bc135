"""A stop during a reload's probation is reported as what it is
(adversarial review of issue 19). TERM while generation 2 was on
probation answered the waiting `ctl reload` (and logged) "reload refused
(generation 2): the master is stopping; generation 2 keeps serving": no
generation keeps serving, every worker drains and the master exits. Now
the answer says the master is stopping, and nothing about serving on."""
from __future__ import annotations

import signal

import pytest

from test_control_odd_and_concurrent_requests import Client
from test_run import master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)


def test_term_during_probation_answers_the_reload_truthfully(master, tmp_path):
    m = master("-w", "1", "--reload-probation", "60", ready=1)
    with Client(tmp_path) as c:
        c.request("reload", {"probation": True})      # the answer after the probation
        m.wait_log(r"generation 2 ready in [\d.]+s; on probation for 60s", timeout=60)
        m.proc.send_signal(signal.SIGTERM)
        got = c.replies(1, 30)
    assert got and not got[0]["ok"], got
    error = got[0]["error"]
    assert "the master is stopping" in error, error
    assert "keeps serving" not in error and "serves again" not in error, error
    wait_for(lambda: m.proc.poll() is not None, 60, "the master stopped")
    assert m.proc.returncode == 0, m.text()
    assert "keeps serving" not in m.text(), m.text()
