"""A worker's channel as the master's loop sees it (supervisor.py).

A worker's messages (READY, failed before READY, heartbeats, max_requests
retirements, reports it was asked for) are read without waiting and
dispatched in `on_message`, inside a boundary (`contained`) no message can
end the loop through: one illegal for the worker's state marks it
misbehaving, and it is replaced (misbehaving.py decides, `misbehaved`
logs and carries it out).

Functions of the supervisor (sup), as upgrade.py's are: they feed its
process table and its generations and keep its first-start state
(first_failure, ever_ready, announced, on_serving).
"""
from __future__ import annotations

import logging
import time

from sockherd.ipc.errors import IPCError, PeerClosed
from sockherd.ipc.messages import FailedBeforeReady, Heartbeat, Ready, Retiring, StatsReply
from sockherd.master import misbehaving
from sockherd.master.lifecycle import Event, IllegalTransition, State
from sockherd.master.workers import Slot, name, ready

log = logging.getLogger("sockherd.master")


def on_channel(sup, slot: Slot) -> None:
    """Every complete message the worker's channel holds now, never
    waiting for more: a frame begun and not complete stays in the
    channel's decoder (at most its max frame) and is completed by a
    later wake-up (issue 19 §6: a wait here of up to 5 s for the rest of
    a frame froze the loop: `ctl status` went unanswered for 5.1 s). One
    read can bring several messages (replies to concurrent control
    requests, a READY and a heartbeat), and select() cannot see those
    left in the inbox (review: they waited for the worker's next
    heartbeat), so all are handled here. A worker that begins a frame
    and never ends it sends no heartbeat either: the heartbeat check
    kills it."""
    ch = slot.proc.channel
    try:
        ch.read_available()
    except PeerClosed:
        sup.table.forget_channel(slot)
        return                                  # the exit itself comes as SIGCHLD
    except IPCError as exc:
        sup.table.forget_channel(slot)          # the stream is lost: nothing more from it
        if not ch.eof:                          # at EOF: its exit comes as SIGCHLD
            misbehaved(sup, slot, f"its channel broke: {exc}")
        return
    while True:
        try:
            got = ch.next_message()             # None once the inbox is empty
        except IPCError as exc:                 # a malformed one (dropped): the next
            log.error("worker %s: %s", name(slot), exc)
            continue
        if got is None:
            return
        contained(sup, slot, got)
        if slot.proc is None or slot.proc.channel is not ch or ch.fileno() < 0:
            return


def contained(sup, slot: Slot, got) -> None:
    """One message inside the boundary: whatever a worker sends, or
    whatever bug of ours its handling meets, is logged and the loop
    carries on (issue 19 §1: an IllegalTransition escaping from here
    ended the master, and PDEATHSIG every worker with it)."""
    try:
        on_message(sup, slot, got)
    except IllegalTransition as exc:
        misbehaved(sup, slot, f"{misbehaving.shown(got.msg)} ({exc})", type(got.msg).__name__)
    except Exception:                          # noqa: BLE001 - a bug of ours
        log.exception("worker %s: handling its %s failed; the master carries on",
                      name(slot), type(got.msg).__name__)


def misbehaved(sup, slot: Slot, offence: str, kind: str = "channel") -> None:
    """A message illegal for the worker's state, or a channel it broke
    (offence: which): it is not trusted any more; replaced (its successor
    READY first), else drained."""
    what, why = misbehaving.verdict(slot, sup.slots, sup.stopping, sup.pending)
    pid = slot.proc.pid if slot.proc is not None else 0
    doing = {misbehaving.REPLACE: "replacing it",
             misbehaving.DRAIN: f"draining it (not replaced: {why})",
             misbehaving.LEAVE: f"left as it is ({why})"}[what]
    told = misbehaving.to_log(slot, kind, time.monotonic())
    if told:
        log.error("worker %s (pid %d) misbehaves: %s: %s%s", name(slot), pid, offence, doing,
                  f" ({told - 1} more offences since the last such line)" if told > 1 else "")
    if what == misbehaving.REPLACE:
        sup._replace(slot, "misbehaving")
    elif what == misbehaving.DRAIN:
        sup._feed(slot, Event.DRAIN)


def on_message(sup, slot: Slot, got) -> None:
    """A worker's message: READY, failed before READY, a heartbeat, a
    max_requests retirement, or a report it was asked for (inspect.py)."""
    got.close_fds()
    msg = got.msg
    if isinstance(msg, Ready) and slot.ready_owed and slot.life.state is State.DRAINING:
        # adopted as draining, it was still starting at the upgrade's exec
        # (state_of cannot tell the two apart): its READY is the one it owed,
        # the Drain posted at the adoption is read next (worker/bootstrap.py)
        slot.ready_owed = False
        log.info("worker %s: ready, pid %d (started before the upgrade's exec): draining "
                 "as told", name(slot), msg.pid)
    elif isinstance(msg, Ready):
        slot.ready_owed = False
        on_ready(sup, slot, msg)
    elif isinstance(msg, FailedBeforeReady):
        log.error("worker %s: failed before ready: %s", name(slot), msg.reason)
        sup._feed(slot, Event.FAILED)
        if slot.replacing is not None:
            return                                  # its exit says the rest (exits.py)
        if sup.gens.starting(slot):
            # the traceback is logged above: the refusal says its last line
            last = (msg.reason.strip().splitlines() or ["?"])[-1]
            sup.gens.refuse(f"worker {name(slot)} failed before ready: {last}")
            return
        sup.first_failure = sup.first_failure or msg.reason
    elif isinstance(msg, Heartbeat):
        sup.table.on_heartbeat(slot)
    elif isinstance(msg, Retiring):
        sup._replace(slot, msg.reason or f"max_requests ({msg.requests} requests)")
    elif isinstance(msg, StatsReply):
        sup.asker.on_reply(msg)


def on_ready(sup, slot: Slot, msg: Ready) -> None:
    sup.table.on_heartbeat(slot)
    sup._feed(slot, Event.READY)
    if slot.life.state is State.READY:
        sup.table.serving(slot, sup.gens.of(slot)[0])
    log.info("worker %s: ready, pid %d", name(slot), msg.pid)
    sup.events.emit("ready", worker=name(slot), pid=slot.proc.pid)
    if sup.gens.on_ready(slot):
        return                           # a reload's or a replacement's
    sup.ever_ready = sup.ever_ready or slot in sup.slots
    if not sup.announced and ready(sup._active()):
        sup.announced = True
        sup.hooks.call("when_ready", sup.server)
        sup.events.emit("serving", generation=sup.generation,
                        workers=len(sup._active()))
    if sup.stopping or slot.retired:
        sup._feed(slot, Event.DRAIN)
    elif sup.on_serving is not None and ready(sup._active()):
        on_serving, sup.on_serving = sup.on_serving, None
        on_serving()
        # a takeover serves its own hand-off socket only now: one
        # that failed before must leave the old instance's in place
        sup._serve_handoff()
