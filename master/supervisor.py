"""The master's loop: one thread, one selector, no busy waiting.

It watches the signal wake-up fd (handlers only enqueue: `signal.set_wakeup_fd`),
every worker's socketpair, and its own timers (heartbeats, READY timeouts,
hard stops, respawn back-offs), and turns what it sees into lifecycle Events;
the Actions that come back (lifecycle.py) are carried out here. Child exits
arrive as SIGCHLD and are reaped with waitpid(WNOHANG) until none is left.

Signals: TERM drains every worker and exits 0 once they are gone (the master
closes its own listener copies first, so new connections are refused at once
instead of accepted and then reset); with unready_delay, the readiness
endpoint turns unready first and the listeners are served on that long (a
balancer stops sending) before that. A TERM during a graceful stop changes
nothing (Kubernetes sends one after a preStop hook that began the stop);
INT or QUIT kill the workers.
TTIN starts one worker more; TTOU drains the newest one (never the last).

HUP reloads: the settings are read again and a new generation of workers
starts on the listeners they name (master/reload.py); the old generation
keeps serving, and is told to drain only once every new worker is READY. A
reload that cannot finish (a bad setting, a bind that fails, a new worker
that fails, crashes or times out before READY) is refused with its reason:
the new workers are killed, the old generation never noticed. One reload
at a time.
"""
from __future__ import annotations

import collections
import heapq
import itertools
import logging
import os
import selectors
import signal
import socket
import sys
import time
from dataclasses import dataclass, field

from sockherd.ipc.errors import IPCError, PeerClosed
from sockherd.ipc.messages import (
    Drain, FailedBeforeReady, Heartbeat, Ready, Retiring, StatsReply,
)
from sockherd.master.lifecycle import Action, Backoff, Event, Outcome, State, Worker
from sockherd.master.listeners import Listener
from sockherd.master.reload import Pending, Refused, reconcile
from sockherd.master.events import Events
from sockherd.master.inspect import Asker
from sockherd.master.spawn import WorkerProcess, spawn
from sockherd.worker.board import NOT_SERVING, SLOTS, Board

log = logging.getLogger("sockherd.master")

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGCHLD, signal.SIGTTIN,
           signal.SIGTTOU, signal.SIGHUP, signal.SIGUSR2)


@dataclass(eq=False)
class Slot:
    index: int                     # its place in its generation: worker GEN.INDEX
    generation: int = 1
    board: int = -1                # its row on the balance board, unique among live workers
    backoff: Backoff = field(default_factory=Backoff)
    proc: WorkerProcess | None = None
    life: Worker | None = None
    started: float = 0.0
    last_heartbeat: float = 0.0
    given_up: bool = False
    retired: bool = False          # scaled down (TTOU): drained and never respawned
    replacing: "Slot | None" = None   # max_requests / lifetime: the worker this one replaces
    replaced_by: "Slot | None" = None # ... and the one replacing this one, while it starts
    replace_failures: int = 0


class Supervisor:
    def __init__(self, settings, listeners: list[Listener], config: dict, *, reload=None,
                 activated: list[Listener] | None = None, adopted=None, on_serving=None):
        self.settings = settings
        self.listeners = listeners
        self.config = config
        self.reload_settings = reload        # () -> new settings, raises SettingsError
        self.activated = activated or []     # systemd's: kept across reloads
        self.generation = 1
        count = settings.workers or os.cpu_count() or 1
        self.slots = [Slot(i) for i in range(count)]   # the serving generation's
        self.pending: Pending | None = None  # a reload's new generation, not READY yet
        self.others: list[Slot] = []         # older generations draining, refused ones dying
        # max_requests / lifetime replacements still starting: listed apart,
        # not found through the slot they replace (that one may be reaped
        # first: a reload committed meanwhile and it drained)
        self.replacements: list[Slot] = []
        self.reloads_ok = self.reloads_failed = self.upgrades_failed = 0
        self.last_upgrade_failure = ""
        self.last_reload_failure = ""
        # called once every worker of the first generation is READY (a
        # takeover: tell the instance we took the listeners from to drain)
        self.on_serving = on_serving
        self.handoff = None                  # ipc.handoff server (handoff_socket)
        self._handoff_fds: set[int] = set()
        # connection counts, for balance: the previous image's across an upgrade
        self.adopted = adopted               # ipc.reexec state of an upgrade, else None
        self.board = (Board(adopted.board_fd) if adopted and adopted.board_fd >= 0
                      else Board.create())
        self.by_pid: dict[int, Slot] = {}
        self.sel = selectors.DefaultSelector()
        # (when, seq, what, slot or None, pid it was armed for: 0 for any)
        self.timers: list[tuple[float, int, str, Slot | None, int]] = []
        self._seq = itertools.count()
        self.stopping = False
        self.killing = False                 # a fast stop: the workers were killed
        self.startup_failed = False
        self.ever_ready = False
        self.first_failure = ""
        self._wake_r, self._wake_w = socket.socketpair()
        self.events = Events()
        self.asker = Asker()                 # workers' figures, on demand (master/inspect.py)
        # callables other threads hand to the loop (run_in_loop): the metrics server's
        self._inbox: collections.deque = collections.deque()
        self._inbox_r, self._inbox_w = socket.socketpair()
        self.extras: list = []               # control server, metrics...: see add_extra()
        self.control = None                  # the control server (master/control.py)
        self.started_at = time.time()
        self.announced = False               # "serving" said (the first generation READY)

    # ---- timers --------------------------------------------------------------------
    def _at(self, delay: float, what: str, slot: Slot | None, pid: int = 0) -> None:
        """Arms a timer; one armed for a pid is dropped if that worker is gone
        (never fired at its respawned successor)."""
        heapq.heappush(self.timers, (time.monotonic() + delay, next(self._seq), what, slot, pid))

    # ---- workers -------------------------------------------------------------------
    def _live(self) -> list[Slot]:
        """Every slot of every generation (serving, starting, draining)."""
        return (self.slots + (self.pending.slots if self.pending else []) + self.others
                + self.replacements)

    def _board_row(self) -> int:
        """The lowest balance-board row no live worker holds."""
        taken = {s.board for s in self._live() if s.proc is not None or s.board >= 0}
        row = next((i for i in range(SLOTS) if i not in taken), None)
        if row is None:                       # _spawn says why the worker cannot start
            raise OSError(f"all {SLOTS} balance-board rows are taken by live workers")
        return row

    def _spawn(self, slot: Slot) -> None:
        pending = self.pending if self.pending and slot in self.pending.slots else None
        config = pending.config if pending else self.config
        listeners = pending.listeners if pending else self.listeners
        ready_timeout = (pending.settings if pending else self.settings).ready_timeout
        try:
            if slot.board < 0:
                slot.board = self._board_row()
            self.board.slots[slot.board] = NOT_SERVING   # until it says it serves
            proc = spawn(slot.generation, slot.index, config, config.get("app", ""),
                         listeners, board_fd=self.board.fd, board_row=slot.board)
        except (OSError, IPCError) as exc:
            log.error("worker %d.%d: cannot start: %s", slot.generation, slot.index, exc)
            if pending:
                self._refuse(f"worker {slot.generation}.{slot.index} cannot start: {exc}")
            elif slot.replacing is not None:
                self._replacement_failed(slot, f"cannot start: {exc}")
            else:
                self._after_exit(slot, Outcome.FAILED_START, 0.0)
            return
        slot.proc, slot.life = proc, Worker(slot.generation, slot.index)
        slot.started = slot.last_heartbeat = time.monotonic()
        self.by_pid[proc.pid] = slot
        self.sel.register(proc.channel.fileno(), selectors.EVENT_READ, slot)
        self._at(ready_timeout, "ready_timeout", slot, proc.pid)
        lifetime = (pending.settings if pending else self.settings).max_worker_lifetime
        if lifetime > 0:
            self._at(lifetime, "lifetime", slot, proc.pid)
        log.info("worker %d.%d: spawned, pid %d", slot.generation, slot.index, proc.pid)
        self.events.emit("spawned", worker=_name(slot), pid=proc.pid)

    def _feed(self, slot: Slot, event: Event) -> None:
        if slot.life is None or slot.life.state is State.EXITED:
            return
        for action in slot.life.handle(event):
            if action is Action.KILL:
                try:
                    os.kill(slot.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            elif action is Action.SEND_DRAIN:
                self.events.emit("draining", worker=_name(slot), pid=slot.proc.pid)
                try:
                    slot.proc.channel.send(Drain(deadline=time.monotonic()
                                                 + self.settings.hard_stop_after), timeout=5)
                except IPCError:
                    pass
            elif action is Action.ARM_HARD_STOP:
                self._at(self.settings.hard_stop_after + 1.0, "hard_stop", slot, slot.proc.pid)

    def _on_channel(self, slot: Slot) -> None:
        """Every message the worker's channel holds: one read can bring
        several (replies to concurrent control requests, a READY and a
        heartbeat), and select() cannot see those left in the inbox (review:
        they waited for the worker's next heartbeat, 25 s)."""
        ch = slot.proc.channel
        try:
            got = ch.recv(timeout=5)
        except (PeerClosed, IPCError):
            self.sel.unregister(ch.fileno())
            return                                  # the exit itself comes as SIGCHLD
        while got is not None:
            self._on_message(slot, got)
            if slot.proc is None or slot.proc.channel is not ch or ch.fileno() < 0:
                return
            while True:
                try:
                    got = ch.next_message()         # None once the inbox is empty
                    break
                except IPCError as exc:             # a malformed one (dropped): the next
                    log.error("worker %d.%d: %s", slot.generation, slot.index, exc)

    def _on_message(self, slot: Slot, got) -> None:
        got.close_fds()
        msg = got.msg
        if isinstance(msg, Ready):
            slot.last_heartbeat = time.monotonic()
            self._feed(slot, Event.READY)
            log.info("worker %d.%d: ready, pid %d", slot.generation, slot.index, msg.pid)
            self.events.emit("ready", worker=_name(slot), pid=slot.proc.pid)
            if self.pending and slot in self.pending.slots:
                self._maybe_commit()
                return
            if slot.replacing is not None:
                self._replaced(slot)
                return
            self.ever_ready = self.ever_ready or slot in self.slots
            if not self.announced and all(s.life is not None and s.life.state is State.READY
                                          for s in self._active()):
                self.announced = True
                self.events.emit("serving", generation=self.generation,
                                 workers=len(self._active()))
            if self.stopping or slot.retired:
                self._feed(slot, Event.DRAIN)
            elif self.on_serving is not None and all(
                    s.life is not None and s.life.state is State.READY for s in self._active()):
                on_serving, self.on_serving = self.on_serving, None
                on_serving()
                # a takeover serves its own hand-off socket only now: one
                # that failed before must leave the old instance's in place
                self._serve_handoff()
        elif isinstance(msg, FailedBeforeReady):
            log.error("worker %d.%d: failed before ready: %s", slot.generation, slot.index,
                      msg.reason)
            self._feed(slot, Event.FAILED)
            if slot.replacing is not None:
                return                                  # its exit says the rest (_reap)
            if self.pending and slot in self.pending.slots:
                # the traceback is logged above: the refusal says its last line
                last = (msg.reason.strip().splitlines() or ["?"])[-1]
                self._refuse(f"worker {slot.generation}.{slot.index} failed before ready: {last}")
                return
            self.first_failure = self.first_failure or msg.reason
        elif isinstance(msg, Heartbeat):
            slot.last_heartbeat = time.monotonic()
        elif isinstance(msg, Retiring):
            self._replace(slot, f"max_requests ({msg.requests} requests)")
        elif isinstance(msg, StatsReply):
            self.asker.on_reply(msg)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            slot = self.by_pid.pop(pid, None)
            if slot is None or slot.proc is None or slot.proc.pid != pid:
                continue
            self.board.slots[slot.board] = NOT_SERVING
            code = os.waitstatus_to_exitcode(status)
            slot.proc.exited(code)
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"status {code}"
            try:
                self.sel.unregister(slot.proc.channel.fileno())
            except (KeyError, ValueError):
                pass
            slot.proc.channel.close()
            self._feed(slot, Event.EXITED)
            outcome = slot.life.outcome
            log.info("worker %d.%d: exited with %s (%s), pid %d", slot.generation,
                     slot.index, how, outcome.value, pid)
            self.events.emit("exited", worker=_name(slot), pid=pid, status=how,
                             outcome=outcome.value)
            self.asker.gone(pid)
            served = time.monotonic() - slot.started
            slot.proc = None
            if self.pending and slot in self.pending.slots:
                self._refuse(f"worker {slot.generation}.{slot.index} exited with {how} "
                             f"before ready")
                continue
            if slot.replacing is not None:
                self._replacement_failed(slot, f"exited with {how} before ready")
                continue
            if slot in self.others:
                self.others.remove(slot)             # an older generation's: done
                continue
            if outcome is Outcome.FAILED_START and not slot.life.drain_requested \
                    and not self.first_failure:
                self.first_failure = f"worker {slot.generation}.{slot.index} exited with {how}"
            if not self.stopping and not slot.retired:
                self._after_exit(slot, outcome, served)

    def _after_exit(self, slot: Slot, outcome: Outcome, served: float) -> None:
        if outcome is Outcome.FAILED_START and not self.ever_ready:
            # first start, nothing ever served: retrying the same code and
            # settings will not help, and the operator needs the reason now
            log.error("worker %d.%d failed at first start: stopping", self.generation, slot.index)
            self.startup_failed = True
            self.stopping = True
            for other in self._live():
                if other.life is not None:
                    self._feed(other, Event.KILL)
            return
        delay = slot.backoff.after_exit(outcome, served)
        if delay is None:
            slot.given_up = True
            log.error("worker slot %d: gave up after %d failures in a row; the other workers "
                      "keep serving", slot.index, slot.backoff.failures)
            return
        log.info("worker slot %d: respawn in %.1fs", slot.index, delay)
        self._at(delay, "respawn", slot)

    # ---- signals and timers --------------------------------------------------------------
    def _on_signals(self) -> None:
        try:
            data = self._wake_r.recv(4096)
        except BlockingIOError:
            return
        upgrade = False
        for signum in data:
            if signum == signal.SIGUSR2:
                upgrade = True           # last: the exec ends this batch (review)
            elif signum == signal.SIGCHLD:
                self._reap()
            elif signum == signal.SIGTTIN and not self.stopping:
                self._scale_up()
            elif signum == signal.SIGTTOU and not self.stopping:
                self._scale_down()
            elif signum == signal.SIGHUP and not self.stopping:
                self._reload()
            elif signum == signal.SIGTERM and not self.stopping:
                self._graceful_stop()
            elif signum == signal.SIGTERM and not self.killing:
                log.info("TERM: stopping gracefully already (INT or QUIT stops at once)")
            elif signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
                self._fast_stop()
        if upgrade and not self.stopping:
            self._upgrade()

    def _active(self) -> list[Slot]:
        return [s for s in self.slots if not s.retired]

    def _scale_up(self) -> None:
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
        log.info("TTIN: %d workers", len(self._active()))
        self._spawn(slot)

    def _scale_down(self) -> None:
        """TTOU: drain the newest worker still counted (it finishes what it
        has, then exits); the last one stays."""
        active = self._active()
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
            self._feed(slot, Event.DRAIN)

    def _fast_stop(self) -> None:
        log.info("fast stop")
        if not self.stopping:
            self.events.emit("stopping", fast=True)
        self.stopping = self.killing = True
        for slot in self._live():
            if slot.life is not None:
                self._feed(slot, Event.KILL)

    def _graceful_stop(self) -> None:
        self.events.emit("stopping", fast=False)
        self.stopping = True                 # readiness says 503 from now (inspect.py)
        if self.pending:
            self._refuse("the master is stopping")
        delay = self.settings.unready_delay
        if delay > 0:
            log.info("graceful stop: unready; serving on for %gs (unready_delay), then draining",
                     delay)
            self._at(delay, "drain_all", None)
        else:
            self._drain_all()

    def _drain_all(self) -> None:
        if self.killing:
            return
        log.info("graceful stop: draining every worker")
        # nothing follows this generation: refuse new connections now rather
        # than accept them into a queue nobody will serve
        for lst in self.listeners:
            lst.close()
        for slot in self._live():
            if slot.life is not None:
                self._feed(slot, Event.DRAIN)

    # ---- reload --------------------------------------------------------------------------
    def _reload(self) -> str:
        """HUP: the settings again, a new generation on their listeners;
        the old one drains once every new worker is READY (_maybe_commit).
        Returns "" once the new generation is starting, else why not."""
        why = ""
        if self.pending:
            why = f"generation {self.pending.generation} is still starting"
        elif not self.ever_ready:
            why = "the first generation is not ready yet"
        elif self.reload_settings is None:
            why = "no settings to read again"
        elif self.stopping:
            why = "the master is stopping"
        if why:
            log.warning("reload refused: %s", why)
            return f"reload refused: {why}"
        gen = self.generation + 1
        try:
            try:
                settings = self.reload_settings()
            except Exception as exc:         # SettingsError, or anything: never the master's end
                raise Refused(f"bad setting: {exc}") from None
            listeners, added = reconcile(self.listeners, self.activated, settings)
        except Refused as exc:
            self._refused(gen, str(exc))
            return f"reload refused (generation {gen}): {exc}"
        import msgspec
        count = settings.workers or os.cpu_count() or 1
        self.pending = Pending(gen, settings, msgspec.structs.asdict(settings), listeners, added,
                               [Slot(i, gen) for i in range(count)], time.monotonic())
        for lst in added:
            log.info("listening on %s (new in generation %d)", lst.descriptor.address, gen)
        log.info("reload: starting generation %d (%d workers)", gen, count)
        self.events.emit("reloading", generation=gen)
        for slot in list(self.pending.slots):
            if self.pending is None or self.pending.generation != gen:
                # refused while starting them
                return f"reload refused (generation {gen}): {self.last_reload_failure}"
            self._spawn(slot)
        return ""

    def _upgrade(self, before_exec=None) -> str:
        """USR2: re-exec in place (master/upgrade.py); returns only if the
        exec failed or was refused (and why), and then this master carries
        on. before_exec() runs right before the exec (the control channel's
        reply)."""
        from sockherd.master import upgrade

        if self.pending:
            why = f"upgrade refused: generation {self.pending.generation} is still starting"
            log.warning("%s", why)
            return why
        starting = [s for s in self._live() if s.proc is not None
                    and s.life.state is State.STARTING]
        if not self.ever_ready or starting:
            # its READY would reach an image that adopted it as serving (review)
            why = (f"upgrade refused: {len(starting) or len(self.slots)} worker(s) still "
                   f"starting; try again once ready")
            log.warning("%s", why)
            return why
        # from here to the exec, a signal waits for the new image (a TERM
        # read while the settings are read again would be lost at the exec)
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
        try:
            try:
                settings = self.reload_settings() if self.reload_settings else self.settings
            except Exception as exc:                    # noqa: BLE001 - said, never fatal
                log.error("upgrade refused: bad setting: %s", exc)
                return f"upgrade refused: bad setting: {exc}"
            python = settings.python or sys.executable
            why = upgrade.preflight(python, upgrade.state_of(self))
            if not why:
                self.events.emit("upgrading", python=python)
                if before_exec is not None:
                    before_exec()
                if self.control is not None:
                    self.control.before_exec()
                why = upgrade.execute(self, python, HANDLED)
                self.upgrades_failed += 1            # `ctl upgrade` waits on it (status)
                self.last_upgrade_failure = why
                if self.control is not None:
                    self.control.exec_failed()
            log.error("upgrade failed: %s; this master carries on", why)
            return f"upgrade failed: {why}"
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)

    def _adopt(self) -> None:
        """After an upgrade: the previous image's workers are ours to
        supervise; the serving ones are the current generation until the
        reload that follows replaces them, the draining ones drain on."""
        from sockherd.master.spawn import adopt

        state, now = self.adopted, time.monotonic()
        self.generation = state.generation
        self.slots = []
        for w in state.workers:
            slot = Slot(w.index, w.generation, w.board)
            slot.proc = adopt(w.generation, w.index, w.pid, w.fd)
            slot.life = Worker(w.generation, w.index)
            slot.started = slot.last_heartbeat = now
            self.by_pid[w.pid] = slot
            if self.settings.max_worker_lifetime > 0:
                self._at(self.settings.max_worker_lifetime, "lifetime", slot, w.pid)
            self.sel.register(slot.proc.channel.fileno(), selectors.EVENT_READ, slot)
            self._feed(slot, Event.READY)
            if w.draining or w.generation != state.generation:
                slot.retired = True
                self.others.append(slot)
                self._feed(slot, Event.DRAIN)       # again: the hard stop timer is ours now
            else:
                self.slots.append(slot)
        self.ever_ready = self.announced = True
        log.info("upgrade: adopted %d listener(s) and %d worker(s) of generation %d",
                 len(self.listeners), len(state.workers), state.generation)
        # a worker that exited while the exec happened is reaped now
        self._reap()

    # ---- max_requests, max_worker_lifetime: one worker replaced ---------------------------
    def _replace(self, slot: Slot, why: str) -> bool:
        """A worker to replace: a new one starts in its place, and the old
        one drains once the new one is READY (never a gap in serving).
        Whether a replacement started."""
        if slot not in self.slots or slot.retired or self.stopping or slot.proc is None \
                or slot.life.state is not State.READY or slot.replaced_by is not None:
            return False
        if self.pending:
            return False      # the reload under way replaces every worker anyway
        new = Slot(slot.index, slot.generation)
        new.replacing, slot.replaced_by = slot, new
        self.replacements.append(new)
        log.info("worker %d.%d: %s: starting its replacement", slot.generation, slot.index, why)
        self._spawn(new)
        return True

    def _replaced(self, new: Slot) -> None:
        """The replacement is READY: it takes the slot's place, the old drains."""
        old, new.replacing = new.replacing, None
        old.replaced_by = None
        self.replacements.remove(new)
        if old not in self.slots or old.retired:  # a reload or a TTOU happened meanwhile
            self.others.append(new)
            self._feed(new, Event.DRAIN)
            return
        self.slots[self.slots.index(old)] = new
        new.backoff = old.backoff
        old.retired = True
        if old.proc is not None:
            self.others.append(old)
            self._feed(old, Event.DRAIN)
        log.info("worker %d.%d: replaced by pid %d; draining pid %d", new.generation,
                 new.index, new.proc.pid, old.proc.pid if old.proc else 0)

    def _replacement_failed(self, new: Slot, why: str) -> None:
        old, new.replacing = new.replacing, None
        old.replaced_by = None
        self.replacements.remove(new)
        old.replace_failures += 1
        log.error("worker %d.%d: its replacement %s; it serves on%s", old.generation, old.index,
                  why, "" if old.replace_failures < 5 else " (no more attempts)")
        if old.replace_failures < 5:
            self._at(min(30.0, 0.5 * 2 ** old.replace_failures), "replace", old,
                     old.proc.pid if old.proc else 0)

    def _maybe_commit(self) -> None:
        """Every new worker READY: the new generation serves, the old drains."""
        p = self.pending
        if any(s.life is None or s.life.state is not State.READY for s in p.slots):
            return
        self.pending = None
        old, self.slots = self.slots, p.slots
        for slot in old:
            slot.retired = True                  # never respawned
            if slot.proc is not None:
                self.others.append(slot)
                self._feed(slot, Event.DRAIN)
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
        self.events.emit("reload_ok", generation=p.generation, seconds=round(took, 3))

    def _refuse(self, reason: str) -> None:
        """The pending reload fails: its workers are killed (reaped later),
        what it bound is closed, the serving generation never noticed."""
        p, self.pending = self.pending, None
        if p is None:
            return
        p.abandon()
        for slot in p.slots:
            if slot.proc is not None:
                self.others.append(slot)
                self._feed(slot, Event.KILL)
        self._refused(p.generation, reason)

    def _refused(self, gen: int, reason: str) -> None:
        self.reloads_failed += 1
        self.last_reload_failure = reason
        log.error("reload refused (generation %d): %s; generation %d keeps serving", gen,
                  reason, self.generation)
        self.events.emit("reload_failed", generation=gen, reason=reason)

    # ---- hand-off (a new instance's --takeover) ---------------------------------------------
    def _serve_handoff(self) -> None:
        from sockherd.ipc.handoff import HandoffServer

        path = self.settings.handoff_socket
        if not path:
            return
        try:
            self.handoff = HandoffServer(
                path, lambda: [(lst.descriptor, lst.sock.fileno()) for lst in self.listeners],
                on_handed_over=self._handed_over)
        except OSError as exc:
            log.error("hand-off socket %s: %s; no takeover possible", path, exc.strerror or exc)
            return
        log.info("hand-off socket %s: a new instance may take the listeners over", path)

    def _handed_over(self, names: list[str], pid: int) -> None:
        # the new instance holds these sockets now: our close must not
        # remove a unix socket's file while it holds them too
        for lst in self.listeners:
            if lst.descriptor.name in names:
                lst.handed_to = pid
        log.info("hand-off: %d listener(s) given to a new instance; it will tell us to drain "
                 "once it serves", len(names))

    def _sync_handoff(self) -> None:
        """The hand-off server's fds in the selector (its sessions come and go)."""
        h = self.handoff
        if h is None:
            return
        h.expire()
        want = {fd: mask for fd, mask in h.poll_fds()}
        for fd in self._handoff_fds - set(want):
            try:
                self.sel.unregister(fd)
            except (KeyError, ValueError):
                pass
        for fd, mask in want.items():
            events = (selectors.EVENT_READ if mask & 1 else 0) | \
                (selectors.EVENT_WRITE if mask & 4 else 0)
            try:
                self.sel.modify(fd, events or selectors.EVENT_READ, ("handoff", fd))
            except KeyError:
                self.sel.register(fd, events or selectors.EVENT_READ, ("handoff", fd))
        self._handoff_fds = set(want)

    def _on_timer(self, what: str, slot: Slot) -> None:
        if what == "respawn":
            if not self.stopping and slot.proc is None and not slot.retired:
                self._spawn(slot)
        elif what == "ready_timeout" and slot.life is not None \
                and slot.life.state is State.STARTING:
            log.error("worker %d.%d: not ready after %.0fs", slot.generation, slot.index,
                      (self.pending.settings if self.pending and slot in self.pending.slots
                       else self.settings).ready_timeout)
            self._feed(slot, Event.READY_TIMEOUT)
            if self.pending and slot in self.pending.slots:
                self._refuse(f"worker {slot.generation}.{slot.index} not ready in time")
        elif what == "hard_stop" and slot.life is not None and slot.life.state is State.DRAINING:
            log.warning("worker %d.%d: still draining at hard_stop_after: killed",
                        slot.generation, slot.index)
            self._feed(slot, Event.HARD_STOP)
        elif what == "heartbeat":
            self._heartbeat()
        elif what == "drain_all":
            self._drain_all()
        elif what == "lifetime":
            self._replace(slot, f"max_worker_lifetime ({self.settings.max_worker_lifetime:g}s)")
        elif what == "replace":
            self._replace(slot, "replacing it again")

    def _heartbeat(self) -> None:
        """The check timer: workers send a heartbeat every heartbeat_interval
        on their own; one silent past heartbeat_timeout is killed. Re-armed
        for the moment the quietest serving worker would be late, so an idle
        tree costs the master one wake-up per worker heartbeat and nothing
        more."""
        now = time.monotonic()
        timeout = self.settings.heartbeat_timeout
        due = now + timeout
        for slot in self._live():
            if slot.proc is None or slot.life.state not in (State.READY, State.DRAINING):
                continue                    # starting: the READY timeout watches it
            silent = now - slot.last_heartbeat
            if silent > timeout:
                log.error("worker %d.%d: no heartbeat for %.0fs: killed", slot.generation,
                          slot.index, silent)
                self._feed(slot, Event.HEARTBEAT_LOST)
                continue
            due = min(due, slot.last_heartbeat + timeout)
        self._at(max(0.0, due - now) + 0.05, "heartbeat", None)

    # ---- other threads, other sockets ------------------------------------------------------
    def run_in_loop(self, fn) -> None:
        """From any thread: fn() runs in the master's loop, soon (the only
        way another thread may touch the supervisor's state)."""
        self._inbox.append(fn)
        try:
            self._inbox_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass                                   # a wake-up is pending already

    def add_extra(self, extra) -> None:
        """A server living in the master's loop (control channel, metrics):
        extra.fds() are watched for reading, extra.poll() runs after every
        wake-up (ZeroMQ's fds are edge-triggered: the extra reads all it
        has each time), extra.next_deadline() bounds the wait, extra.close()
        at the end."""
        self.extras.append(extra)
        for fd in extra.fds():
            self.sel.register(fd, selectors.EVENT_READ, ("extra", fd))

    def _run_inbox(self) -> None:
        try:
            while self._inbox_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        while self._inbox:
            fn = self._inbox.popleft()
            try:
                fn()
            except Exception:                      # noqa: BLE001 - another thread's call
                log.exception("a call handed to the master loop failed")

    # ---- the loop --------------------------------------------------------------------------
    def run(self) -> int:
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._inbox_r.setblocking(False)
        self._inbox_w.setblocking(False)
        self.sel.register(self._inbox_r.fileno(), selectors.EVENT_READ, ("inbox", 0))
        old = signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        previous = {s: signal.signal(s, lambda *_: None) for s in HANDLED}
        self.sel.register(self._wake_r.fileno(), selectors.EVENT_READ, None)
        # blocked across an upgrade's exec (master/upgrade.py): delivered now
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
        if self.on_serving is None:
            self._serve_handoff()
        try:
            if self.adopted is not None:
                self._adopt()
                self._reload()                     # the upgrade proceeds as a reload
            else:
                for slot in self.slots:
                    self._spawn(slot)
            self._at(self.settings.heartbeat_timeout, "heartbeat", None)
            return self._loop()
        finally:
            for extra in self.extras:
                extra.close()
            if self.handoff is not None:
                self.handoff.close()
            signal.set_wakeup_fd(old)
            for s, h in previous.items():
                signal.signal(s, h)
            for lst in self.listeners:
                lst.close()
            self.board.close()

    def _loop(self) -> int:
        while True:
            live = [s for s in self._live() if s.proc is not None]
            if self.stopping and not live:
                if self.startup_failed:
                    log.error("no worker became ready: %s", self.first_failure or "see above")
                    return 1
                log.info("every worker is gone: exiting")
                return 0
            # (slots are given up only after a READY: a failure before any
            # READY ends the master at once, as startup_failed above)
            if not live and all(s.given_up for s in self._active()):
                log.error("every worker slot was given up on: exiting")
                return 1
            due = [t for t in [self.timers[0][0] if self.timers else None,
                               self.asker.next_deadline(),
                               *(x.next_deadline() for x in self.extras)] if t is not None]
            timeout = max(0.0, min(due) - time.monotonic()) if due else None
            if self._inbox:
                timeout = 0.0
            self._sync_handoff()
            if len(self._handoff_fds) > 1:           # a session open: its expiry
                timeout = 1.0 if timeout is None else min(timeout, 1.0)
            for key, mask in self.sel.select(timeout):
                if key.data is None:
                    self._on_signals()
                elif isinstance(key.data, tuple):
                    if key.data[0] == "inbox":
                        self._run_inbox()
                    elif key.data[0] == "extra":
                        pass                                # polled below, every time
                    elif key.data[1] in self._handoff_fds:
                        self.handoff.handle(key.data[1],
                                            (1 if mask & selectors.EVENT_READ else 0)
                                            | (4 if mask & selectors.EVENT_WRITE else 0))
                        # a session it ended closed its fd: out of the selector
                        # now, before anything can get that number again
                        self._sync_handoff()
                elif key.data.proc is not None:
                    self._on_channel(key.data)
            now = time.monotonic()
            while self.timers and self.timers[0][0] <= now:
                _, _, what, slot, pid = heapq.heappop(self.timers)
                if pid and (slot.proc is None or slot.proc.pid != pid):
                    continue                        # armed for a worker that is gone
                self._on_timer(what, slot)
            self.asker.expire()
            if self._inbox:
                self._run_inbox()
            for extra in self.extras:
                try:
                    extra.poll()
                except Exception:                  # noqa: BLE001 - a side server's bug
                    log.exception("%s failed; the master carries on", type(extra).__name__)


def _name(slot: Slot) -> str:
    """A worker as logs and the control channel name it: GEN.INDEX."""
    return f"{slot.generation}.{slot.index}"
