"""The master's loop: one thread, one selector, no busy waiting.

It watches the signal wake-up fd (handlers only enqueue: `signal.set_wakeup_fd`),
every worker's socketpair, and its own timers (heartbeats, READY timeouts,
hard stops, respawn back-offs), and turns what it sees into lifecycle Events;
the Actions that come back (lifecycle.py) are carried out here. Child exits
arrive as SIGCHLD and are reaped with waitpid(WNOHANG) until none is left.

Signals: TERM drains every worker and exits 0 once they are gone (the master
closes its own listener copies first, so new connections are refused at once
instead of accepted and then reset); a second TERM, INT or QUIT kills them.
TTIN starts one worker more; TTOU drains the newest one (never the last).
"""
from __future__ import annotations

import heapq
import itertools
import logging
import os
import selectors
import signal
import socket
import time
from dataclasses import dataclass, field

from sockherd.ipc.errors import IPCError, PeerClosed
from sockherd.ipc.messages import Drain, FailedBeforeReady, Heartbeat, Ready
from sockherd.master.lifecycle import Action, Backoff, Event, Outcome, State, Worker
from sockherd.master.listeners import Listener
from sockherd.master.spawn import WorkerProcess, spawn
from sockherd.worker.board import NOT_SERVING, SLOTS, Board

log = logging.getLogger("sockherd.master")

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGCHLD, signal.SIGTTIN,
           signal.SIGTTOU, signal.SIGHUP, signal.SIGUSR2)


@dataclass
class Slot:
    index: int
    backoff: Backoff = field(default_factory=Backoff)
    proc: WorkerProcess | None = None
    life: Worker | None = None
    started: float = 0.0
    last_heartbeat: float = 0.0
    given_up: bool = False
    retired: bool = False          # scaled down (TTOU): drained and never respawned


class Supervisor:
    def __init__(self, settings, listeners: list[Listener], config: dict):
        self.settings = settings
        self.listeners = listeners
        self.config = config
        self.generation = 1
        count = settings.workers or os.cpu_count() or 1
        self.slots = [Slot(i) for i in range(count)]
        self.board = Board.create()          # connection counts, for balance
        self.by_pid: dict[int, Slot] = {}
        self.sel = selectors.DefaultSelector()
        # (when, seq, what, slot index, pid it was armed for: 0 for any)
        self.timers: list[tuple[float, int, str, int, int]] = []
        self._seq = itertools.count()
        self.stopping = False
        self.startup_failed = False
        self.ever_ready = False
        self.first_failure = ""
        self._wake_r, self._wake_w = socket.socketpair()

    # ---- timers --------------------------------------------------------------------
    def _at(self, delay: float, what: str, slot: int, pid: int = 0) -> None:
        """Arms a timer; one armed for a pid is dropped if that worker is gone
        (never fired at its respawned successor)."""
        heapq.heappush(self.timers, (time.monotonic() + delay, next(self._seq), what, slot, pid))

    # ---- workers -------------------------------------------------------------------
    def _spawn(self, slot: Slot) -> None:
        try:
            self.board.slots[slot.index] = NOT_SERVING   # until it says it serves
            proc = spawn(self.generation, slot.index, self.config, self.settings.app,
                         self.listeners, board_fd=self.board.fd)
        except (OSError, IPCError) as exc:
            log.error("worker %d.%d: cannot start: %s", self.generation, slot.index, exc)
            self._after_exit(slot, Outcome.FAILED_START, 0.0)
            return
        slot.proc, slot.life = proc, Worker(self.generation, slot.index)
        slot.started = slot.last_heartbeat = time.monotonic()
        self.by_pid[proc.pid] = slot
        self.sel.register(proc.channel.fileno(), selectors.EVENT_READ, slot)
        self._at(self.settings.ready_timeout, "ready_timeout", slot.index, proc.pid)
        log.info("worker %d.%d: spawned, pid %d", self.generation, slot.index, proc.pid)

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
                try:
                    slot.proc.channel.send(Drain(deadline=time.monotonic()
                                                 + self.settings.hard_stop_after), timeout=5)
                except IPCError:
                    pass
            elif action is Action.ARM_HARD_STOP:
                self._at(self.settings.hard_stop_after + 1.0, "hard_stop", slot.index,
                         slot.proc.pid)

    def _on_channel(self, slot: Slot) -> None:
        try:
            got = slot.proc.channel.recv(timeout=5)
        except (PeerClosed, IPCError):
            self.sel.unregister(slot.proc.channel.fileno())
            return                                  # the exit itself comes as SIGCHLD
        got.close_fds()
        msg = got.msg
        if isinstance(msg, Ready):
            slot.last_heartbeat = time.monotonic()
            self._feed(slot, Event.READY)
            self.ever_ready = True
            log.info("worker %d.%d: ready, pid %d", slot.life.generation, slot.index, msg.pid)
            if self.stopping:
                self._feed(slot, Event.DRAIN)
        elif isinstance(msg, FailedBeforeReady):
            log.error("worker %d.%d: failed before ready: %s", slot.life.generation, slot.index,
                      msg.reason)
            self.first_failure = self.first_failure or msg.reason
            self._feed(slot, Event.FAILED)
        elif isinstance(msg, Heartbeat):
            slot.last_heartbeat = time.monotonic()

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
            self.board.slots[slot.index] = NOT_SERVING
            slot.proc.proc.returncode = os.waitstatus_to_exitcode(status)
            how = (f"signal {signal.Signals(-slot.proc.proc.returncode).name}"
                   if slot.proc.proc.returncode < 0 else f"status {slot.proc.proc.returncode}")
            try:
                self.sel.unregister(slot.proc.channel.fileno())
            except (KeyError, ValueError):
                pass
            slot.proc.channel.close()
            self._feed(slot, Event.EXITED)
            outcome = slot.life.outcome
            if outcome is Outcome.FAILED_START and not slot.life.drain_requested \
                    and not self.first_failure:
                self.first_failure = f"worker {slot.life.generation}.{slot.index} exited with {how}"
            log.info("worker %d.%d: exited with %s (%s), pid %d", slot.life.generation,
                     slot.index, how, outcome.value, pid)
            served = time.monotonic() - slot.started
            slot.proc = None
            if not self.stopping and not slot.retired:
                self._after_exit(slot, outcome, served)

    def _after_exit(self, slot: Slot, outcome: Outcome, served: float) -> None:
        if outcome is Outcome.FAILED_START and not self.ever_ready:
            # first start, nothing ever served: retrying the same code and
            # settings will not help, and the operator needs the reason now
            log.error("worker %d.%d failed at first start: stopping", self.generation, slot.index)
            self.startup_failed = True
            self.stopping = True
            for other in self.slots:
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
        self._at(delay, "respawn", slot.index)

    # ---- signals and timers --------------------------------------------------------------
    def _on_signals(self) -> None:
        try:
            data = self._wake_r.recv(4096)
        except BlockingIOError:
            return
        for signum in data:
            if signum == signal.SIGCHLD:
                self._reap()
            elif signum == signal.SIGTTIN and not self.stopping:
                self._scale_up()
            elif signum == signal.SIGTTOU and not self.stopping:
                self._scale_down()
            elif signum in (signal.SIGHUP, signal.SIGUSR2):
                # the reload issue gives these their meaning; until then an
                # operator's habitual HUP must not kill the server (the default)
                log.warning("%s: reload and upgrade are not implemented yet; ignored",
                            signal.Signals(signum).name)
            elif signum == signal.SIGTERM and not self.stopping:
                self._graceful_stop()
            elif signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
                log.info("fast stop")
                self.stopping = True
                for slot in self.slots:
                    if slot.life is not None:
                        self._feed(slot, Event.KILL)

    def _active(self) -> list[Slot]:
        return [s for s in self.slots if not s.retired]

    def _scale_up(self) -> None:
        """TTIN: one worker more, in the first retired slot with no process
        left, else a new one."""
        slot = next((s for s in self.slots if s.retired and s.proc is None), None)
        if slot is None and len(self.slots) >= SLOTS:
            log.warning("TTIN ignored: %d worker slots is the most", SLOTS)
            return
        if slot is None:
            slot = Slot(len(self.slots))
            self.slots.append(slot)
        slot.retired = slot.given_up = False
        slot.backoff = Backoff()
        log.info("TTIN: %d workers", len(self._active()))
        self._spawn(slot)

    def _scale_down(self) -> None:
        """TTOU: drain the newest worker still counted (it finishes what it
        has, then exits); the last one stays."""
        active = self._active()
        if len(active) <= 1:
            log.warning("TTOU ignored: one worker left")
            return
        slot = active[-1]
        slot.retired = True
        log.info("TTOU: %d workers; draining worker slot %d", len(active) - 1, slot.index)
        if slot.life is not None and slot.proc is not None:
            self._feed(slot, Event.DRAIN)

    def _graceful_stop(self) -> None:
        log.info("graceful stop: draining every worker")
        self.stopping = True
        # nothing follows this generation: refuse new connections now rather
        # than accept them into a queue nobody will serve
        for lst in self.listeners:
            lst.close()
        for slot in self.slots:
            if slot.life is not None:
                self._feed(slot, Event.DRAIN)

    def _on_timer(self, what: str, slot: Slot) -> None:
        if what == "respawn":
            if not self.stopping and slot.proc is None and not slot.retired:
                self._spawn(slot)
        elif what == "ready_timeout" and slot.life is not None \
                and slot.life.state is State.STARTING:
            log.error("worker %d.%d: not ready after %.0fs", slot.life.generation, slot.index,
                      self.settings.ready_timeout)
            self._feed(slot, Event.READY_TIMEOUT)
        elif what == "hard_stop" and slot.life is not None and slot.life.state is State.DRAINING:
            log.warning("worker %d.%d: still draining at hard_stop_after: killed",
                        slot.life.generation, slot.index)
            self._feed(slot, Event.HARD_STOP)
        elif what == "heartbeat":
            self._heartbeat()

    def _heartbeat(self) -> None:
        """The check timer: workers send a heartbeat every heartbeat_interval
        on their own; one silent past heartbeat_timeout is killed. Re-armed
        for the moment the quietest serving worker would be late, so an idle
        tree costs the master one wake-up per worker heartbeat and nothing
        more."""
        now = time.monotonic()
        timeout = self.settings.heartbeat_timeout
        due = now + timeout
        for slot in self.slots:
            if slot.proc is None or slot.life.state not in (State.READY, State.DRAINING):
                continue                    # starting: the READY timeout watches it
            silent = now - slot.last_heartbeat
            if silent > timeout:
                log.error("worker %d.%d: no heartbeat for %.0fs: killed", slot.life.generation,
                          slot.index, silent)
                self._feed(slot, Event.HEARTBEAT_LOST)
                continue
            due = min(due, slot.last_heartbeat + timeout)
        self._at(max(0.0, due - now) + 0.05, "heartbeat", -1)

    # ---- the loop --------------------------------------------------------------------------
    def run(self) -> int:
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        old = signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        previous = {s: signal.signal(s, lambda *_: None) for s in HANDLED}
        self.sel.register(self._wake_r.fileno(), selectors.EVENT_READ, None)
        try:
            for slot in self.slots:
                self._spawn(slot)
            self._at(self.settings.heartbeat_timeout, "heartbeat", -1)
            return self._loop()
        finally:
            signal.set_wakeup_fd(old)
            for s, h in previous.items():
                signal.signal(s, h)
            for lst in self.listeners:
                lst.close()
            self.board.close()

    def _loop(self) -> int:
        while True:
            live = [s for s in self.slots if s.proc is not None]
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
            timeout = None
            if self.timers:
                timeout = max(0.0, self.timers[0][0] - time.monotonic())
            for key, _ in self.sel.select(timeout):
                if key.data is None:
                    self._on_signals()
                elif key.data.proc is not None:
                    self._on_channel(key.data)
            now = time.monotonic()
            while self.timers and self.timers[0][0] <= now:
                _, _, what, idx, pid = heapq.heappop(self.timers)
                slot = self.slots[idx] if idx >= 0 else None
                if pid and (slot.proc is None or slot.proc.pid != pid):
                    continue                        # armed for a worker that is gone
                self._on_timer(what, slot)
