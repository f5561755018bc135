"""A worker flooding its channel with small valid messages never starves
the master's loop (adversarial review of issue 19, after §6's fix). The
master read up to 64 x 256 KiB of a worker's channel per wake-up and then
handled every message in it: a worker writing heartbeat frames as fast as
its socketpair took them (app code can) made one wake-up decode and handle
half a million messages, and `sockherd ctl status` went unanswered for
1.4, 2.1 and 3.2 s on a live master. Now one wake-up reads a bounded
amount of a worker's channel (the selector reports the rest again, after
the other fds had their turn)."""
from __future__ import annotations

import time

import pytest

from test_control_odd_and_concurrent_requests import Client
from test_run import master, wait_for  # noqa: F401 (fixture)
from test_worker_replaced_when_a_loop_thread_ends import get

pytestmark = pytest.mark.timeout(120)

# App code writing one message's frame on its worker's channel, over and
# over for `seconds` (or until `frames` are sent), as fast as the socket
# takes it, from a thread of its
# own; the worker's own sends are silenced first (one of its heartbeats
# must not land inside the flood's bytes), and with deaf=True its reads too
# (a drain it is told goes unheard: its hard stop ends it).
FLOOD = """
import gc, os, select, threading, time
from sockherd.ipc import messages
from sockherd.ipc.channel import Channel
from sockherd.ipc.frames import encode_frames

def flood(msg, seconds, deaf=False, frames=0):
    ch = next(o for o in gc.get_objects() if isinstance(o, Channel))
    ch.send = lambda *a, **k: None
    if deaf:
        ch.read_available = lambda: 0
        ch.next_message = lambda: None
    fd = ch.fileno()
    (frame, _), = encode_frames(messages.encode(msg), [])
    blob = frame * 4096
    end, sent = time.monotonic() + seconds, 0
    while time.monotonic() < end and not (frames and sent >= frames):
        view = memoryview(blob)
        while view:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                select.select([], [fd], [], 1)
        sent += 4096
    return sent
"""

# the flood of heartbeats (valid frames); its frame count is in flood.txt
# once it is over
FLOODAPP = FLOOD + """
def beats(seconds, frames, out):
    sent = flood(messages.Heartbeat(seq=1, sent_at=0.0), seconds, frames=frames)
    with open(out, "w") as f:
        f.write(str(sent))

def app(environ, start_response):
    if environ["PATH_INFO"] == "/flood":
        seconds, frames, out = environ["QUERY_STRING"].split("&", 2)
        threading.Thread(target=beats, args=(float(seconds), int(frames), out),
                         daemon=True).start()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"%d" % os.getpid()]
"""


FRAMES = 120_000


def test_ctl_answers_while_a_worker_floods_its_channel_with_messages(master, tmp_path):
    """120,000 heartbeat frames as fast as the worker can write them (about
    4 s on a quiet box; a count, not a time: a loaded CI host wrote 69,632
    in 4 s, below the flood the test is about): `status` meanwhile is
    answered within a second (it took up to 3.2 s), the flood is read
    (the worker is not misbehaving: the frames are valid) and the master
    lives on. "Within a second" is asked of 99% of the requests (each of
    them when there are fewer than 100, as the starved master answers): a
    loaded box (load 18 on 2 cores, xdist beside) answered 1 of 1,888 in
    1.2 s, the CPU's wait and not the flood's, the rest at a median of
    0.1 ms."""
    (tmp_path / "floodapp.py").write_text(FLOODAPP)
    m = master("floodapp:app", "-w", "2")
    out = tmp_path / "flood.txt"
    victim = int(get(m.port, f"/flood?60&{FRAMES}&{out}"))
    latencies, deadline = [], time.monotonic() + 90
    with Client(tmp_path) as c:
        while not out.exists():                     # the flood under way
            assert time.monotonic() < deadline, "the flood never ended"
            t = time.monotonic()
            c.request("status")
            got = c.replies(1, 20)
            assert got and got[0]["ok"], got
            latencies.append(time.monotonic() - t)
    sent = int(out.read_text())
    ranked = sorted(latencies)
    worst, median = ranked[-1], ranked[len(ranked) // 2]
    p99 = ranked[len(ranked) * 99 // 100]              # the worst below 100 requests
    print(f"{sent} heartbeat frames; {len(latencies)} status requests meanwhile, "
          f"median {median * 1000:.1f} ms, 99% {p99 * 1000:.0f} ms, worst {worst * 1000:.0f} ms")
    assert sent >= FRAMES, f"only {sent} frames in 60 s: no flood to speak of"
    assert p99 < 1.0, (f"`status` took {p99:.2f}s (99% of {len(ranked)}; worst {worst:.2f}s) "
                       f"while worker pid {victim} flooded")
    assert m.proc.poll() is None
    assert "misbehaves" not in m.text() and "Traceback" not in m.text(), m.text()
