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
One reload at a time. An upgrade's new image adopts the previous image's
workers as the serving generation and proceeds as a reload.

The host (the loop, supervisor.py) spawns and feeds workers, arms timers
and owns `events` and `stopping`. The decisions (`reload_refusal`,
`upgrade_refusal`, `replace_refusal`, `takes_place`) are pure and
unit-tested without processes (tests/master/test_generations.py).
"""
from __future__ import annotations

import logging
import os
import time

from sockherd.master.lifecycle import Backoff, Event, State
from sockherd.master.reload import Pending, Refused, reconcile
from sockherd.master.workers import Slot, name, ready
from sockherd.worker.board import SLOTS

log = logging.getLogger("sockherd.master")

MAX_REPLACE_FAILURES = 5       # a replacement failing that often: the worker serves on


# ---- pure decisions ---------------------------------------------------------------------------
def reload_refusal(pending: Pending | None, ever_ready: bool, can_read: bool,
                   stopping: bool) -> str:
    """Why a reload cannot begin now ("" if it can)."""
    if pending is not None:
        return f"generation {pending.generation} is still starting"
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
        self.generation = 1
        count = settings.workers or os.cpu_count() or 1
        self.slots = [Slot(i) for i in range(count)]   # the serving generation's
        self.pending: Pending | None = None  # a reload's new generation, not READY yet
        self.others: list[Slot] = []         # older generations draining, refused ones dying
        # max_requests / lifetime replacements still starting: listed apart,
        # not found through the slot they replace (that one may be reaped
        # first: a reload committed meanwhile and it drained)
        self.replacements: list[Slot] = []
        self.reloads_ok = self.reloads_failed = 0
        self.last_reload_failure = ""

    def live(self) -> list[Slot]:
        """Every slot of every generation (serving, starting, draining)."""
        return (self.slots + (self.pending.slots if self.pending else []) + self.others
                + self.replacements)

    def active(self) -> list[Slot]:
        return [s for s in self.slots if not s.retired]

    def starting(self, slot: Slot) -> bool:
        """Whether slot belongs to the reload under way."""
        return self.pending is not None and slot in self.pending.slots

    def of(self, slot: Slot) -> tuple:
        """(settings, config, listeners) slot's worker runs with."""
        p = self.pending if self.starting(slot) else None
        return (p.settings, p.config, p.listeners) if p else (
            self.settings, self.config, self.listeners)

    # ---- reload ---------------------------------------------------------------------------
    def reload(self, read_settings, ever_ready: bool) -> str:
        """HUP: the settings again, a new generation on their listeners;
        the old one drains once every new worker is READY (commit).
        Returns "" once the new generation is starting, else why not."""
        why = reload_refusal(self.pending, ever_ready, read_settings is not None,
                             self.host.stopping)
        if why:
            log.warning("reload refused: %s", why)
            self.host.events.emit("reload_refused", reason=why)
            return f"reload refused: {why}"
        gen = self.generation + 1
        try:
            try:
                settings = read_settings()
            except Exception as exc:         # SettingsError, or anything: never the master's end
                raise Refused(f"bad setting: {exc}") from None
            listeners, added = reconcile(self.listeners, self.activated, settings)
        except Refused as exc:
            self.refused(gen, str(exc))
            return f"reload refused (generation {gen}): {exc}"
        import msgspec
        count = settings.workers or os.cpu_count() or 1
        self.pending = Pending(gen, settings, msgspec.structs.asdict(settings), listeners, added,
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

    def commit(self) -> None:
        """Every new worker READY: the new generation serves, the old drains."""
        p = self.pending
        if not ready(p.slots):
            return
        self.pending = None
        old, self.slots = self.slots, p.slots
        for slot in old:
            slot.retired = True                  # never respawned
            if slot.proc is not None:
                self.others.append(slot)
                self.host.feed(slot, Event.DRAIN)
        for lst in self.listeners:
            if lst not in p.listeners:
                log.info("closing %s: not in generation %d's settings", lst.descriptor.address,
                         p.generation)
                lst.close()
        self.listeners, self.settings, self.config = p.listeners, p.settings, p.config
        previous, self.generation = self.generation, p.generation
        self.reloads_ok += 1
        took = time.monotonic() - p.started
        log.info("reload: generation %d serving (ready in %.2fs); draining generation %d",
                 p.generation, took, previous)
        self.host.events.emit("reload_ok", generation=p.generation, seconds=round(took, 3))

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

    def refused(self, gen: int, reason: str) -> None:
        self.reloads_failed += 1
        self.last_reload_failure = reason
        log.error("reload refused (generation %d): %s; generation %d keeps serving", gen,
                  reason, self.generation)
        self.host.events.emit("reload_failed", generation=gen, reason=reason)

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
        return False

    def on_failure(self, slot: Slot, why: str) -> bool:
        """slot's worker could not start, failed or exited before READY:
        True if that ends a reload or a replacement, False if it is the
        serving generation's (its exit policy decides)."""
        if self.starting(slot):
            self.refuse(f"worker {name(slot)} {why}")
            return True
        if slot.replacing is not None:
            self.replacement_failed(slot, why)
            return True
        return False

    def on_exit(self, slot: Slot) -> bool:
        """A reaped worker of an older or refused generation: forgotten,
        True. False if it is the serving generation's."""
        if slot in self.others:
            self.others.remove(slot)
            return True
        return False

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
        if self.pending:
            log.warning("TTIN ignored: a reload is under way")
            return
        slot = next((s for s in self.slots if s.retired and s.proc is None), None)
        if slot is None and len(self.slots) >= SLOTS:
            log.warning("TTIN ignored: %d worker slots is the most", SLOTS)
            return
        if slot is None:
            slot = Slot(len(self.slots), self.generation)
            self.slots.append(slot)
        slot.retired = slot.given_up = False
        slot.backoff = Backoff()
        log.info("TTIN: %d workers", len(self.active()))
        self.host.spawn(slot)

    def scale_down(self) -> None:
        """TTOU: drain the newest worker still counted (it finishes what it
        has, then exits); the last one stays."""
        active = self.active()
        if self.pending:
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
