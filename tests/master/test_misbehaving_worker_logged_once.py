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
from test_worker_replaced_when_a_loop_thread_ends import get

pytestmark = pytest.mark.timeout(120)

# App code writing READY frames on its worker's channel for `seconds`, as
# fast as the socket takes them, from a thread of its own; the worker's own
# channel code is silenced first (it neither sends nor reads: the drain it
# is told goes unheard, and its hard stop ends it).
LIARAPP = """
import gc, os, select, threading, time
from sockherd.ipc import messages
from sockherd.ipc.channel import Channel
from sockherd.ipc.frames import encode_frames

def flood(seconds):
    ch = next(o for o in gc.get_objects() if isinstance(o, Channel))
    ch.send = lambda *a, **k: None
    ch.read_available = lambda: 0
    ch.next_message = lambda: None
    fd = ch.fileno()
    (frame, _), = encode_frames(messages.encode(messages.Ready(pid=os.getpid())), [])
    blob = frame * 4096
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        view = memoryview(blob)
        while view:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                select.select([], [fd], [], 1)

def app(environ, start_response):
    if environ["PATH_INFO"] == "/flood":
        threading.Thread(target=flood, args=(3,), daemon=True).start()
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
