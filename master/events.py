"""What happens to the master's workers and generations, as events.

The supervisor says what happened once, here; the subscribers decide what
to do with it: the control channel publishes it (`sockherd ctl watch`),
systemd is notified (master/notify.py), the metrics count it. An event is
a flat dict: {"event": kind, "time": unix seconds, ...fields}; the kinds
and their fields are listed in KINDS (the watch output and the tests read
that list, so a new kind is declared here first).
"""
from __future__ import annotations

import logging
import time
from typing import Callable

log = logging.getLogger("sockherd.master")

KINDS = {
    "spawned": ("worker", "pid"),
    "ready": ("worker", "pid"),
    "draining": ("worker", "pid"),
    "exited": ("worker", "pid", "status", "outcome"),
    "serving": ("generation", "workers"),           # the first generation is READY
    "reloading": ("generation",),
    # a reload is over: its new generation serves (probation: the seconds it
    # served beside the previous one first; 0 without), or it failed (refused
    # before its commit, or rolled back: a new worker failed on probation)
    "reload_ok": ("generation", "seconds", "probation"),
    "reload_failed": ("generation", "reason", "rolled_back"),
    # the new generation is READY and serves, the previous one beside it
    # until probation ends (master/probation.py)
    "reload_probation": ("generation", "seconds", "probation"),
    # a HUP during a reload: it runs once that one is over
    "reload_queued": ("reason",),
    # a reload refused before any generation started (the first one not
    # ready yet, another still starting, a stop under way): no generation
    "reload_refused": ("reason",),
    "upgrading": ("python",),
    # refused, or its exec failed (this image carries on), or the new image
    # failed after the exec and this one came back (master/comeback.py)
    "upgrade_failed": ("reason",),
    "stopping": ("fast",),
}


class Events:
    def __init__(self) -> None:
        self._subscribers: list[Callable[[dict], None]] = []

    def subscribe(self, fn: Callable[[dict], None]) -> None:
        self._subscribers.append(fn)

    def unsubscribe(self, fn: Callable[[dict], None]) -> None:
        if fn in self._subscribers:
            self._subscribers.remove(fn)

    def emit(self, kind: str, **fields) -> None:
        """Tells every subscriber; one that raises is logged and skipped
        (an event's consumer never takes the supervisor down)."""
        assert kind in KINDS and set(fields) == set(KINDS[kind]), (kind, fields)
        event = {"event": kind, "time": round(time.time(), 6), **fields}
        for fn in list(self._subscribers):       # one may unsubscribe itself
            try:
                fn(event)
            except Exception:                      # noqa: BLE001 - logged, never fatal
                log.exception("event subscriber %r failed on %s", fn, kind)
