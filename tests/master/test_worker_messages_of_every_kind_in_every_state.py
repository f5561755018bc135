"""Every message kind, from a real worker process, in the lifecycle states
a worker can send from (issue 19 §1, the fuzz of "What to build"): at
import (STARTING), from a request (READY), each kind twice, and from a
request in flight across a graceful stop (DRAINING); a killed one
(STOPPING) cannot send. The master
keeps supervising: it serves throughout, a worker whose message was
illegal for its state is replaced, and it ends with its two workers
serving and `ctl status` answering."""
from __future__ import annotations

import signal
import threading

import pytest

from sockherd.ipc import messages
from test_control import ok_json
from test_run import children, master, wait_for  # noqa: F401 (fixture)
from test_worker_replaced_when_a_loop_thread_ends import get, load

pytestmark = pytest.mark.timeout(180)

KINDS = ["Assignment", "Ready", "FailedBeforeReady", "Heartbeat", "Retiring", "Drain", "Standby",
         "Stop",
         "StatsRequest", "StatsReply", "Error", "HandoffRequest", "HandoffListeners",
         "HandoffConfirm"]

# App code writing whole frames on its worker's channel (found through gc,
# as the duplicate-Ready test does). At import it is STARTING: every kind
# but the two that legitimately end STARTING (their own tests cover them).
FUZZAPP = """
import gc, os, time
from sockherd.ipc import messages as m
from sockherd.ipc.channel import Channel
from sockherd.ipc.frames import encode_frames

def sample(kind):
    pid, now = os.getpid(), time.monotonic()
    return {
        "Assignment": lambda: m.Assignment(generation=1, worker_index=0, config={}, app="x"),
        "Ready": lambda: m.Ready(pid=pid),
        "FailedBeforeReady": lambda: m.FailedBeforeReady(reason="a lie"),
        "Heartbeat": lambda: m.Heartbeat(seq=1, sent_at=now),
        "Retiring": lambda: m.Retiring(requests=1),
        "Drain": lambda: m.Drain(deadline=now),
        "Standby": lambda: m.Standby(on=True),
        "Stop": lambda: m.Stop(),
        "StatsRequest": lambda: m.StatsRequest(request_id=7),
        "StatsReply": lambda: m.StatsReply(request_id=123456, stats={"x": 1}),
        "Error": lambda: m.Error(message="a lie"),
        "HandoffRequest": lambda: m.HandoffRequest(pid=pid),
        "HandoffListeners": lambda: m.HandoffListeners(listeners=[]),
        "HandoffConfirm": lambda: m.HandoffConfirm(names=["x"]),
    }[kind]()

def lie(kind):
    ch = next(o for o in gc.get_objects() if isinstance(o, Channel))
    (frame, _), = encode_frames(m.encode(sample(kind)), [])
    os.write(ch.fileno(), frame)

for kind in %r:
    if kind not in ("Ready", "FailedBeforeReady"):
        lie(kind)
        lie(kind)

def app(environ, start_response):
    kind = environ["PATH_INFO"].lstrip("/")
    if kind == "slow":                  # in flight across a drain: every kind while DRAINING
        open("inflight", "w").close()
        time.sleep(1.0)
        for kind in %r:
            lie(kind)
    elif kind:
        lie(kind)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"%%d" %% os.getpid()]
""" % (KINDS, KINDS)


def test_the_sample_covers_every_message_kind():
    assert sorted(KINDS) == sorted(t.__name__ for t in messages.MESSAGE_TYPES)


def test_every_message_kind_in_every_state_leaves_the_master_supervising(master, tmp_path):
    (tmp_path / "fuzzapp.py").write_text(FUZZAPP)
    m = master("fuzzapp:app", "-w", "2")          # READY after every kind while STARTING
    with load(m.port, 2) as (ok, failed):
        wait_for(lambda: ok[0] > 10, 20, "load running")
        for kind in KINDS:
            for _ in range(2):
                get(m.port, "/" + kind)
                assert m.proc.poll() is None, m.text()
                before = ok[0]
                wait_for(lambda: ok[0] > before + 3, 20, f"served on after {kind}")
        wait_for(lambda: len(children(m.proc.pid)) == 2
                 and ok_json(tmp_path, "status")["roles"] == {"serving": 2}, 60,
                 lambda: f"two serving workers again\n{m.text()}")
    assert m.proc.poll() is None, m.text()
    assert not failed, failed
    assert "Traceback" not in m.text(), m.text()
    assert m.wait_log(r"misbehaves: Ready\(")
    assert m.wait_log(r"misbehaves: FailedBeforeReady\(")


def test_every_message_kind_while_draining_leaves_the_stop_clean(master, tmp_path):
    """A request in flight across a graceful stop (TERM) sends every kind
    while its worker is DRAINING: the request is answered, the illegal
    ones are logged and left (the worker is leaving), and the master ends
    with status 0 once both workers are gone."""
    (tmp_path / "fuzzapp.py").write_text(FUZZAPP)
    m = master("fuzzapp:app", "-w", "2")
    answered = []
    slow = threading.Thread(target=lambda: answered.append(get(m.port, "/slow")))
    slow.start()
    try:
        wait_for(lambda: (tmp_path / "inflight").exists(), 20, "the slow request in flight")
        m.proc.send_signal(signal.SIGTERM)
    finally:
        slow.join(30)
    assert answered, m.text()
    assert m.proc.wait(timeout=60) == 0, m.text()
    m.wait_log(r"misbehaves: Ready\(.*ready while draining.*: left as it is")
    m.wait_log(r"misbehaves: FailedBeforeReady\(.*failed while draining.*: left as it is")
    assert "Traceback" not in m.text(), m.text()
