"""The master's loop: one thread, one selector, no busy waiting.

It watches the signal wake-up fd (handlers only enqueue: `signal.set_wakeup_fd`),
every worker's socketpair, and its own timers (heartbeats, READY timeouts,
hard stops, respawn back-offs), and turns what it sees into lifecycle Events
for the process table (workers.py: spawn, feed, reap, exit policy,
heartbeats) and the generations (generations.py: reload, commit or refuse,
replacements, scaling, adoption after an upgrade); upgrade.py re-executes,
handoff.py serves a takeover. Child exits arrive as SIGCHLD and are reaped
with waitpid(WNOHANG) until none is left; exits.py says what follows an exit
or a start that failed. A worker's messages (READY, heartbeats, reports) are
read and dispatched by channels.py, inside a boundary no message can end the
loop through: one illegal for the worker's state marks it misbehaving, and
it is replaced (misbehaving.py).

Signals: TERM drains every worker and exits 0 once they are gone (the master
closes its own listener copies first, so new connections are refused at once
instead of accepted and then reset); with unready_delay, the readiness
endpoint turns unready first and the listeners are served on that long (a
balancer stops sending) before that. A TERM during a graceful stop changes
nothing (Kubernetes sends one after a preStop hook that began the stop);
INT or QUIT kill the workers.
TTIN starts one worker more; TTOU drains the newest one (never the last).

HUP reloads (generations.py), USR2 upgrades (upgrade.py).
"""
from __future__ import annotations

import collections
import os
import heapq
import itertools
import logging
import os
import selectors
import signal
import socket
import time

from sockherd.master import channels, comeback, devreload, exits, probation, upgrade
from sockherd.master.events import Events
from sockherd.master.generations import Generations
from sockherd.master.handoff import Handoff
from sockherd.master.inspect import Asker
from sockherd.master.lifecycle import Event, State
from sockherd.master.listeners import Listener
from sockherd.master.workers import ProcessTable, Slot, finished, heartbeat_check, name
from sockherd.master.logs import log_owner
from sockherd.worker import logfiles
from sockherd.worker.board import Board
from sockherd.worker.hooks import Hooks
from sockherd.worker.hooks import Server as HookServer

log = logging.getLogger("sockherd.master")

HANDLED = comeback.HANDLED


class Supervisor:
    """The loop: signals, worker channels, timers, other threads' calls and
    the side servers (extras) in one selector; what it sees goes to the
    process table (workers.py), the generations (generations.py) and the
    hand-off (handoff.py), a worker's messages through channels.py, its
    exit through exits.py. The attributes other modules read (slots,
    pending, generation, settings, listeners, reload counts...) are the
    generations' and are read through it."""

    def __init__(self, settings, listeners: list[Listener], config: dict, *, reload=None,
                 activated: list[Listener] | None = None, adopted=None, on_serving=None):
        self.reload_settings = reload        # () -> new settings, raises SettingsError
        self.gens = Generations(self, settings, listeners, config, activated or [])
        self.upgrades_failed = 0
        self.last_upgrade_failure = ""
        # called once every worker of the first generation is READY (a
        # takeover: tell the instance we took the listeners from to drain)
        self.on_serving = on_serving
        # connection counts, for balance: the previous image's across an upgrade
        self.adopted = adopted               # ipc.reexec state of an upgrade, else None
        self.board = (Board(adopted.board_fd) if adopted and adopted.board_fd >= 0
                      else Board.create())
        self.sel = selectors.DefaultSelector()
        self.handoff = Handoff(self.sel)     # handoff_socket: a new instance's --takeover
        # (when, seq, what, slot or None, pid it was armed for: 0 for any)
        self.timers: list[tuple[float, int, str, Slot | None, int]] = []
        self._seq = itertools.count()
        self.stopping = False
        self.killing = False                 # a fast stop: the workers were killed
        self.startup_failed = False
        self.ever_ready = False
        self.first_failure = ""
        # slots whose spawn the master's own resources failed (exits.short)
        self._short_slots: set[Slot] = set()
        self._wake_r, self._wake_w = socket.socketpair()
        self.events = Events()
        self.table = ProcessTable(self.board, self.sel, self.events, self._at)
        self.asker = Asker(self.table.post)                 # workers' figures, on demand (master/inspect.py)
        # callables other threads hand to the loop (run_in_loop): the metrics server's
        self._inbox: collections.deque = collections.deque()
        self._inbox_r, self._inbox_w = socket.socketpair()
        self.extras: list = []               # control server, metrics...: see add_extra()
        self.dev_stop = False                # --reload: Ctrl-C drains briefly (devreload.DEV_DRAIN)
        self.control = None                  # the control server (master/control.py)
        # workers that exited unplanned, by outcome (metrics.Restarts): kept
        # by metrics.attach, whether or not the metrics are served
        self.restarts = None
        # an upgrade's previous image's counts, carried on (upgrade.py)
        carried = upgrade.carried_counters()   # out of the environment in any case
        self.carried = carried if adopted is not None else {}
        self._carry_on(self.carried)
        self.started_at = time.time()
        self.announced = False               # "serving" said (the first generation READY)
        # the operator's hooks (worker/hooks.py) and the server view they get: cli.py's
        self.hooks = Hooks()
        self.server = HookServer(pid=os.getpid(), cfg=settings)

    # ---- what other modules read (inspect, notify, metrics, commands, upgrade) ------------
    settings = property(lambda self: self.gens.settings)
    listeners = property(lambda self: self.gens.listeners)
    config = property(lambda self: self.gens.config)
    activated = property(lambda self: self.gens.activated)
    generation = property(lambda self: self.gens.generation)
    slots = property(lambda self: self.gens.slots)
    pending = property(lambda self: self.gens.pending)
    reloads_ok = property(lambda self: self.gens.reloads_ok)
    reloads_failed = property(lambda self: self.gens.reloads_failed)
    last_reload_failure = property(lambda self: self.gens.last_reload_failure)

    def _live(self) -> list[Slot]:
        return self.gens.live()

    def _carry_on(self, counters: dict) -> None:
        """The previous image's counts (an upgrade) as this one's start."""
        try:
            self.gens.reloads_ok = int(counters.get("reloads_ok", 0))
            self.gens.reloads_failed = int(counters.get("reloads_failed", 0))
            self.gens.last_reload_failure = str(counters.get("last_reload_failure", ""))
            self.upgrades_failed = int(counters.get("upgrades_failed", 0))
        except (TypeError, ValueError) as exc:
            log.warning("upgrade: the previous image's counters are unreadable (%s)", exc)

    def _active(self) -> list[Slot]:
        return self.gens.active()

    # ---- the host interface generations.py uses ---------------------------------------
    def _at(self, delay: float, what: str, slot: Slot | None, pid: int = 0) -> None:
        """Arms a timer; one armed for a pid is dropped if that worker is gone
        (never fired at its respawned successor)."""
        heapq.heappush(self.timers, (time.monotonic() + delay, next(self._seq), what, slot, pid))

    at = _at

    def spawn(self, slot: Slot) -> None:
        exits.spawn(self, slot)             # a failure and what follows: exits.py

    def _feed(self, slot: Slot, event: Event) -> None:
        hard = self.settings.hard_stop_after
        if self.dev_stop:
            hard = min(hard, devreload.DEV_DRAIN)
        self.table.feed(slot, event, hard)

    feed = _feed

    def standby(self, slot: Slot, on: bool) -> None:
        """A kept generation's worker told to stand by (on: not accepting,
        master/probation.py) or to accept again (a rollback)."""
        if slot.proc is not None:
            from sockherd.ipc.messages import Standby
            self.table.post(slot, Standby(on=on))

    # ---- control commands (master/commands) -------------------------------------------
    def _reload(self, queue: bool = False) -> str:
        self.hooks.call("on_reload", self.server)
        return self.gens.reload(self.reload_settings, self.ever_ready, queue)

    def _upgrade(self, before_exec=None) -> str:
        # the new image would adopt both generations as they are, and
        # nobody would end the probation or roll it back
        why = probation.refusal(self.gens.probation, time.monotonic())
        if why:
            log.warning("upgrade refused: %s", why)
            return f"upgrade refused: {why}"
        return upgrade.run(self, HANDLED, before_exec)

    def _replace(self, slot: Slot, why: str) -> bool:
        return self.gens.replace(slot, why)

    def _scale_up(self) -> None:
        self.gens.scale_up()

    def _scale_down(self) -> None:
        self.gens.scale_down()

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
            else:
                self._contain(signal.Signals(signum).name, self._on_signal, signum)
        if upgrade and not self.stopping:
            self._contain("USR2", self._upgrade)

    def _contain(self, label: str, handle, *args) -> None:
        """One signal, timer, exit or wake-up inside the boundary: a bug of
        ours in its handling is logged and the loop carries on (review of
        issue 19: a ValueError from a reload's spawn on HUP ended the master)."""
        try:
            handle(*args)
        except Exception:                          # noqa: BLE001 - never the loop's end
            log.exception("handling %s failed; the master carries on", label)

    def _on_signal(self, signum: int) -> None:
        if signum == signal.SIGCHLD:
            exits.reap(self)
        elif signum == signal.SIGTTIN and not self.stopping:
            self._scale_up()
        elif signum == signal.SIGTTOU and not self.stopping:
            self._scale_down()
        elif signum == signal.SIGUSR1:
            self._reopen_logs()
        elif signum == signal.SIGHUP and not self.stopping:
            self._reload(queue=True)                # during a reload: runs after it
        elif signum == signal.SIGTERM and not self.stopping:
            self._graceful_stop()
        elif signum == signal.SIGINT and self.settings.reload and not self.stopping:
            # --reload (development): Ctrl-C lets in-flight requests end, as
            # uvicorn does, briefly; the second one stops at once
            log.info("INT: draining in-flight requests for %gs at most (INT again: at once)",
                     min(devreload.DEV_DRAIN, self.settings.hard_stop_after))
            self.dev_stop = True
            self._graceful_stop(delay=0.0)
        elif signum == signal.SIGTERM and not self.killing:
            log.info("TERM: stopping gracefully already (INT or QUIT stops at once)")
        elif signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
            self._fast_stop()

    def _on_timer(self, what: str, slot: Slot) -> None:
        if what == "respawn":
            if not self.stopping and slot.proc is None and not slot.retired:
                slot.next_try = 0.0
                self.spawn(slot)
        elif what == "probation":
            self.gens.probation_over()
        elif what == "queued_reload":
            if not self.stopping:
                self._reload(queue=True)
        elif what == "ready_timeout" and slot.life is not None \
                and slot.life.state is State.STARTING:
            log.error("worker %s: not ready after %.0fs", name(slot),
                      self.gens.of(slot)[0].ready_timeout)
            self._feed(slot, Event.READY_TIMEOUT)
            if self.gens.starting(slot):
                self.gens.refuse(f"worker {name(slot)} not ready in time")
        elif what == "hard_stop" and slot.life is not None and slot.life.state is State.DRAINING:
            log.warning("worker %s: still draining at hard_stop_after: killed", name(slot))
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
        on their own; one silent past heartbeat_timeout is killed
        (workers.heartbeat_check)."""
        now = time.monotonic()
        lost, due = heartbeat_check(self._live(), now, self.settings.heartbeat_timeout)
        for slot in lost:
            log.error("worker %s: no heartbeat for %.0fs: killed", name(slot),
                      now - slot.last_heartbeat)
            self._feed(slot, Event.HEARTBEAT_LOST)
        self._at(max(0.0, due - now) + 0.05, "heartbeat", None)

    def _reopen_logs(self) -> None:
        """USR1 (logrotate's postrotate): the master's log files anew, then
        each worker's (worker/logfiles.py says why no line is lost)."""
        logfiles.reopen_all(log_owner(self.settings))
        told = 0
        for slot in self._live():
            if slot.proc is not None:
                try:
                    os.kill(slot.proc.pid, signal.SIGUSR1)
                    told += 1
                except ProcessLookupError:
                    pass
        log.info("USR1: log files reopened; %d worker(s) told", told)

    # ---- stopping -----------------------------------------------------------------------
    def _fast_stop(self) -> None:
        log.info("fast stop")
        if not self.stopping:
            self.events.emit("stopping", fast=True)
        self.stopping = self.killing = True
        for slot in self._live():
            if slot.life is not None:
                self._feed(slot, Event.KILL)

    def _graceful_stop(self, delay: float | None = None) -> None:
        self.events.emit("stopping", fast=False)
        self.stopping = True                 # readiness says 503 from now (inspect.py)
        if self.pending:
            self.gens.refuse("the master is stopping")
        self.gens.end_probation("the master is stopping")
        delay = self.settings.unready_delay if delay is None else delay
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

    def _serve_handoff(self) -> None:
        self.handoff.serve(self.settings.handoff_socket, lambda: self.listeners)

    def _adopt(self) -> None:
        """After an upgrade (master/upgrade.py): the previous image's
        workers are ours (generations.adopt)."""
        self.gens.adopt(self.adopted, self.table)
        self.ever_ready = self.announced = True
        # a worker that exited while the exec happened is reaped now
        exits.reap(self)

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
                upgrade.proceed(self)              # as a reload (or it came back: comeback.py)
            else:
                for slot in self.slots:
                    self.spawn(slot)
            self._at(self.settings.heartbeat_timeout, "heartbeat", None)
            return self._loop()
        except BaseException as exc:
            # during an upgrade's start-up: back to the previous image
            # before the listeners are closed below (returns if not)
            comeback.fall_back(comeback.why_of(exc), exc)
            raise
        finally:
            for extra in self.extras:
                extra.close()
            self.handoff.close()
            signal.set_wakeup_fd(old)
            for s, h in previous.items():
                signal.signal(s, h)
            for lst in self.listeners:
                lst.close()
            self.board.close()

    def _loop(self) -> int:
        while True:
            if self.pending is None:
                comeback.serving()         # an upgrade's start-up ends once its reload settled
            status = finished(self.stopping, self.startup_failed, self._live())
            if status is not None:
                if self.startup_failed:
                    log.error("no worker became ready: %s", self.first_failure or "see above")
                else:
                    log.info("every worker is gone: exiting")
                return status
            due = [t for t in [self.timers[0][0] if self.timers else None,
                               self.asker.next_deadline(),
                               *(x.next_deadline() for x in self.extras)] if t is not None]
            timeout = max(0.0, min(due) - time.monotonic()) if due else None
            if self._inbox:
                timeout = 0.0
            self.handoff.sync()
            if self.handoff.session_open() or self.handoff.short:  # its expiry, fds back
                timeout = 1.0 if timeout is None else min(timeout, 1.0)
            for key, mask in self.sel.select(timeout):
                if key.data is None:
                    self._on_signals()
                elif isinstance(key.data, tuple):
                    if key.data[0] == "inbox":
                        self._run_inbox()
                    elif key.data[0] == "extra":
                        pass                                # polled below, every time
                    elif key.data[1] in self.handoff.fds:
                        self._contain("the hand-off socket", self.handoff.handle,
                                      key.data[1], mask)
                elif key.data.proc is not None:
                    if mask & selectors.EVENT_WRITE:
                        self._contain("a worker's channel", self.table.flush, key.data)
                    if mask & selectors.EVENT_READ and key.data.proc is not None:
                        # an OSError of the socket itself (not a worker's doing:
                        # those are IPCErrors, handled inside) must not end the loop
                        self._contain("a worker's channel", channels.on_channel, self,
                                      key.data)
            now = time.monotonic()
            while self.timers and self.timers[0][0] <= now:
                _, _, what, slot, pid = heapq.heappop(self.timers)
                if pid and (slot.proc is None or slot.proc.pid != pid):
                    continue                        # armed for a worker that is gone
                self._contain(f"the {what} timer", self._on_timer, what, slot)
            self.asker.expire()
            if self._inbox:
                self._run_inbox()
            for extra in self.extras:
                try:
                    extra.poll()
                except Exception:                  # noqa: BLE001 - a side server's bug
                    log.exception("%s failed; the master carries on", type(extra).__name__)

