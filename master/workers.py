"""The process table: the master's live worker processes, one Slot each.

Spawning (a row on the balance board, the socketpair in the master's
selector, the READY timeout and the lifetime timer armed), feeding a
worker's lifecycle (lifecycle.py) and carrying out the Actions it returns,
reaping (waitpid(WNOHANG) until none is left), the exit policy (respawn
after a capped back-off, or stop the master when the first start failed)
and the heartbeat check live here. Which
generation a slot belongs to is generations.py's business; the decisions
(`exit_policy`, `heartbeat_check`, `finished`) are pure and unit-tested
without processes (tests/master/test_process_table.py).

Heartbeats and reports: a worker's Heartbeat message only refreshes
`Slot.last_heartbeat` (`ProcessTable.on_heartbeat`); `heartbeat_check`
decides which silent worker is killed and when to look again. What a
worker reports about itself on demand (figures, threads) goes through
master/inspect.py's Asker, fed from the loop's message dispatch.
"""
from __future__ import annotations

import logging
import os
import selectors
import signal
import time
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple

from sockherd.ipc.errors import IPCError
from sockherd.ipc.messages import Drain
from sockherd.master.lifecycle import Action, Backoff, Event, Outcome, State, Worker
from sockherd.master.spawn import Shortage, WorkerProcess, adopt, spawn
from sockherd.master.tls import assignment as tls_assignment
from sockherd.worker import EXIT_DRAIN_DEADLINE
from sockherd.worker.board import NOT_SERVING, SLOTS

# seconds past hard_stop_after before a draining worker is killed (below)
HARD_STOP_MARGIN = 2.0

log = logging.getLogger("sockherd.master")


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
    next_try: float = 0.0          # monotonic time of its respawn while backing off, else 0
    retired: bool = False          # scaled down (TTOU): drained and never respawned
    replacing: "Slot | None" = None   # max_requests / lifetime: the worker this one replaces
    replaced_by: "Slot | None" = None # ... and the one replacing this one, while it starts
    replace_failures: int = 0
    offences: int = 0              # illegal messages or channel breaks (misbehaving.py)
    offences_logged: int = 0       # ... of which told in the log so far
    offence_logged_at: float = 0.0
    offence_kinds: set = field(default_factory=set)   # ... the kinds told
    # adopted as draining (upgrade): it may have been starting at the exec,
    # so one READY may still come, and is no offence (channels.on_message)
    ready_owed: bool = False


def name(slot: Slot) -> str:
    """A worker as logs and the control channel name it: GEN.INDEX."""
    return f"{slot.generation}.{slot.index}"


def ready(slots) -> bool:
    """Whether every one of slots has a READY worker."""
    return all(s.life is not None and s.life.state is State.READY for s in slots)


# ---- pure decisions ---------------------------------------------------------------------------
class AfterExit(NamedTuple):
    """What follows a serving slot's exit: "respawn" after delay seconds,
    or "stop" the master (a first start failed). A slot is never given
    up on: the back-off is capped and the master retries it for as long as
    it lives (issue 19 §7)."""
    what: str
    delay: float = 0.0


def exit_policy(backoff: Backoff, outcome: Outcome, served: float, ever_ready: bool) -> AfterExit:
    """A first start that failed before anything ever served stops the
    master (retrying the same code and settings will not help, and the
    operator needs the reason now); else the slot's back-off decides."""
    if outcome is Outcome.FAILED_START and not ever_ready:
        return AfterExit("stop")
    return AfterExit("respawn", backoff.after_exit(outcome, served))


def heartbeat_check(slots, now: float, timeout: float) -> tuple[list[Slot], float]:
    """(the workers silent past timeout: to kill, when to check again).
    Only serving and draining workers are watched (a starting one has its
    READY timeout); the next check is due when the quietest one left would
    be late, so an idle tree costs one wake-up per heartbeat."""
    lost, due = [], now + timeout
    for slot in slots:
        if slot.proc is None or slot.life.state not in (State.READY, State.DRAINING):
            continue
        if now - slot.last_heartbeat > timeout:
            lost.append(slot)
            continue
        due = min(due, slot.last_heartbeat + timeout)
    return lost, due


def finished(stopping: bool, startup_failed: bool, live) -> int | None:
    """The master's exit status once it is done, else None. Only a stop
    (TERM, INT, QUIT, a failed first start) ends the master, once every
    live worker process, of any generation, is reaped. Failing slots never
    do: they back off and are tried again (issue 19 §7: the master exited
    once every slot was given up on, and closed the listeners)."""
    if not stopping or any(s.proc is not None for s in live):
        return None
    return 1 if startup_failed else 0


def backing_off(slots, now: float) -> list[dict]:
    """The serving slots with no worker, waiting for their respawn: what
    `ctl status` and the metrics show of a slot that keeps failing."""
    return [{"slot": s.index, "failures": s.backoff.failures,
             "next_try_in": round(max(0.0, s.next_try - now), 1)}
            for s in slots if s.proc is None and not s.retired and s.next_try > 0]


def post_now(slot: Slot, msg, *, backlog: bool = True) -> bool:
    """ProcessTable.post without the selector's write interest: msg
    written as far as the socket takes it now, the rest queued."""
    ch = slot.proc.channel
    if ch.fileno() < 0 or (not backlog and ch.wants_write):
        return False
    try:
        ch.post(msg)
    except (IPCError, OSError):
        return False                     # its end closed: the exit comes as SIGCHLD
    return True


# ---- the table --------------------------------------------------------------------------------
class ProcessTable:
    """Live worker processes by pid; `at(delay, what, slot, pid)` arms a
    loop timer (supervisor.py), `events` is the master's (events.py)."""

    def __init__(self, board, sel: selectors.BaseSelector, events, at):
        self.board = board
        self.sel = sel
        self.events = events
        self.at = at
        self.by_pid: dict[int, Slot] = {}

    def board_row(self, live) -> int:
        """The lowest balance-board row no live worker holds."""
        taken = {s.board for s in live if s.proc is not None or s.board >= 0}
        row = next((i for i in range(SLOTS) if i not in taken), None)
        if row is None:                       # spawn() says why the worker cannot start
            raise OSError(f"all {SLOTS} balance-board rows are taken by live workers")
        return row

    def spawn(self, slot: Slot, config: dict, listeners, settings, live) -> str:
        """Starts slot's worker with the generation's config, listeners and
        settings; "" once it runs, else why it cannot start (logged).
        Raises Shortage: the master's own resources, not the worker, failed."""
        try:
            if slot.board < 0:
                slot.board = self.board_row(live)
            self.board.slots[slot.board] = NOT_SERVING   # until it says it serves
            proc = spawn(slot.generation, slot.index, tls_assignment(config, settings, listeners),
                         config.get("app", ""),
                         listeners, board_fd=self.board.fd, board_row=slot.board)
        except Shortage:
            raise
        except (OSError, IPCError, ValueError) as exc:
            # ValueError: an assignment over the channel's frame cap (a
            # setting of 17 MB): escaping, it ended the loop (review)
            log.error("worker %s: cannot start: %s", name(slot), exc)
            return f"cannot start: {exc}"
        slot.proc, slot.life = proc, Worker(slot.generation, slot.index)
        slot.offences = slot.offences_logged = 0     # its own, not its predecessor's
        slot.offence_kinds = set()
        slot.started = slot.last_heartbeat = time.monotonic()
        self._watch(slot)
        self.at(settings.ready_timeout, "ready_timeout", slot, proc.pid)
        log.info("worker %s: spawned, pid %d", name(slot), proc.pid)
        self.events.emit("spawned", worker=name(slot), pid=proc.pid)
        return ""

    def adopt(self, worker, settings) -> Slot:
        """A worker of the previous image (an upgrade), READY as it was."""
        slot = Slot(worker.index, worker.generation, worker.board)
        slot.proc = adopt(worker.generation, worker.index, worker.pid, worker.fd)
        slot.life = Worker(worker.generation, worker.index)
        slot.started = slot.last_heartbeat = time.monotonic()
        self._watch(slot)
        self.feed(slot, Event.READY, settings.hard_stop_after)
        self.serving(slot, settings)
        slot.ready_owed = worker.draining
        return slot

    def _watch(self, slot: Slot) -> None:
        self.by_pid[slot.proc.pid] = slot
        self.sel.register(slot.proc.channel.fileno(), selectors.EVENT_READ, slot)

    def serving(self, slot: Slot, settings) -> None:
        """slot's worker is READY: its max_worker_lifetime counts from now
        ("a worker serving for this long"). Armed at the spawn, it could
        fire while the worker was still starting, be refused (not ready)
        and never come back: that worker then served for ever."""
        if settings.max_worker_lifetime > 0:
            self.at(settings.max_worker_lifetime, "lifetime", slot, slot.proc.pid)

    def feed(self, slot: Slot, event: Event, hard_stop_after: float) -> None:
        """event to slot's lifecycle; the actions it returns carried out."""
        if slot.life is None or slot.life.state is State.EXITED:
            return
        for action in slot.life.handle(event):
            if action is Action.KILL:
                try:
                    os.kill(slot.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            elif action is Action.SEND_DRAIN:
                self.events.emit("draining", worker=name(slot), pid=slot.proc.pid)
                self.post(slot, Drain(deadline=time.monotonic() + hard_stop_after))
            elif action is Action.ARM_HARD_STOP:
                # the worker cuts what is left at hard_stop_after itself, gives
                # open WebSockets' close handshakes half a second more
                # (worker/channel_service.py WS_CLOSE_GRACE) and exits 75: the kill
                # is for a worker that cannot, so it waits past all of that
                # (at +1.0 s, loaded workers that had closed every WebSocket
                # cleanly were still killed: tests/ws/test_ws_reload_contract.py)
                self.at(hard_stop_after + HARD_STOP_MARGIN, "hard_stop", slot, slot.proc.pid)

    def post(self, slot: Slot, msg, *, backlog: bool = True) -> bool:
        """msg to slot's worker without waiting: what its socket does not
        take now stays in the channel's outbox, written as the socket
        becomes writable (flush). A send that waited (up to 5 s for a
        Drain, 1 s per stats request) froze the master's loop while a
        worker did not read (issue 19 §6). backlog=False: not queued behind
        output the worker has not taken yet (a stats request to a worker
        that does not read is not answered anyway). Whether it was queued."""
        if not post_now(slot, msg, backlog=backlog):
            return False
        self._want_write(slot)
        return True

    def flush(self, slot: Slot) -> None:
        """slot's channel is writable: what its outbox holds, written."""
        try:
            slot.proc.channel.flush()
        except (IPCError, OSError):
            pass
        self._want_write(slot)

    def _want_write(self, slot: Slot) -> None:
        ch = slot.proc.channel
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if ch.wants_write else 0)
        try:
            if self.sel.get_key(ch.fileno()).events != events:
                self.sel.modify(ch.fileno(), events, slot)
        except (KeyError, ValueError):
            pass                         # not watched (forgotten): nothing to flush for

    def on_heartbeat(self, slot: Slot) -> None:
        """A worker's heartbeat (or READY): it is alive now."""
        slot.last_heartbeat = time.monotonic()

    def forget_channel(self, slot: Slot) -> None:
        try:
            self.sel.unregister(slot.proc.channel.fileno())
        except (KeyError, ValueError):
            pass

    def reap(self) -> Iterator[tuple[Slot, int, str, float]]:
        """Every exited worker of ours: (slot, pid, how it exited, seconds
        it served), its lifecycle EXITED and its process forgotten."""
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
            self.forget_channel(slot)
            slot.proc.channel.close()
            self.feed(slot, Event.EXITED, 0.0)
            outcome = slot.life.outcome
            # a drain cut short by its deadline is no clean drain (the
            # worker said so by its status): told apart in the log
            said = "hit the drain deadline" if outcome is Outcome.DRAINED \
                and code == EXIT_DRAIN_DEADLINE else outcome.value
            # a worker that crashed (by a signal or a status of its own while
            # serving) is an error, as gunicorn logs it; a drain's end or our
            # own kill is the plan (issue 36 §6: a SIGKILL was INFO)
            level = logging.ERROR if outcome in (Outcome.CRASHED, Outcome.FAILED_START) \
                and code != 0 else logging.INFO
            log.log(level, "worker %s: exited with %s (%s), pid %d", name(slot), how, said, pid)
            self.events.emit("exited", worker=name(slot), pid=pid, status=how,
                             outcome=outcome.value)
            served = time.monotonic() - slot.started
            slot.proc = None
            yield slot, pid, how, served
