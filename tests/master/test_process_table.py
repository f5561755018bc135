"""The process table's decisions, pure (master/workers.py): what follows a
worker's exit, which silent worker the heartbeat check kills and when it
looks again, and what a stop waits for before the master exits."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from sockherd.master.lifecycle import Backoff, Event, Outcome, State, Worker
from sockherd.master.workers import (
    AfterExit, Slot, backing_off, exit_policy, finished, heartbeat_check,
)

pytestmark = pytest.mark.timeout(30)


def live(index: int, state: State = State.READY, heartbeat: float = 0.0) -> Slot:
    slot = Slot(index)
    slot.proc = SimpleNamespace(pid=100 + index)
    slot.life = Worker(1, index)
    if state is not State.STARTING:
        slot.life.handle(Event.READY)
    if state is State.DRAINING:
        slot.life.handle(Event.DRAIN)
    slot.last_heartbeat = heartbeat
    return slot


# ---- exit policy ---------------------------------------------------------------------------
def test_first_start_failure_stops_the_master():
    """Nothing ever served: retrying the same code will not help."""
    assert exit_policy(Backoff(), Outcome.FAILED_START, 0.0, ever_ready=False) == AfterExit("stop")


def test_crash_respawns_with_a_capped_backoff_and_never_gives_up():
    """After a READY: 0.5, 1, 2, 4... s, capped at 30 s, for as long as the
    master lives (issue 19 §7: a slot given up on after 5 failures, and the
    master exiting once every slot was, took the service down)."""
    b = Backoff()
    got = [exit_policy(b, Outcome.CRASHED, 1.0, ever_ready=True) for _ in range(2000)]
    assert got[:8] == [AfterExit("respawn", d) for d in (0.5, 1, 2, 4, 8, 16, 30, 30)]
    assert set(got[8:]) == {AfterExit("respawn", 30.0)}


def test_drained_respawns_at_once():
    assert exit_policy(Backoff(), Outcome.DRAINED, 0.0, ever_ready=True) == AfterExit("respawn")


# ---- heartbeats ----------------------------------------------------------------------------
def test_heartbeat_check_kills_the_silent_and_rearms_for_the_quietest():
    """Silent past the timeout: killed; the next check when the quietest
    one left would be late; a starting worker is the READY timeout's."""
    slots = [live(0, heartbeat=0.0), live(1, heartbeat=8.0), live(2, State.DRAINING, 6.0),
             live(3, State.STARTING, 0.0)]
    lost, due = heartbeat_check(slots, now=11.0, timeout=10.0)
    assert lost == [slots[0]]
    assert due == 16.0
    gone = live(4)
    gone.proc = None
    assert heartbeat_check([gone], now=50.0, timeout=10.0) == ([], 60.0)


# ---- what a stop waits for -----------------------------------------------------------------
def test_stop_waits_for_every_live_worker_of_every_generation():
    """TERM: the master exits 0 only once every process is reaped."""
    draining = live(0, State.DRAINING)
    assert finished(True, False, [draining]) is None
    draining.proc = None
    assert finished(True, False, [draining]) == 0


def test_failed_start_exits_1_once_the_workers_are_gone():
    assert finished(True, True, [live(0)]) is None
    assert finished(True, True, []) == 1


def test_without_a_stop_the_master_never_ends():
    """Every slot failing and backing off, no process left: the master
    stays (issue 19 §7); only a stop ends it."""
    a, b = Slot(0), Slot(1)
    a.next_try = b.next_try = 100.0
    assert finished(False, False, [a, b]) is None
    assert finished(True, False, [a, b]) == 0


def test_backing_off_lists_the_slots_waiting_for_a_respawn():
    a, b, c = Slot(0), live(1), Slot(2)
    a.backoff.failures, a.next_try = 6, 130.0
    c.retired, c.next_try = True, 130.0                   # scaled down: not waiting
    assert backing_off([a, b, c], now=100.0) == [
        {"slot": 0, "failures": 6, "next_try_in": 30.0}]
