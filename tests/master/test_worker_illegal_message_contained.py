"""A worker's message illegal for its lifecycle state is contained (issue 19
§1: one duplicate `Ready` frame written by app code on its worker's
socketpair raised IllegalTransition out of `Supervisor._on_message` and the
master exited 1, taking the whole service down). Now the offender is logged
with its message and replaced (a new worker READY first, then it drains);
the master keeps serving."""
from __future__ import annotations

import pytest

from test_run import children, gone, master, wait_for  # noqa: F401 (fixture)
from test_worker_replaced_when_a_loop_thread_ends import get, load

pytestmark = pytest.mark.timeout(120)

# App code that finds its worker's channel (the only ipc Channel object in
# the process) and writes one whole frame on its socket, as a bug or a
# hostile app could: the worker's own code never sends these twice.
LIARAPP = """
import gc, os
from sockherd.ipc import messages
from sockherd.ipc.channel import Channel
from sockherd.ipc.frames import encode_frames

def lie(msg):
    ch = next(o for o in gc.get_objects() if isinstance(o, Channel))
    (frame, _), = encode_frames(messages.encode(msg), [])
    os.write(ch.fileno(), frame)

def app(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/ready":
        lie(messages.Ready(pid=os.getpid()))
    elif path == "/failed":
        lie(messages.FailedBeforeReady(reason="a lie"))
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"%d" % os.getpid()]
"""


@pytest.mark.parametrize("lie,what", [("/ready", "ready while ready"),
                                      ("/failed", "failed while ready")])
def test_a_worker_sending_a_message_illegal_for_its_state_is_replaced(master, tmp_path,
                                                                      lie, what):
    """Issue 19 §1: a duplicate Ready (or FailedBeforeReady after READY)
    from app code; the master logs it, replaces the worker (its successor
    READY first, then it drains) and serves on without a failed request."""
    (tmp_path / "liarapp.py").write_text(LIARAPP)
    m = master("liarapp:app", "-w", "2")
    with load(m.port, 3) as (ok, failed):
        wait_for(lambda: ok[0] > 20, 20, "load running")
        victim = int(get(m.port, lie))
        m.wait_log(rf"worker \d+\.\d+ \(pid {victim}\) misbehaves: .*{what}.*: replacing it")
        m.wait_log(r"worker \d+\.\d+: ready", count=3)
        m.wait_log(rf"draining pid {victim}")
        wait_for(lambda: gone(victim), 20, "the offender drained and reaped")
        before = ok[0]
        wait_for(lambda: ok[0] > before + 50, 20, "served on after the replacement")
        assert m.proc.poll() is None, m.text()
    assert not failed, failed
    assert "Traceback" not in m.text(), m.text()
    assert victim not in children(m.proc.pid) and len(children(m.proc.pid)) == 2
    pids = {int(get(m.port)) for _ in range(20)}
    assert victim not in pids


def test_the_verdict_on_a_misbehaving_worker_by_what_it_is_doing():
    """Replaced when it can be; drained when it serves but cannot be
    replaced now (a reload under way); left alone when it is leaving
    already or its replacement is starting."""
    from types import SimpleNamespace

    from sockherd.master.lifecycle import Event, Worker
    from sockherd.master.misbehaving import DRAIN, LEAVE, REPLACE, verdict
    from sockherd.master.workers import Slot

    def serving_slot() -> Slot:
        slot = Slot(0)
        slot.proc, slot.life = SimpleNamespace(pid=42), Worker(1, 0)
        slot.life.handle(Event.READY)
        return slot

    slot = serving_slot()
    assert verdict(slot, [slot], False, None) == (REPLACE, "")
    assert verdict(slot, [slot], False, object()) == (DRAIN, "a reload is under way")
    assert verdict(slot, [slot], True, None)[0] == LEAVE
    slot.replaced_by = Slot(0)
    assert verdict(slot, [slot], False, None) == (LEAVE, "its replacement is starting")
    slot = serving_slot()
    slot.life.handle(Event.DRAIN)
    assert verdict(slot, [slot], False, None) == (LEAVE, "not ready")


def test_the_ready_an_adopted_draining_worker_owed_is_no_offence(caplog):
    """After an upgrade (and a came-back image's adoption) a worker handed
    over as draining may have been still starting at the exec: its READY
    comes later, while the new image has it DRAINING. That one READY is
    logged as a ready, not as misbehaving (it was: "ready while draining:
    left as it is" on a loaded box); a second one is an offence again."""
    import logging
    from types import SimpleNamespace

    from sockherd.ipc.messages import Ready
    from sockherd.master import channels
    from sockherd.master.lifecycle import Event, State, Worker
    from sockherd.master.workers import Slot

    slot = Slot(0, 2)
    slot.proc, slot.life = SimpleNamespace(pid=42), Worker(2, 0)
    slot.life.handle(Event.READY)               # adopted: READY as it was, then drained
    slot.life.handle(Event.DRAIN)
    slot.ready_owed = True
    sup = SimpleNamespace(slots=[], stopping=False, pending=None,
                          table=SimpleNamespace(on_heartbeat=lambda slot: None),
                          _feed=lambda slot, event: slot.life.handle(event))
    got = SimpleNamespace(msg=Ready(pid=42), close_fds=lambda: None)
    with caplog.at_level(logging.INFO, logger="sockherd.master"):
        channels.contained(sup, slot, got)
    assert "misbehaves" not in caplog.text and slot.offences == 0, caplog.text
    assert "worker 2.0: ready, pid 42 (started before the upgrade's exec)" in caplog.text
    assert slot.life.state is State.DRAINING and not slot.ready_owed
    channels.contained(sup, slot, got)
    assert "misbehaves: Ready(pid=42) (worker 2.0: ready while draining)" in caplog.text
    assert slot.offences == 1


FDSAPP = """
import gc, os, socket
from sockherd.ipc import messages
from sockherd.ipc.channel import Channel
from sockherd.ipc.frames import encode_frames

def app(environ, start_response):
    ch = next(o for o in gc.get_objects() if isinstance(o, Channel))
    sock = socket.socket(fileno=os.dup(ch.fileno()))
    (frame, _), = encode_frames(messages.encode(messages.Heartbeat(seq=1, sent_at=0.0)), [])
    null = os.open("/dev/null", os.O_RDONLY)
    for _ in range(20):                 # 20 x 250 fds, each batch with a legal message
        try:
            sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                    __import__("array").array("i", [null] * 250))])
        except OSError:
            break
    sock.detach()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"%d" % os.getpid()]
"""


def test_fds_a_worker_sends_never_enter_the_masters_table(master, tmp_path):
    """Found while merging issue 19's fd budget: the master read its
    workers' channels with room for 252 fds per read, so app code could fill
    the master's fd table (20 x 250 fds here: 5,000), which the fd budget
    then had to survive. A worker never sends the master an fd: the kernel
    now discards them (no room for them in the read), the offender is
    replaced, and the master's table does not grow."""
    import os

    (tmp_path / "fdsapp.py").write_text(FDSAPP)
    m = master("fdsapp:app", "-w", "2")
    import threading

    def count() -> int:
        try:
            return len(os.listdir(f"/proc/{m.proc.pid}/fd"))
        except OSError:
            return 0

    base = count()
    peak, done = [base], threading.Event()
    sampler = threading.Thread(target=lambda: [peak.append(count()) for _ in iter(
        lambda: done.wait(0.001), True)])
    sampler.start()
    try:
        victim = int(get(m.port, "/"))
        wait_for(lambda: len(peak) > 200, 10, "the master's fds sampled after the send")
    finally:
        done.set()
        sampler.join()
    m.wait_log(rf"worker \d+\.\d+ \(pid {victim}\) misbehaves: .*: replacing it")
    wait_for(lambda: gone(victim), 30, "the offender drained and reaped")
    peak.append(len(os.listdir(f"/proc/{m.proc.pid}/fd")))
    assert max(peak) < base + 20, (base, peak)
    assert m.proc.poll() is None, m.text()
