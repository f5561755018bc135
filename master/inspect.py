"""What the master knows of its tree, and what it asks its workers.

snapshot(sup): the master's own view (no worker is asked): every live
worker with its generation, index, pid, state and role. Asker: a round of
StatsRequests to some workers, answered over their socketpairs and
delivered to a callback once every one answered or the deadline passed
(a worker that does not answer in time is reported as such, never waited
for). The master asks only when somebody asks it: an idle tree stays idle.
tree(sup, done): both, for `show proc`, the metrics and the status page.
"""
from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable

from sockherd.ipc.messages import StatsReply, StatsRequest
from sockherd.master.lifecycle import State
from sockherd.master.workers import backing_off, post_now

ASK_TIMEOUT = 2.0

log = logging.getLogger("sockherd.master")


def role(sup, slot) -> str:
    if sup.pending and slot in sup.pending.slots:
        return "starting"                        # a reload's new generation
    if slot.replacing is not None:
        return "replacing"
    if sup.gens.kept(slot):
        return "previous"                        # standing by through a reload's probation
    if slot in sup.slots and not slot.retired:
        return "serving" if slot.life and slot.life.state is State.READY else "starting"
    return "draining" if slot.life and slot.life.state is State.DRAINING else "stopping"


def readiness(sup) -> tuple[bool, str]:
    """Whether a balancer should send traffic here, and why not: the first
    generation READY, no stop begun (unready_delay: the balancer notices
    before the listeners close), a serving worker READY. Plain attribute
    reads: safe from another thread (the metrics listener's)."""
    if sup.stopping:
        return False, "stopping"
    if not sup.announced:
        return False, "starting"
    if not any(s.life is not None and s.life.state is State.READY for s in list(sup.slots)):
        return False, "no serving worker ready"
    return True, "ready"


def snapshot(sup) -> dict:
    now = time.monotonic()
    pr = sup.gens.probation
    workers = []
    for slot in sup._live():
        if slot.proc is None:
            continue
        count = sup.board.slots[slot.board] if slot.board >= 0 else -1
        workers.append({
            "worker": f"{slot.generation}.{slot.index}", "generation": slot.generation,
            "index": slot.index, "pid": slot.proc.pid, "state": slot.life.state.value,
            "role": role(sup, slot), "uptime": round(now - slot.started, 3),
            "connections": count if count >= 0 else None,
        })
    workers.sort(key=lambda w: (w["generation"], w["index"], w["pid"]))
    return {
        "master": {
            "pid": os.getpid(), "uptime": round(_process_uptime(), 3),
            "generation": sup.generation,
            "starting_generation": sup.pending.generation if sup.pending else None,
            "workers": len(sup._active()), "stopping": sup.stopping,
            "ready": readiness(sup)[0],
            "reloads_ok": sup.reloads_ok, "reloads_failed": sup.reloads_failed,
            "last_reload_failure": sup.last_reload_failure,
            "reloads_rolled_back": sup.gens.rollbacks,
            "probation": None if pr is None else {
                "generation": pr.generation, "previous": pr.previous,
                "left": round(pr.left(now), 1)},
            "backing_off": backing_off(sup.slots, now),
            "upgrades_failed": sup.upgrades_failed,
            "last_upgrade_failure": sup.last_upgrade_failure,
            "listeners": [lst.descriptor.address for lst in sup.listeners],
        },
        "workers": workers,
    }


def _process_uptime() -> float:
    """Since the process started (the pid's start, so an upgrade's exec does
    not reset it): /proc/self/stat's starttime, in clock ticks after boot."""
    try:
        with open("/proc/self/stat") as f:
            start = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start
    except (OSError, ValueError, IndexError):
        return 0.0


@dataclass(eq=False)
class _Round:
    done: Callable[[dict], None]
    deadline: float
    answers: dict = field(default_factory=dict)     # pid -> stats, or None: no answer
    waiting: set = field(default_factory=set)       # request ids still out


class Asker:
    def __init__(self, post: Callable[..., bool] = post_now) -> None:
        self._post = post                    # ProcessTable.post: never waits on a worker
        self._ids = itertools.count(1)
        self._out: dict[int, tuple[_Round, int]] = {}   # request id -> (round, pid)
        self._rounds: list[_Round] = []

    def ask(self, slots, what: str, done: Callable[[dict], None], *, fd: int = -1,
            timeout: float = ASK_TIMEOUT) -> None:
        """done({pid: stats or None}) once all of slots answered, or at the
        deadline; at once if none can be asked."""
        rnd = _Round(done, time.monotonic() + timeout)
        for slot in slots:
            if slot.proc is None or slot.proc.channel.fileno() < 0:
                continue                             # gone (its channel closed at the reap)
            rid = next(self._ids)
            rnd.answers[slot.proc.pid] = None
            if not self._post(slot, StatsRequest(request_id=rid, what=what, fd=fd),
                              backlog=False):
                continue            # exiting, or not reading: reported as no answer
            rnd.waiting.add(rid)
            self._out[rid] = (rnd, slot.proc.pid)
        self._rounds.append(rnd)
        self._settle(rnd)

    def on_reply(self, msg: StatsReply) -> None:
        rnd, pid = self._out.pop(msg.request_id, (None, 0))
        if rnd is None:
            return                                   # late: its round ended
        rnd.answers[pid] = msg.stats
        rnd.waiting.discard(msg.request_id)
        self._settle(rnd)

    def gone(self, pid: int) -> None:
        """A worker exited: its questions get no answer."""
        for rid, (rnd, who) in list(self._out.items()):
            if who == pid:
                del self._out[rid]
                rnd.waiting.discard(rid)
                self._settle(rnd)

    def next_deadline(self) -> float | None:
        return min((r.deadline for r in self._rounds), default=None)

    def expire(self) -> None:
        now = time.monotonic()
        for rnd in [r for r in self._rounds if r.deadline <= now]:
            for rid in rnd.waiting:
                self._out.pop(rid, None)
            rnd.waiting.clear()
            self._settle(rnd)

    def _settle(self, rnd: _Round) -> None:
        if rnd.waiting or rnd not in self._rounds:
            return
        self._rounds.remove(rnd)
        try:
            rnd.done(rnd.answers)
        except Exception:                          # noqa: BLE001 - never the master's end
            log.exception("a worker figures callback failed")


def tree(sup, done: Callable[[dict], None], *, activity: bool = True) -> None:
    """done(snapshot with each worker's "stats" (proc figures) and, with
    activity, its "threads" (per-thread counters); None where it did not
    answer in time)."""
    snap = snapshot(sup)
    slots = [s for s in sup._live() if s.proc is not None]

    def with_proc(answers: dict) -> None:
        for w in snap["workers"]:
            w["stats"] = answers.get(w["pid"])
        if not activity:
            done(snap)
            return
        # the workers live now (this may run inside a reap: one is gone)
        sup.asker.ask([s for s in sup._live() if s.proc is not None], "activity",
                      with_activity)

    def with_activity(answers: dict) -> None:
        for w in snap["workers"]:
            got = answers.get(w["pid"])
            w["threads"] = got["threads"] if got else None
        done(snap)

    sup.asker.ask(slots, "proc", with_proc)
