"""Probation: a committed reload's previous generation kept in reserve.

A new generation that reports READY can still be broken: an app that
crashes on its first request, a leak that kills it a second later (issue
19 §7: the old generation drained at the commit, every new worker crashed
again on each respawn, and the service was gone). So for `reload_probation`
seconds after the commit the previous generation is kept, and a new worker
that exits unplanned in that window (crashed, killed for a lost heartbeat,
failed on its respawn, or could not be spawned) rolls the reload back.

How the previous generation is "kept": it goes on serving, accepting on the
same listeners alongside the new one, and is told to drain only once
probation passes. The alternatives were worse by the DESIGN contract (§3:
no connection refused or reset across a reload). Draining it at the commit
and respawning it on a rollback leaves only the failing generation serving
until the respawned workers import and report READY. Deleting its listeners
at the commit and inserting them again on a rollback needs an "undrain" the
worker does not have (a drain is one-way: the listener fds are DEL'ed from
every epoll and closed, seed 004) and a new message to carry the fds back:
new, untested paths in exactly the moment things go wrong. Keeping it
serving needs nothing new in the worker: a rollback is the ordinary drain,
of the new generation instead of the old. What it costs: for the window,
both versions answer requests (as in any rolling deploy), and both
generations' memory is in use. The contract's "old workers drain only once
every new worker is READY" still holds; they drain later, not sooner.

One unplanned exit is enough to roll back: the previous generation is known
to serve, so a rollback costs only the deploy, while waiting for a second
crash costs the requests in flight on it. A planned end (a drain asked for,
a max_requests replacement) is no failure.

Pure: the Probation record and the decisions on it; generations.py carries
them out (tests/master/test_generations.py, and test_reload_probation.py on
a real master).
"""
from __future__ import annotations

from dataclasses import dataclass

from sockherd.master.lifecycle import Outcome


@dataclass
class Probation:
    """A committed reload's new generation on probation, and the previous
    generation kept serving (with what it runs with) until it passes."""
    generation: int                  # the new one, serving on probation
    previous: int                    # the one kept in reserve
    slots: list                      # the previous generation's slots
    settings: object
    config: dict
    listeners: list
    until: float                     # monotonic: probation passes then
    took: float                      # seconds the new generation took to be READY
    seconds: float                   # its length (reload_probation)
    started: float = 0.0             # monotonic: the commit

    def left(self, now: float) -> float:
        return max(0.0, self.until - now)


def fails(outcome: Outcome | None) -> bool:
    """Whether a new worker's end in probation rolls the reload back:
    every end but a planned one (told to drain)."""
    return outcome is not Outcome.DRAINED


def refusal(probation: Probation | None, now: float) -> str:
    """Why a reload, an upgrade or a scaling cannot begin now because of a
    probation under way ("" if none is)."""
    if probation is None:
        return ""
    return (f"generation {probation.generation} is on probation ({probation.left(now):.0f}s "
            f"left; generation {probation.previous} is kept until then)")
