"""A misbehaving worker's offences do not flood the master's log
(adversarial review of issue 19, after §1's fix). Every illegal message
was one ERROR line: a worker writing second READYs as fast as its
socketpair took them made the master write 14,534 lines (2.4 MB) in about
a second, and for as long as the offender lives (it drains, or ignores the
drain until its hard stop) that goes on, at the cost of the loop's time
too. Now the first offence is logged with the message and what is done
about it, the rest are counted: one line with the count at most a minute."""
from __future__ import annotations

import re

import pytest

from test_run import gone, master, wait_for  # noqa: F401 (fixture)
from test_worker_message_flood_never_starves_the_master import FLOOD
from test_worker_replaced_when_a_loop_thread_ends import get

pytestmark = pytest.mark.timeout(120)

# READY frames for 3 s from a worker deaf to its channel (test_worker_
# message_flood_never_starves_the_master.FLOOD)
LIARAPP = FLOOD + """
def app(environ, start_response):
    if environ["PATH_INFO"] == "/flood":
        threading.Thread(target=flood, args=(messages.Ready(pid=os.getpid()), 3, True),
                         daemon=True).start()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"%d" % os.getpid()]
"""


def test_a_worker_flooding_illegal_messages_is_logged_once(master, tmp_path):
    (tmp_path / "liarapp.py").write_text(LIARAPP)
    m = master("liarapp:app", "-w", "2", "--hard-stop-after", "4")
    victim = int(get(m.port, "/flood"))
    m.wait_log(rf"worker \d+\.\d+ \(pid {victim}\) misbehaves: Ready\(pid={victim}\) "
               r"\(.*ready while ready\): replacing it")
    wait_for(lambda: gone(victim), 60, "the offender killed at its hard stop and reaped")
    lines = re.findall(rf"\(pid {victim}\) misbehaves", m.text())
    print(f"{len(lines)} 'misbehaves' lines for pid {victim}; log {len(m.text())} bytes")
    assert len(lines) <= 3, f"{len(lines)} lines about one misbehaving worker"
    assert len(m.text()) < 100_000
    assert m.proc.poll() is None and "Traceback" not in m.text()
