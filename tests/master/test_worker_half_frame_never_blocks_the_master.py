"""Reading a worker's channel never blocks the master's loop (issue 19 §6:
`_on_channel` waited up to 5 s for the rest of a message once a frame had
begun; a worker that sent half a frame and the rest 4.5 s later left
`sockherd ctl status` unanswered for 5.1 s). App code reaches its worker's
socketpair as in test_worker_illegal_message_contained.py."""
from __future__ import annotations

import time

import pytest

from test_control_odd_and_concurrent_requests import Client
from test_run import children, gone, master, wait_for  # noqa: F401 (fixture)
from test_worker_replaced_when_a_loop_thread_ends import get

pytestmark = pytest.mark.timeout(120)

# App code writing raw bytes on its worker's channel from a thread of its
# own: half a frame now, the rest (if any) `later` seconds after. The
# message is a second READY: once complete, the master sees it and replaces
# the worker (test_worker_illegal_message_contained.py), which shows it was
# handled.
HALFAPP = """
import gc, os, threading, time
from sockherd.ipc import messages
from sockherd.ipc.channel import Channel
from sockherd.ipc.frames import HEADER, KIND_MSG, MAGIC, VERSION, encode_frames

def channel_fd():
    return next(o for o in gc.get_objects() if isinstance(o, Channel)).fileno()

def halves(later):
    fd = channel_fd()
    (frame, _), = encode_frames(messages.encode(messages.Ready(pid=os.getpid())), [])
    os.write(fd, frame[:len(frame) // 2])
    open("half-sent", "w").close()              # the test's clock: files, not times
    if later is not None:
        time.sleep(later)
        os.write(fd, frame[len(frame) // 2:])
        open("rest-sent", "w").close()

def app(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/half-then-rest":
        threading.Thread(target=halves, args=(4.5,)).start()
    elif path == "/half-for-ever":
        # a frame announcing 1 MB, 10 bytes of it sent: the worker's own
        # heartbeats after it are taken as more of its payload
        os.write(channel_fd(), HEADER.pack(MAGIC, VERSION, KIND_MSG, 0, 1 << 20) + b"x" * 10)
    elif path == "/too-large":
        os.write(channel_fd(), HEADER.pack(MAGIC, VERSION, KIND_MSG, 0, 1 << 30))
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"%d" % os.getpid()]
"""


def _status_latency(c: Client) -> float:
    start = time.monotonic()
    c.request("status")
    got = c.replies(1, 10)
    assert got and got[0]["ok"], got
    return time.monotonic() - start


def test_ctl_answers_at_once_while_a_worker_sends_half_a_frame(master, tmp_path):
    """Half a frame, the rest 4.5 s later: `status` requests sent after
    the half are answered before the rest is sent (none was: 5.1 s), and
    the message completed then is handled (a second READY: the worker is
    replaced). Which came first is read from the app's marker files, not
    from a latency bound (1.0 s failed at 1.30 s on a loaded box)."""
    (tmp_path / "halfapp.py").write_text(HALFAPP)
    # no heartbeat of the worker's own may come between the two halves
    m = master("halfapp:app", "-w", "2", "--heartbeat-interval", "60",
               "--heartbeat-timeout", "120")
    half, rest = tmp_path / "half-sent", tmp_path / "rest-sent"
    victim = int(get(m.port, "/half-then-rest"))
    wait_for(half.exists, 20, "the half frame sent")
    latencies, before_rest, deadline = [], 0, time.monotonic() + 60
    with Client(tmp_path) as c:
        while not rest.exists():
            assert time.monotonic() < deadline, "the rest of the frame never sent"
            latencies.append(_status_latency(c))
            before_rest += not rest.exists()
    print(f"status during a half frame: {before_rest} answered before the rest, "
          f"of {len(latencies)}; worst {max(latencies) * 1000:.1f} ms")
    assert before_rest >= 1, f"no `status` answered while a worker sent half a frame: " \
                             f"{latencies}"
    m.wait_log(rf"worker \d+\.\d+ \(pid {victim}\) misbehaves: .*ready while ready.*: "
               r"replacing it", timeout=20)
    wait_for(lambda: gone(victim), 30, "the worker that lied replaced")
    assert m.proc.poll() is None and "Traceback" not in m.text(), m.text()


def test_a_worker_that_never_ends_its_frame_is_killed_at_its_heartbeat_timeout(master,
                                                                                tmp_path):
    """A frame begun and never ended: no message of that worker's can come
    any more, heartbeats included; the heartbeat check kills it and its slot
    is respawned, and the master answers throughout."""
    (tmp_path / "halfapp.py").write_text(HALFAPP)
    m = master("halfapp:app", "-w", "2", "--heartbeat-interval", "0.2",
               "--heartbeat-timeout", "2")
    victim = int(get(m.port, "/half-for-ever"))
    with Client(tmp_path) as c:
        assert _status_latency(c) < 1.0
    m.wait_log(r"worker \d+\.\d+: no heartbeat for \d+s: killed", timeout=20)
    wait_for(lambda: gone(victim), 20, "the worker with half a frame killed")
    m.wait_log(r"worker \d+\.\d+: ready", count=3, timeout=30)
    assert victim not in children(m.proc.pid)
    assert m.proc.poll() is None and "Traceback" not in m.text(), m.text()


def test_a_frame_over_the_channels_limit_is_misbehaving(master, tmp_path):
    """A frame announcing more than the channel's max message size is a
    protocol error: nothing of it is buffered, the worker is replaced."""
    (tmp_path / "halfapp.py").write_text(HALFAPP)
    m = master("halfapp:app", "-w", "2")
    victim = int(get(m.port, "/too-large"))
    m.wait_log(rf"worker \d+\.\d+ \(pid {victim}\) misbehaves: its channel broke: frame of "
               rf"1073741824 bytes exceeds cap \d+: replacing it")
    wait_for(lambda: gone(victim), 30, "the worker replaced")
    m.wait_log(r"worker \d+\.\d+: ready", count=3)
    assert m.proc.poll() is None and "Traceback" not in m.text(), m.text()
