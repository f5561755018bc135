"""Generations' decisions, pure (master/generations.py): when a reload may
begin, when it commits or is refused, when an upgrade may begin, which
worker a replacement replaces. No process, no socket: the Generations
object runs against a recording host."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from sockherd.master.generations import (
    Generations, reload_refusal, replace_refusal, takes_place, upgrade_refusal,
)
from sockherd.master.lifecycle import Event, Outcome, State, Worker
from sockherd.master.reload import Pending
from sockherd.master.workers import Slot

pytestmark = pytest.mark.timeout(30)


def worker(slot: Slot, state: State = State.READY) -> Slot:
    """slot with a (pretend) live process in state."""
    slot.proc = SimpleNamespace(pid=1000 + slot.generation * 100 + slot.index)
    slot.life = Worker(slot.generation, slot.index)
    if state is not State.STARTING:
        slot.life.handle(Event.READY)
    if state is State.DRAINING:
        slot.life.handle(Event.DRAIN)
    return slot


class Host:
    """What generations.py asks of the loop, recorded."""

    def __init__(self) -> None:
        self.stopping = False
        self.spawned: list[Slot] = []
        self.fed: list[tuple[Slot, Event]] = []
        self.timers: list[tuple[float, str]] = []
        self.emitted: list[tuple[str, dict]] = []
        self.stood: list[tuple[Slot, bool]] = []          # standby(slot, on) told
        self.events = SimpleNamespace(emit=lambda kind, **kw: self.emitted.append((kind, kw)))

    def spawn(self, slot: Slot) -> None:
        self.spawned.append(worker(slot, State.STARTING))

    def feed(self, slot: Slot, event: Event) -> None:
        self.fed.append((slot, event))
        slot.life.handle(event)

    def at(self, delay: float, what: str, slot, pid: int = 0) -> None:
        self.timers.append((delay, what))

    def standby(self, slot: Slot, on: bool) -> None:
        self.stood.append((slot, on))


def settings(workers: int = 2, bind=()) -> SimpleNamespace:
    return SimpleNamespace(workers=workers, bind=list(bind), backlog=16, unix_mode=None,
                           unix_owner=None, hard_stop_after=5.0)


def serving(n: int = 2) -> tuple[Generations, Host]:
    host = Host()
    gens = Generations(host, settings(n), [], {}, [])
    for slot in gens.slots:
        worker(slot)
    return gens, host


def pending(gen: int = 2, n: int = 2) -> Pending:
    return Pending(gen, settings(n), {}, [], [], [Slot(i, gen) for i in range(n)], 0.0)


# ---- when a reload may begin ---------------------------------------------------------------
@pytest.mark.parametrize("args,why", [
    ((None, True, True, False), ""),
    ((pending(3), True, True, False), "generation 3 is still starting"),
    ((None, False, True, False), "the first generation is not ready yet"),
    ((None, True, False, False), "no settings to read again"),
    ((None, True, True, True), "the master is stopping"),
])
def test_reload_refusal(args, why):
    """One reload at a time, only after the first generation served, never while stopping."""
    assert reload_refusal(*args) == why


def test_reload_refused_for_a_bad_setting_keeps_the_generation():
    """A settings error refuses the reload with its reason; nothing starts."""
    gens, host = serving()

    def bad():
        raise ValueError("workers: expected an int")

    why = gens.reload(bad, ever_ready=True)
    assert why == "reload refused (generation 2): bad setting: workers: expected an int"
    assert gens.pending is None and gens.generation == 1 and host.spawned == []
    assert (gens.reloads_ok, gens.reloads_failed) == (0, 1)
    assert host.emitted == [("reload_failed", {"generation": 2, "reason":
                                               "bad setting: workers: expected an int",
                                               "rolled_back": False})]


# ---- commit or refuse ----------------------------------------------------------------------
def test_reload_commits_only_once_every_new_worker_is_ready():
    """The old generation drains only when the last new worker is READY."""
    gens, host = serving(2)
    old = list(gens.slots)
    gens.pending = p = pending(2, 2)
    for slot in p.slots:
        host.spawn(slot)
    p.slots[0].life.handle(Event.READY)
    assert gens.on_ready(p.slots[0]) is True
    assert gens.pending is p and gens.slots == old and host.fed == []
    p.slots[1].life.handle(Event.READY)
    assert gens.on_ready(p.slots[1]) is True
    assert gens.pending is None and gens.slots == p.slots and gens.generation == 2
    assert [(s, e) for s, e in host.fed] == [(old[0], Event.DRAIN), (old[1], Event.DRAIN)]
    assert gens.others == old and all(s.retired for s in old)
    assert gens.reloads_ok == 1 and host.emitted[-1][0] == "reload_ok"


def test_new_worker_failing_refuses_the_reload():
    """A new worker failing before READY refuses the reload: the others of
    its generation are killed, the serving generation never notices."""
    gens, host = serving(2)
    old = list(gens.slots)
    gens.pending = p = pending(2, 2)
    for slot in p.slots:
        host.spawn(slot)
    assert gens.on_failure(p.slots[1], "exited with status 1 before ready") is True
    assert gens.pending is None and gens.slots == old and gens.generation == 1
    assert {(s.index, e) for s, e in host.fed} == {(0, Event.KILL), (1, Event.KILL)}
    assert gens.reloads_failed == 1
    assert gens.last_reload_failure == "worker 2.1 exited with status 1 before ready"
    assert gens.on_exit(p.slots[0]) is True and gens.on_exit(p.slots[0]) is False


def test_a_serving_workers_failure_is_the_exit_policys():
    """on_failure of a serving worker is not a generation's business."""
    gens, _ = serving(1)
    assert gens.on_failure(gens.slots[0], "cannot start: EMFILE") is False
    assert gens.on_exit(gens.slots[0]) is False


# ---- upgrade -------------------------------------------------------------------------------
@pytest.mark.parametrize("args,why", [
    ((None, True, 0, 2), ""),
    ((pending(2), True, 0, 2), "generation 2 is still starting"),
    ((None, True, 1, 2), "1 worker(s) still starting; try again once ready"),
    ((None, False, 0, 2), "2 worker(s) still starting; try again once ready"),
])
def test_upgrade_refusal(args, why):
    """No upgrade while a READY could reach an image that adopted its worker as serving."""
    assert upgrade_refusal(*args) == why


# ---- which worker a replacement replaces ---------------------------------------------------
def test_replace_refusal():
    """Only a READY serving worker with no replacement under way, no reload, no stop."""
    slots = [worker(Slot(0)), worker(Slot(1), State.STARTING)]
    assert replace_refusal(slots[0], slots, False, None) == ""
    assert replace_refusal(slots[1], slots, False, None) == "not ready"
    assert replace_refusal(slots[0], slots, True, None) == "the master is stopping"
    assert replace_refusal(slots[0], slots, False, pending()) == "a reload is under way"
    assert replace_refusal(worker(Slot(2)), slots, False, None) == "not serving"
    slots[0].replaced_by = Slot(0)
    assert replace_refusal(slots[0], slots, False, None) == "its replacement is starting"


def test_replacement_takes_the_place_of_the_worker_it_replaces():
    """Ready, the replacement takes its old worker's place (and back-off); the old drains."""
    gens, host = serving(2)
    old = gens.slots[1]
    assert gens.replace(old, "max_requests") is True
    new = host.spawned[-1]
    assert new.replacing is old and old.replaced_by is new and new.index == old.index
    assert gens.replace(old, "again") is False            # one at a time
    new.life.handle(Event.READY)
    assert gens.on_ready(new) is True
    assert gens.slots[1] is new and new.backoff is old.backoff and old.retired
    assert gens.others == [old] and host.fed == [(old, Event.DRAIN)]
    assert gens.replacements == [] and new.replacing is None and old.replaced_by is None


def test_replacement_of_a_worker_gone_from_service_drains():
    """A reload or TTOU retired the old worker meanwhile: the replacement drains instead."""
    old = worker(Slot(0))
    assert takes_place(old, [old]) is True
    assert takes_place(old, []) is False
    old.retired = True
    assert takes_place(old, [old]) is False
    gens, host = serving(2)
    old = gens.slots[1]
    gens.replace(old, "lifetime")
    new = host.spawned[-1]
    gens.scale_down()                                     # TTOU retires slot 1
    new.life.handle(Event.READY)
    gens.on_ready(new)
    assert gens.slots[1] is old and new in gens.others
    assert (new, Event.DRAIN) in host.fed


def test_failed_replacement_retries_with_backoff_then_stops():
    """A replacement failing: the old worker serves on, retried 0.5 s, 1 s... four times."""
    gens, host = serving(1)
    old = gens.slots[0]
    for _ in range(5):
        assert gens.replace(old, "lifetime")
        gens.on_failure(host.spawned[-1], "cannot start: EAGAIN")
    assert [t for t in host.timers] == [(1.0, "replace"), (2.0, "replace"), (4.0, "replace"),
                                        (8.0, "replace")]
    assert gens.slots == [old] and gens.replacements == []


def test_a_reload_refused_before_it_begins_is_an_event():
    """Issue 18 §5: a refused HUP was only logged; now `reload_refused`
    says why (no generation began: no reload_failed, nothing counted)."""
    gens, host = serving()
    gens.pending = pending(2)
    assert gens.reload(lambda: settings(), ever_ready=True) == \
        "reload refused: generation 2 is still starting"
    assert host.emitted == [("reload_refused", {"reason": "generation 2 is still starting"})]
    assert gens.reloads_failed == 0 and host.spawned == []


# ---- probation (issue 19 §7) ---------------------------------------------------------------
def on_probation(seconds: float = 10.0) -> tuple[Generations, Host, list[Slot], Pending]:
    """A reload committed with reload_probation: generation 2 serves, 1 is kept."""
    gens, host = serving(2)
    old = list(gens.slots)
    gens.pending = p = pending(2, 2)
    p.settings.reload_probation = seconds
    for slot in p.slots:
        host.spawn(slot)
        slot.life.handle(Event.READY)
        gens.on_ready(slot)
    return gens, host, old, p


def test_the_commit_keeps_the_old_generation_standing_by_through_probation():
    gens, host, old, p = on_probation()
    assert gens.slots == p.slots and gens.generation == 2
    assert gens.probation.slots == old and gens.probation.previous == 1
    assert host.fed == [] and not any(s.retired for s in old)     # not drained
    assert host.stood == [(old[0], True), (old[1], True)]          # but standing by
    assert all(gens.kept(s) for s in old) and set(old) <= set(gens.live())
    assert (10.0, "probation") in host.timers
    assert host.emitted[-1][0] == "reload_probation" and gens.reloads_ok == 0
    # a reload, a TTIN meanwhile: not now (a HUP is queued: test_a_hup_...)
    assert "generation 2 is on probation" in gens.reload(lambda: settings(), True)
    assert gens.reload(lambda: settings(), True, queue=True) == "" and gens.queued


def test_probation_passed_drains_the_old_generation():
    gens, host, old, p = on_probation(0.0001)
    gens.queued = True
    gens.probation_over()
    assert gens.probation is None and gens.others == old and all(s.retired for s in old)
    assert [(s, e) for s, e in host.fed] == [(old[0], Event.DRAIN), (old[1], Event.DRAIN)]
    assert gens.reloads_ok == 1
    assert host.emitted[-1] == ("reload_ok", {"generation": 2, "seconds": pytest.approx(
        host.emitted[-1][1]["seconds"]), "probation": 0.0001})
    assert host.timers[-1] == (0.0, "queued_reload")       # the queued HUP runs now


def test_a_new_worker_crashing_on_probation_rolls_back():
    gens, host, old, p = on_probation()
    old[1].proc = None                       # one of the kept workers exited meanwhile
    crashed = p.slots[0]
    crashed.life.handle(Event.EXITED)
    crashed.proc = None
    assert gens.on_failure(crashed, "exited with status 3 (crashed)", Outcome.CRASHED) is True
    assert gens.probation is None and gens.slots == old and gens.generation == 1
    assert all(s.retired for s in p.slots) and not any(s.retired for s in old)
    assert host.fed == [(p.slots[1], Event.DRAIN)]            # the other new one drains
    assert host.stood[-2:] == [(old[0], False), (old[1], False)]   # the old accepts again
    assert host.spawned[-1] is old[1]                          # the gone old one comes back
    assert (gens.reloads_failed, gens.rollbacks) == (1, 1)
    kind, ev = host.emitted[-1]
    assert kind == "reload_failed" and ev["rolled_back"] is True and ev["generation"] == 2
    assert ev["reason"].startswith("worker 2.0 exited with status 3 (crashed) ")
    assert ev["reason"].endswith("s into probation; rolled back")
    # the next attempt gets a number of its own
    assert gens.next_number() == 3


def test_a_planned_end_on_probation_is_no_failure():
    gens, host, old, p = on_probation()
    assert gens.on_failure(p.slots[0], "exited with status 0 (drained)", Outcome.DRAINED) is False
    assert gens.probation is not None


def test_a_refused_attempt_keeps_its_number():
    gens, host = serving(1)

    def bad():
        raise ValueError("nope")

    assert "generation 2" in gens.reload(bad, True)
    assert "generation 3" in gens.reload(bad, True)
    assert gens.next_number() == 4 and gens.generation == 1
