"""The life of one worker process, as a pure state machine.

No process, signal, socket or clock in here: the master's loop turns what it
sees (a READY message, a child's exit, an expired timer, an operator's drain)
into an Event, feeds it to `Worker.handle`, and carries out the Actions that
come back (send the drain message, kill the process, arm a timer). Every
transition is a row of TRANSITIONS; anything else is illegal, raises
IllegalTransition and changes nothing (h11's `_state.py` is the model).

    STARTING --READY--> READY --DRAIN--> DRAINING --EXITED--> EXITED
        |                 |                  |
        | FAILED, READY_TIMEOUT, KILL        | HARD_STOP, HEARTBEAT_LOST, KILL
        |                 | HEARTBEAT_LOST, KILL
        v                 v                  v
     STOPPING (killed, waiting for the exit) --EXITED--> EXITED

How a worker ended (`Worker.outcome`) is decided by the path it took: the
slot's respawn policy (`Backoff`) only looks at that.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class State(enum.Enum):
    STARTING = "starting"     # spawned, assignment sent, not READY yet
    READY = "ready"           # serving
    DRAINING = "draining"     # told to drain: accepts nothing, finishes what it has
    STOPPING = "stopping"     # killed, waiting for the exit
    EXITED = "exited"         # reaped (terminal)


class Event(enum.Enum):
    READY = "ready"                     # the worker reported READY
    FAILED = "failed"                   # the worker reported it failed before READY
    READY_TIMEOUT = "ready_timeout"     # not READY within ready_timeout
    DRAIN = "drain"                     # stop, reload, scale down, TTOU
    HARD_STOP = "hard_stop"             # still draining at hard_stop_after
    HEARTBEAT_LOST = "heartbeat_lost"   # no heartbeat answer within the timeout
    KILL = "kill"                       # fast stop (INT, QUIT, second TERM)
    EXITED = "exited"                   # the process was reaped


class Action(enum.Enum):
    SEND_DRAIN = "send_drain"           # tell the worker to drain
    ARM_HARD_STOP = "arm_hard_stop"     # start the hard_stop_after timer
    KILL = "kill"                       # SIGKILL the process


class Outcome(enum.Enum):
    """How a worker's life ended, once EXITED."""
    DRAINED = "drained"                 # exited after a drain: planned
    FAILED_START = "failed_start"       # never became READY
    CRASHED = "crashed"                 # exited on its own while serving
    KILLED = "killed"                   # killed by us after READY (hard stop, heartbeat, fast stop)


S, E, A = State, Event, Action
# (state, event) -> (next state, actions)
TRANSITIONS: dict[tuple[State, Event], tuple[State, tuple[Action, ...]]] = {
    (S.STARTING, E.READY): (S.READY, ()),
    (S.STARTING, E.FAILED): (S.STOPPING, (A.KILL,)),
    (S.STARTING, E.READY_TIMEOUT): (S.STOPPING, (A.KILL,)),
    (S.STARTING, E.DRAIN): (S.STOPPING, (A.KILL,)),     # nothing to finish yet
    (S.STARTING, E.HEARTBEAT_LOST): (S.STOPPING, (A.KILL,)),
    (S.STARTING, E.KILL): (S.STOPPING, (A.KILL,)),
    (S.STARTING, E.EXITED): (S.EXITED, ()),
    (S.READY, E.DRAIN): (S.DRAINING, (A.SEND_DRAIN, A.ARM_HARD_STOP)),
    (S.READY, E.HEARTBEAT_LOST): (S.STOPPING, (A.KILL,)),
    (S.READY, E.KILL): (S.STOPPING, (A.KILL,)),
    (S.READY, E.EXITED): (S.EXITED, ()),
    (S.DRAINING, E.DRAIN): (S.DRAINING, ()),             # already draining: idempotent
    (S.DRAINING, E.HARD_STOP): (S.STOPPING, (A.KILL,)),
    (S.DRAINING, E.HEARTBEAT_LOST): (S.STOPPING, (A.KILL,)),
    (S.DRAINING, E.KILL): (S.STOPPING, (A.KILL,)),
    (S.DRAINING, E.EXITED): (S.EXITED, ()),
    (S.STOPPING, E.DRAIN): (S.STOPPING, ()),
    (S.STOPPING, E.KILL): (S.STOPPING, ()),               # already killed
    (S.STOPPING, E.HARD_STOP): (S.STOPPING, ()),
    (S.STOPPING, E.HEARTBEAT_LOST): (S.STOPPING, ()),
    (S.STOPPING, E.READY_TIMEOUT): (S.STOPPING, ()),
    (S.STOPPING, E.READY): (S.STOPPING, ()),              # raced with our kill
    (S.STOPPING, E.FAILED): (S.STOPPING, ()),
    (S.STOPPING, E.EXITED): (S.EXITED, ()),
}


class IllegalTransition(RuntimeError):
    """An event that cannot happen in the current state (a bug or a lying worker)."""


@dataclass
class Worker:
    """One worker process's lifecycle: generation, slot index, the states it went through."""

    generation: int
    index: int
    state: State = State.STARTING
    history: list[State] = field(default_factory=lambda: [State.STARTING])
    was_ready: bool = False
    drain_requested: bool = False

    def handle(self, event: Event) -> tuple[Action, ...]:
        """Applies event; returns the actions for the master to carry out.
        Raises IllegalTransition (and changes nothing) for an impossible event."""
        try:
            nxt, actions = TRANSITIONS[(self.state, event)]
        except KeyError:
            raise IllegalTransition(f"worker {self.generation}.{self.index}: "
                                    f"{event.value} while {self.state.value}") from None
        if event is Event.READY and self.state is State.STARTING:
            self.was_ready = True
        if event is Event.DRAIN:
            self.drain_requested = True
        if nxt is not self.state:
            self.history.append(nxt)
        self.state = nxt
        return actions

    @property
    def outcome(self) -> Outcome | None:
        """How it ended, once EXITED."""
        if self.state is not State.EXITED:
            return None
        if not self.was_ready:
            return Outcome.FAILED_START if not self.drain_requested else Outcome.DRAINED
        if State.STOPPING in self.history:
            return Outcome.KILLED
        return Outcome.DRAINED if self.drain_requested else Outcome.CRASHED


@dataclass
class Backoff:
    """Respawn policy of one slot: exponential delay after each unplanned end,
    capped, reset after a worker served for `stable_after` seconds. It never
    gives up: a slot that keeps failing is tried again every `cap` seconds
    for as long as the master lives (issue 19 §7: giving up on every slot
    ended the master, and the listeners with it, over what may be a passing
    fault: a database down, a full disk). Times are passed in: no clock."""

    base: float = 0.5
    cap: float = 30.0
    stable_after: float = 10.0
    failures: int = 0

    def after_exit(self, outcome: Outcome, served_for: float) -> float:
        """Seconds to wait before respawning the slot. A planned end
        (DRAINED) is no failure and respawns at once."""
        if outcome is Outcome.DRAINED:
            return 0.0
        if outcome is not Outcome.FAILED_START and served_for >= self.stable_after:
            self.failures = 0
        self.failures += 1
        # the exponent is bounded: 2 ** failures overflows a float after ~1000
        return min(self.cap, self.base * 2 ** min(self.failures - 1, 32))
