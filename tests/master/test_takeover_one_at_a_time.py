"""Issue 19, finding 9: two takeovers at once both succeeded. Two `run
--takeover` instances against one hand-off socket both got the listeners,
both went READY and both told the old master to drain: two live masters,
four workers on one port, and a later reload or stop reached only one.

Now the hand-off server serves one takeover: a second request while the
first holds the listeners (under way) or after it confirmed (done, its
taker alive) is refused with a clear message, and that instance exits
non-zero. The workers start slowly here (2 s), so both new instances ask
the old master while the first is still starting. Every wait polls with a
deadline."""
from __future__ import annotations

import os
import shutil
import socket
import tempfile

import pytest

from test_run import children, gone, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

SLOW_START = """
import time
time.sleep(2)                    # the worker's READY comes late: a takeover stays under way
class Echo:
    def on_data(self, conn, data):
        conn.write(data)
"""


@pytest.fixture
def short_dir():
    # AF_UNIX paths are limited to 108 bytes; pytest's tmp_path can be longer
    path = tempfile.mkdtemp(prefix="sh-")
    yield path
    shutil.rmtree(path)


def _echo(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(b"ping")
        return c.recv(16)


def test_two_takeovers_at_once_one_wins_the_other_is_refused(master, tmp_path, short_dir):
    (tmp_path / "slowapp2.py").write_text(SLOW_START)
    handoff = os.path.join(short_dir, "handoff")
    args = ("slowapp2:Echo", "--interface", "stream", "-w", "1", "--handoff-socket", handoff)
    old = master(*args, ready=1)
    old.wait_log(r"hand-off socket .*: a new instance may take the listeners over")
    a = master(*args, "--takeover", handoff, ready=None)
    b = master(*args, "--takeover", handoff, ready=None)

    def settled():
        done = [x for x in (a, b) if x.proc.poll() is not None]
        serving = [x for x in (a, b) if "takeover: serving" in x.text()]
        return len(done) >= 1 and len(serving) >= 1 and (done, serving)

    done, serving = wait_for(settled, 60, lambda: a.text()[-1500:] + b.text()[-1500:])
    assert len(done) == 1 and len(serving) == 1 and done != serving, \
        (a.text()[-1500:], b.text()[-1500:])
    loser, winner = done[0], serving[0]
    assert loser.proc.returncode != 0
    text = loser.text()
    assert "takeover: hand-off from" in text and "refused" in text, text[-2000:]
    assert ("is under way; one at a time" in text
            or f"handed over to pid {winner.proc.pid} already" in text), text[-2000:]
    # the old master drains and exits; the winner alone serves the port
    assert old.proc.wait(timeout=30) == 0
    assert winner.proc.poll() is None
    port = int(winner.wait_log(r"listening on 127\.0\.0\.1:(\d+)")[0])
    assert port == old.port
    assert _echo(port) == b"ping"
    assert gone(loser.proc.pid) and children(loser.proc.pid) == []
    assert len(children(winner.proc.pid)) == 1
