"""Probation: a committed reload's previous generation kept in reserve.

A new generation that reports READY can still be broken: an app that
crashes on its first request, a leak that kills it a second later (issue
19 §7: the old generation drained at the commit, every new worker crashed
again on each respawn, and the service was gone). So for `reload_probation`
seconds after the commit the previous generation is kept, and a new worker
that exits unplanned in that window (crashed, killed for a lost heartbeat,
failed on its respawn, or could not be spawned) rolls the reload back.

How the previous generation is "kept": it stands by (issue 36 §3). At the
commit each of its workers is told (ipc Standby) to stop accepting: its
listeners stay open in it but are not polled (worker/gate.py STANDBY), so
the new generation alone takes new connections; its responses say
Connection: close and its idle kept-alive connections are closed after the
idle grace, so their clients reconnect to the new code; what is in flight
finishes, WebSockets included. A rollback tells it to accept again (the
same listeners, polled again: nothing was deleted), then drains the new
generation. Before, it went on serving beside the new one for the whole
window: a HUP after an edit got 6 old answers of 10, and `--reload` served
a saved edit half the time. Draining it at the commit and respawning it on
a rollback would leave only the failing generation serving until the
respawned workers are READY; deleting its listeners (a drain) cannot be
undone (the fds are DEL'ed from every epoll and closed, seed 004). What
standing by costs: both generations' memory for the window; a connection
whose wake-up reached an old poller just as it stopped is answered by the
old code (worker/gate.py standby_tick: it polls for one 50 ms look, within
the standby's first 0.4 s, so what arrives in that look is the old code's
too); past that window every new connection is the new generation's. The contract's "old workers
drain only once every new worker is READY" still holds; they drain later.

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
    generation standing by (with what it runs with) until it passes."""
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
