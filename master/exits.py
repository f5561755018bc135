"""A worker's start that failed, a worker's exit, and what follows.

The master's loop (supervisor.py) spawns through `spawn` and reaps on
SIGCHLD through `reap` (waitpid(WNOHANG) until none is left: the process
table). An exit or a failed start that is a reload's or a replacement's
ends that attempt (generations.py); otherwise the slot's exit policy
(workers.exit_policy) respawns it after its back-off, or a first start
that failed stops the master. A spawn the master's own resources failed
(spawn.Shortage) is retried, not counted against the slot (`short`).

Functions of the supervisor (sup), as upgrade.py's are.
"""
from __future__ import annotations

import errno
import os
import logging
import time

from sockherd.master.lifecycle import Event, Outcome
from sockherd.master.spawn import Shortage
from sockherd.master.workers import Slot, exit_policy, name

log = logging.getLogger("sockherd.master")

SHORTAGE_RETRY = 1.0        # seconds before a spawn the master's resources failed is retried


def spawn(sup, slot: Slot) -> None:
    settings, config, listeners = sup.gens.of(slot)
    try:
        why = sup.table.spawn(slot, config, listeners, settings, sup._live())
    except Shortage as exc:
        why = short(sup, slot, exc)
    else:
        if not why and slot in sup._short_slots:
            sup._short_slots.discard(slot)
            log.info("worker %s: started, the master's shortage over", name(slot))
    if why and not sup.gens.on_failure(slot, why):
        after_exit(sup, slot, Outcome.FAILED_START, 0.0)


def short(sup, slot: Slot, exc: Shortage) -> str:
    """A spawn the master's own resources failed (issue 19, finding 3):
    the slot of a serving generation is retried every SHORTAGE_RETRY
    seconds, its back-off untouched (the worker did nothing wrong; the
    slot is never given up for it; said once a streak); a reload's or a
    replacement's worker ends that attempt, as any failure to start
    does (why)."""
    what = errno.errorcode.get(exc.errno, str(exc.errno))
    why = f"cannot start: the master is short of resources: {what} ({exc.strerror})"
    if sup.gens.starting(slot) or slot.replacing is not None:
        log.error("worker %s: %s", name(slot), why)
        return why
    say = log.debug if slot in sup._short_slots else log.warning
    say("worker %s: %s; retried every %gs until it starts (not counted as a failure of "
        "the worker)", name(slot), why, SHORTAGE_RETRY)
    sup._short_slots.add(slot)
    sup._at(SHORTAGE_RETRY, "respawn", slot)
    return ""


def reap(sup) -> None:
    for slot, pid, how, served in sup.table.reap():
        # each exit in the boundary: one whose handling fails must not
        # leave the others unreaped until the next SIGCHLD
        sup._contain(f"the exit of pid {pid}", exited, sup, slot, pid, how, served)


def exited(sup, slot: Slot, pid: int, how: str, served: float) -> None:
    sup.asker.gone(pid)
    if sup.hooks.has("child_exit"):
        sup.hooks.call("child_exit", sup.server, _worker_view(sup, slot, pid, how))
    outcome = slot.life.outcome
    # one READY and waiting for the rest of its generation did not
    # fail "before ready" (issue 19 §10: the refusal said so)
    why = f"exited with {how} " + (
        "before ready" if not slot.life.was_ready else
        "after it was ready, before the commit" if sup.gens.starting(slot) else
        f"({outcome.value})")
    if sup.gens.on_failure(slot, why, outcome) or sup.gens.on_exit(slot):
        return                          # a reload's, a replacement's, an older one's
    if outcome is Outcome.FAILED_START and not slot.life.drain_requested \
            and not sup.first_failure:
        sup.first_failure = f"worker {name(slot)} exited with {how}"
    if not sup.stopping and not slot.retired:
        after_exit(sup, slot, outcome, served)


def after_exit(sup, slot: Slot, outcome: Outcome, served: float) -> None:
    after = exit_policy(slot.backoff, outcome, served, sup.ever_ready)
    if after.what == "stop":
        log.error("worker %d.%d failed at first start: stopping", sup.generation, slot.index)
        sup.startup_failed = True
        sup.stopping = True
        for other in sup._live():
            if other.life is not None:
                sup._feed(other, Event.KILL)
    else:
        # never given up on: the back-off is capped (lifecycle.Backoff),
        # the slot shows as backing off in `ctl status` and the metrics
        slot.next_try = time.monotonic() + after.delay
        failures = slot.backoff.failures
        (log.error if failures >= 5 else log.info)(
            "worker slot %d: respawn in %.1fs%s", slot.index, after.delay,
            f" ({failures} failures in a row)" if failures else "")
        sup._at(after.delay, "respawn", slot)


def _worker_view(sup, slot: Slot, pid: int, how: str):
    """The exited worker as child_exit sees it (worker/hooks.py): exitcode
    is its status, or minus the signal that killed it (as Popen says)."""
    import signal

    from sockherd.worker.hooks import Worker

    kind, _, what = how.partition(" ")
    code = int(what) if kind == "status" else -signal.Signals[what].value
    return Worker(pid=pid, ppid=os.getpid(), cfg=sup.settings, generation=slot.generation,
                  index=slot.index, exitcode=code)
