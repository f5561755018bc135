"""The worker lifecycle state machine and the respawn policy: pure, no I/O."""
from __future__ import annotations

import pytest

from sockherd.master.lifecycle import (
    TRANSITIONS, Action, Backoff, Event, IllegalTransition, Outcome, State, Worker,
)

pytestmark = pytest.mark.timeout(30)


def run(*events: Event) -> tuple[Worker, list[tuple[Action, ...]]]:
    w = Worker(generation=1, index=0)
    return w, [w.handle(e) for e in events]


def test_normal_life():
    w, acts = run(Event.READY, Event.DRAIN, Event.EXITED)
    assert w.state is State.EXITED and w.outcome is Outcome.DRAINED
    assert acts == [(), (Action.SEND_DRAIN, Action.ARM_HARD_STOP), ()]
    assert w.history == [State.STARTING, State.READY, State.DRAINING, State.EXITED]


@pytest.mark.parametrize("events,outcome", [
    ((Event.EXITED,), Outcome.FAILED_START),
    ((Event.FAILED, Event.EXITED), Outcome.FAILED_START),
    ((Event.READY_TIMEOUT, Event.EXITED), Outcome.FAILED_START),
    ((Event.READY, Event.EXITED), Outcome.CRASHED),
    ((Event.READY, Event.HEARTBEAT_LOST, Event.EXITED), Outcome.KILLED),
    ((Event.READY, Event.DRAIN, Event.HARD_STOP, Event.EXITED), Outcome.KILLED),
    ((Event.READY, Event.KILL, Event.EXITED), Outcome.KILLED),
    ((Event.DRAIN, Event.EXITED), Outcome.DRAINED),     # stopped while starting
])
def test_outcomes(events, outcome):
    w, _ = run(*events)
    assert w.outcome is outcome


def test_kill_is_sent_once():
    w, acts = run(Event.READY, Event.DRAIN, Event.HARD_STOP, Event.KILL, Event.HEARTBEAT_LOST)
    assert sum(a.count(Action.KILL) for a in acts) == 1
    assert w.state is State.STOPPING and w.outcome is None


@pytest.mark.parametrize("events", [
    (Event.READY, Event.READY),                  # READY twice: a lying worker
    (Event.READY, Event.FAILED),                 # FAILED after READY
    (Event.READY, Event.READY_TIMEOUT),          # a timer that should have been disarmed
    (Event.HARD_STOP,),                          # hard stop of a worker never drained
    (Event.EXITED, Event.READY),                 # anything after the end
])
def test_illegal_transition_raises_and_changes_nothing(events):
    w = Worker(generation=2, index=3)
    for e in events[:-1]:
        w.handle(e)
    before = (w.state, list(w.history), w.was_ready, w.drain_requested)
    with pytest.raises(IllegalTransition, match=r"worker 2\.3: "):
        w.handle(events[-1])
    assert (w.state, w.history, w.was_ready, w.drain_requested) == before


def test_every_state_but_exited_ends_on_exit_and_kill_is_never_illegal():
    for st in State:
        if st is State.EXITED:
            assert not any(s is st for s, _ in TRANSITIONS)
            continue
        assert TRANSITIONS[(st, Event.EXITED)][0] is State.EXITED
        assert (st, Event.KILL) in TRANSITIONS
        assert (st, Event.DRAIN) in TRANSITIONS


def test_backoff_doubles_is_capped_and_resets_when_stable():
    b = Backoff(base=0.5, cap=4.0, stable_after=10.0)
    delays = [b.after_exit(Outcome.CRASHED, served_for=1.0) for _ in range(6)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]     # capped, never given up
    b = Backoff()
    assert b.after_exit(Outcome.FAILED_START, 0.0) == 0.5
    assert b.after_exit(Outcome.FAILED_START, 0.0) == 1.0
    assert b.after_exit(Outcome.CRASHED, served_for=60.0) == 0.5   # served a while: reset
    assert b.after_exit(Outcome.DRAINED, 0.0) == 0.0 and b.failures == 1
    # a worker that never started is no proof of stability, however long it took
    b = Backoff()
    b.after_exit(Outcome.FAILED_START, 100.0)
    assert b.after_exit(Outcome.FAILED_START, 100.0) == 1.0
