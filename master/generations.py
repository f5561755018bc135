"""Generations: which workers serve, which start to replace them, which drain.

The serving generation (`slots`, with its settings, config and listeners),
a reload's new one while it starts (`pending`, reload.Pending), the older
ones draining (`others`) and single-worker replacements (max_requests,
max_worker_lifetime) while they start (`replacements`).

HUP reloads: the settings are read again and a new generation of workers
starts on the listeners they name (master/reload.py); the old generation
keeps serving, and is told to drain only once every new worker is READY
(commit). A reload that cannot finish (a bad setting, a bind that fails, a
new worker that fails, crashes or times out before READY) is refused with
its reason: the new workers are killed, the old generation never noticed.
With reload_probation, the commit keeps the old generation serving beside
the new one for that long, and a new worker's unplanned exit in that window
rolls the reload back (master/probation.py says how it stands by);
the reload is over (reload_ok, or reload_failed) only when probation ends.
Every attempt gets its own generation number, a refused one too (`numbered`).
One reload at a time: a HUP that arrives during one (or its probation) is
queued and runs once it is over; a control client's is refused with why.
An upgrade's new image adopts the previous image's workers as the serving
generation and proceeds as a reload.

The host (the loop, supervisor.py) spawns and feeds workers, arms timers
and owns `events` and `stopping`. The decisions (`reload_refusal`,
`upgrade_refusal`, `replace_refusal`, `takes_place`) are pure and
unit-tested without processes (tests/master/test_generations.py).
"""
from __future__ import annotations

import logging
import os
import time

import msgspec

from sockherd.master import probation as trial
from sockherd.master import tls
from sockherd.master.lifecycle import Backoff, Event, Outcome, State
from sockherd.master.probation import Probation
from sockherd.master.reload import Pending, Refused, reconcile
from sockherd.master.workers import Slot, name, ready
from sockherd.worker.board import SLOTS

log = logging.getLogger("sockherd.master")

MAX_REPLACE_FAILURES = 5       # a replacement failing that often: the worker serves on


# ---- pure decisions ---------------------------------------------------------------------------
def reload_refusal(pending: Pending | None, ever_ready: bool, can_read: bool,
                   stopping: bool, probation: Probation | None = None,
                   now: float = 0.0) -> str:
    """Why a reload cannot begin now ("" if it can)."""
    if pending is not None:
        return f"generation {pending.generation} is still starting"
    if probation is not None:
        return trial.refusal(probation, now)
    if not ever_ready:
        return "the first generation is not ready yet"
    if not can_read:
        return "no settings to read again"
    if stopping:
        return "the master is stopping"
    return ""


def upgrade_refusal(pending: Pending | None, ever_ready: bool, starting: int,
                    workers: int) -> str:
    """Why an upgrade cannot begin now ("" if it can): a worker still
    starting would send its READY to an image that adopted it as serving."""
    if pending is not None:
        return f"generation {pending.generation} is still starting"
    if not ever_ready or starting:
        return f"{starting or workers} worker(s) still starting; try again once ready"
    return ""


def replace_refusal(slot: Slot, serving: list[Slot], stopping: bool,
                    pending: Pending | None) -> str:
    """Why slot's worker cannot be replaced now ("" if it can): only a
    serving, READY worker of the serving generation with no replacement
    starting already, and no reload under way (that replaces every worker
    anyway), nor a stop."""
    if slot not in serving or slot.retired:
        return "not serving"
    if stopping:
        return "the master is stopping"
    if slot.proc is None or slot.life.state is not State.READY:
        return "not ready"
    if slot.replaced_by is not None:
        return "its replacement is starting"
    if pending is not None:
        return "a reload is under way"
    return ""


def takes_place(old: Slot, serving: list[Slot]) -> bool:
    """Whether a READY replacement takes the place of the worker it
    replaces: not if a reload committed or a TTOU retired that one
    meanwhile (the replacement then drains at once)."""
    return old in serving and not old.retired


class Generations:
    def __init__(self, host, settings, listeners: list, config: dict, activated: list):
        self.host = host
        self.settings, self.listeners, self.config = settings, listeners, config
        self.activated = activated           # systemd's: kept across reloads
        self.generation = 1                  # the serving one
        self.numbered = 1                    # the last number given (a refused attempt's too)
        count = settings.workers or os.cpu_count() or 1
        self.slots = [Slot(i) for i in range(count)]   # the serving generation's
        self.pending: Pending | None = None  # a reload's new generation, not READY yet
        self.probation: Probation | None = None   # a committed one on probation, and the old
        self.queued = False                  # a HUP came during a reload: it runs after
        self.others: list[Slot] = []         # older generations draining, refused ones dying
        # max_requests / lifetime replacements still starting: listed apart,
        # not found through the slot they replace (that one may be reaped
        # first: a reload committed meanwhile and it drained)
        self.replacements: list[Slot] = []
        self.reloads_ok = self.reloads_failed = self.rollbacks = 0
        self.last_reload_failure = ""

    def live(self) -> list[Slot]:
        """Every slot of every generation (serving, starting, draining)."""
        return (self.slots + (self.pending.slots if self.pending else []) + self.others
                + self.replacements + (self.probation.slots if self.probation else []))

    def active(self) -> list[Slot]:
        return [s for s in self.slots if not s.retired]

    def starting(self, slot: Slot) -> bool:
        """Whether slot belongs to the reload under way."""
        return self.pending is not None and slot in self.pending.slots

    def kept(self, slot: Slot) -> bool:
        """Whether slot belongs to the generation kept through a probation."""
        return self.probation is not None and slot in self.probation.slots

    def of(self, slot: Slot) -> tuple:
        """(settings, config, listeners) slot's worker runs with."""
        p = self.pending if self.starting(slot) else (
            self.probation if self.kept(slot) else None)
        return (p.settings, p.config, p.listeners) if p else (
            self.settings, self.config, self.listeners)

    # ---- reload ---------------------------------------------------------------------------
    def reload(self, read_settings, ever_ready: bool, queue: bool = False) -> str:
        """HUP: the settings again, a new generation on their listeners;
        the old one drains once every new worker is READY (commit), or once
        probation passes. Returns "" once the new generation is starting,
        else why not. queue (a signal's): one that comes while a reload is
        under way runs after it, instead of being refused."""
        why = reload_refusal(self.pending, ever_ready, read_settings is not None,
                             self.host.stopping, self.probation, time.monotonic())
        if why and queue and (self.pending or self.probation):
            if not self.queued:
                log.warning("reload queued: %s; it runs once that one is over", why)
                self.host.events.emit("reload_queued", reason=why)
            self.queued = True                   # several HUPs meanwhile: one reload after
            return ""
        if why:
            log.warning("reload refused: %s", why)
            self.host.events.emit("reload_refused", reason=why)
            return f"reload refused: {why}"
        self.numbered = gen = self.next_number()
        try:
            try:
                settings = read_settings()
            except Exception as exc:         # SettingsError, or anything: never the master's end
                raise Refused(f"bad setting: {exc}") from None
            try:
                # the TLS files, read once for the generation (master/tls.py)
                config = tls.with_files(msgspec.structs.asdict(settings))
            except tls.TlsError as exc:
                raise Refused(f"bad setting: {exc}") from None
            listeners, added = reconcile(self.listeners, self.activated, settings)
        except Refused as exc:
            self.refused(gen, str(exc))
            return f"reload refused (generation {gen}): {exc}"
        count = settings.workers or os.cpu_count() or 1
        self.pending = Pending(gen, settings, config, listeners, added,
                               [Slot(i, gen) for i in range(count)], time.monotonic())
        for lst in added:
            log.info("listening on %s (new in generation %d)", lst.descriptor.address, gen)
        log.info("reload: starting generation %d (%d workers)", gen, count)
        self.host.events.emit("reloading", generation=gen)
        for slot in list(self.pending.slots):
            if self.pending is None or self.pending.generation != gen:
                # refused while starting them
                return f"reload refused (generation {gen}): {self.last_reload_failure}"
            self.host.spawn(slot)
        return ""

    def next_number(self) -> int:
        """The number the next reload attempt gets: never one given before,
        refused or rolled back (issue 19 §10: metrics and logs conflated
        the attempts)."""
        return max(self.numbered, self.generation) + 1

    def commit(self) -> None:
        """Every new worker READY: the new generation serves; the old one
        drains now, or stands by through the new one's probation."""
        p = self.pending
        if not ready(p.slots):
            return
        self.pending = None
        self.numbered = max(self.numbered, p.generation)
        old, self.slots = self.slots, p.slots
        took = time.monotonic() - p.started
        length = getattr(p.settings, "reload_probation", 0.0)
        previous, theirs = self.generation, self.listeners
        if length > 0:
            now = time.monotonic()
            self.probation = Probation(p.generation, previous, old, self.settings, self.config,
                                       self.listeners, now + length, took, length, now)
        self.listeners, self.settings, self.config = p.listeners, p.settings, p.config
        self.generation = p.generation
        if self.probation is not None:
            # only the new code answers from now on: the previous generation
            # stops accepting and lets its kept-alive clients go, and is
            # there to accept again at once if the new one fails
            for slot in old:
                self.host.standby(slot, True)
            log.info("reload: generation %d ready in %.2fs; on probation for %gs (generation %d "
                     "stands by until then, not accepting)", p.generation, took, length,
                     previous)
            self.host.events.emit("reload_probation", generation=p.generation,
                                  seconds=round(took, 3), probation=length)
            self.host.at(length, "probation", None)
            return
        self.retire(old)
        self.close_unused(theirs, self.listeners, p.generation)
        self.passed(p.generation, previous, took, 0.0)

    def retire(self, old: list[Slot]) -> None:
        """A generation done serving: its workers drain, never respawned."""
        for slot in old:
            slot.retired = True                  # never respawned
            if slot.proc is not None:
                self.others.append(slot)
                self.host.feed(slot, Event.DRAIN)

    def passed(self, gen: int, previous: int, took: float, probation: float) -> None:
        """The reload is over and good: counted, said, and a queued HUP runs."""
        self.reloads_ok += 1
        log.info("reload: generation %d serving (ready in %.2fs%s); draining generation %d",
                 gen, took, f", passed {probation:g}s of probation" if probation else "",
                 previous)
        self.host.events.emit("reload_ok", generation=gen, seconds=round(took, 3),
                              probation=probation)
        self.run_queued()

    def probation_over(self) -> None:
        """The probation timer: if nothing failed meanwhile, the reload is
        done: the previous generation drains."""
        pr = self.probation
        if pr is None or time.monotonic() < pr.until - 0.001:
            return                               # rolled back, or an earlier one's timer
        self.probation = None
        self.retire(pr.slots)
        self.close_unused(pr.listeners, self.listeners, pr.generation)
        self.passed(pr.generation, pr.previous, pr.took, pr.seconds)

    def close_unused(self, theirs: list, ours: list, gen: int) -> None:
        """Closes the listeners of theirs that ours (generation gen's) does
        not use: no worker that could poll them is left serving."""
        for lst in theirs:
            if lst not in ours:
                log.info("closing %s: not in generation %d's settings", lst.descriptor.address,
                         gen)
                lst.close()

    def rollback(self, reason: str) -> None:
        """A new worker failed on probation: the previous generation (which
        never stopped accepting) is the serving one again, its workers gone
        meanwhile respawned; the new one drains (a crashing worker's drain
        ends in its exit); the reload failed."""
        pr, self.probation = self.probation, None
        failed, self.slots = self.slots, pr.slots
        for slot in pr.slots:
            self.host.standby(slot, False)        # accepting again first, then the drain
        for slot in failed:
            slot.retired = True
            if slot.proc is not None:
                self.others.append(slot)
                self.host.feed(slot, Event.DRAIN)
        self.close_unused(self.listeners, pr.listeners, pr.previous)
        self.listeners, self.settings, self.config = pr.listeners, pr.settings, pr.config
        self.generation = pr.previous
        self.rollbacks += 1
        self.refused(pr.generation, f"{reason}; rolled back", rolled_back=True)
        for slot in self.slots:
            if slot.proc is None and not slot.retired:
                slot.backoff = Backoff()
                self.host.spawn(slot)
        self.run_queued()

    def end_probation(self, reason: str) -> None:
        """A stop during probation: every worker drains anyway; the reload
        client waiting for the outcome hears why there is none."""
        pr, self.probation = self.probation, None
        if pr is None:
            return
        for slot in pr.slots:
            slot.retired = True
            if slot.proc is not None:
                self.others.append(slot)
        self.refused(pr.generation, reason)

    def run_queued(self) -> None:
        """A HUP that came during the reload now over: it runs now, from
        the loop (not from inside the commit or the refusal)."""
        if self.queued:
            self.queued = False
            self.host.at(0.0, "queued_reload", None)

    def refuse(self, reason: str) -> None:
        """The pending reload fails: its workers are killed (reaped later),
        what it bound is closed, the serving generation never noticed."""
        p, self.pending = self.pending, None
        if p is None:
            return
        p.abandon()
        for slot in p.slots:
            if slot.proc is not None:
                self.others.append(slot)
                self.host.feed(slot, Event.KILL)
        self.refused(p.generation, reason)
        self.run_queued()

    def after_refusal(self, rolled_back: bool) -> str:
        """What serves once a reload failed: nothing, if the master stops
        (a TERM during a probation: "generation 2 keeps serving" was said)."""
        if self.host.stopping:
            return "every worker drains: the master is stopping"
        return f"generation {self.generation} " + ("serves again" if rolled_back
                                                   else "keeps serving")

    def refused(self, gen: int, reason: str, rolled_back: bool = False) -> None:
        self.reloads_failed += 1
        self.last_reload_failure = reason
        log.error("reload %s (generation %d): %s; %s", "failed" if rolled_back else "refused",
                  gen, reason, self.after_refusal(rolled_back))
        self.host.events.emit("reload_failed", generation=gen, reason=reason,
                              rolled_back=rolled_back)

    # ---- what happens to one worker, by the generation it belongs to ----------------------
    def on_ready(self, slot: Slot) -> bool:
        """A READY: True if it was a new generation's or a replacement's
        (nothing more to do), False for the serving generation's."""
        if self.starting(slot):
            self.commit()
            return True
        if slot.replacing is not None:
            self.replaced(slot)
            return True
        # (a kept generation's worker is never respawned nor replaced during
        # the probation, on_exit: no READY of one needs a Standby here)
        return False

    def on_failure(self, slot: Slot, why: str, outcome: Outcome | None = None) -> bool:
        """slot's worker could not start, failed or exited (outcome: how;
        None: it could not be spawned): True if that ends a reload (before
        its commit, or on probation) or a replacement, False if the serving
        generation's exit policy decides."""
        if self.starting(slot):
            self.refuse(f"worker {name(slot)} {why}")
            return True
        if slot.replacing is not None:
            self.replacement_failed(slot, why)
            return True
        if self.probation is not None and slot in self.slots and trial.fails(outcome):
            into = time.monotonic() - self.probation.started
            self.rollback(f"worker {name(slot)} {why} {into:.1f}s into probation")
            return True
        return False

    def on_exit(self, slot: Slot) -> bool:
        """A reaped worker of an older or refused generation: forgotten,
        True; one of the generation kept through a probation: respawned if
        it serves again (rollback), True. False if it is the serving
        generation's."""
        if slot in self.others:
            self.others.remove(slot)
            return True
        return self.kept(slot)

    # ---- max_requests, max_worker_lifetime: one worker replaced ---------------------------
    def replace(self, slot: Slot, why: str) -> bool:
        """A worker to replace: a new one starts in its place, and the old
        one drains once the new one is READY (never a gap in serving).
        Whether a replacement started."""
        if replace_refusal(slot, self.slots, self.host.stopping, self.pending):
            return False
        new = Slot(slot.index, slot.generation)
        new.replacing, slot.replaced_by = slot, new
        self.replacements.append(new)
        log.info("worker %s: %s: starting its replacement", name(slot), why)
        self.host.spawn(new)
        return True

    def replaced(self, new: Slot) -> None:
        """The replacement is READY: it takes the slot's place, the old drains."""
        old, new.replacing = new.replacing, None
        old.replaced_by = None
        self.replacements.remove(new)
        if not takes_place(old, self.slots):
            self.others.append(new)
            self.host.feed(new, Event.DRAIN)
            return
        self.slots[self.slots.index(old)] = new
        new.backoff = old.backoff
        old.retired = True
        if old.proc is not None:
            self.others.append(old)
            self.host.feed(old, Event.DRAIN)
        log.info("worker %s: replaced by pid %d; draining pid %d", name(new), new.proc.pid,
                 old.proc.pid if old.proc else 0)

    def replacement_failed(self, new: Slot, why: str) -> None:
        old, new.replacing = new.replacing, None
        old.replaced_by = None
        self.replacements.remove(new)
        old.replace_failures += 1
        again = old.replace_failures < MAX_REPLACE_FAILURES
        log.error("worker %s: its replacement %s; it serves on%s", name(old), why,
                  "" if again else " (no more attempts)")
        if again:
            self.host.at(min(30.0, 0.5 * 2 ** old.replace_failures), "replace", old,
                         old.proc.pid if old.proc else 0)

    # ---- scaling: TTIN, TTOU --------------------------------------------------------------
    def scale_up(self) -> None:
        """TTIN: one worker more, in the first retired slot with no process
        left, else a new one."""
        if self.pending or self.probation:
            log.warning("TTIN ignored: a reload is under way")
            return
        slot = next((s for s in self.slots if s.retired and s.proc is None), None)
        if slot is None and len(self.slots) >= SLOTS:
            log.warning("TTIN ignored: %d worker slots is the most", SLOTS)
            return
        if slot is None:
            slot = Slot(len(self.slots), self.generation)
            self.slots.append(slot)
        slot.retired = False
        slot.backoff, slot.next_try = Backoff(), 0.0
        log.info("TTIN: %d workers", len(self.active()))
        self.host.spawn(slot)

    def scale_down(self) -> None:
        """TTOU: drain the newest worker still counted (it finishes what it
        has, then exits); the last one stays."""
        active = self.active()
        if self.pending or self.probation:
            log.warning("TTOU ignored: a reload is under way")
            return
        if len(active) <= 1:
            log.warning("TTOU ignored: one worker left")
            return
        slot = active[-1]
        slot.retired = True
        log.info("TTOU: %d workers; draining worker slot %d", len(active) - 1, slot.index)
        if slot.life is not None and slot.proc is not None:
            self.host.feed(slot, Event.DRAIN)

    # ---- an upgrade's new image -----------------------------------------------------------
    def adopt(self, state, table) -> None:
        """After an upgrade: the previous image's workers are ours to
        supervise; the serving ones are the current generation until the
        reload that follows replaces them, the draining ones drain on."""
        self.generation = state.generation
        self.numbered = max(self.numbered, state.generation)
        self.slots = []
        for w in state.workers:
            slot = table.adopt(w, self.settings)
            if w.draining or w.generation != state.generation:
                slot.retired = True
                self.others.append(slot)
                self.host.feed(slot, Event.DRAIN)   # again: the hard stop timer is ours now
            else:
                self.slots.append(slot)
        log.info("upgrade: adopted %d listener(s) and %d worker(s) of generation %d",
                 len(self.listeners), len(state.workers), state.generation)
