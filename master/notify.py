"""systemd `Type=notify`: the master tells systemd how the service is doing.

attach(sup) subscribes to the supervisor's events (master/events.py) when
NOTIFY_SOCKET is set, and says (sd_notify(3) keys):

    serving         READY=1, MAINPID=<pid>, STATUS=<worker counts>: only once every
                    worker of the first generation is READY (so `systemctl start`
                    returns when the service answers, not when the master was forked)
    ready (before)  STATUS=starting: K of N workers ready (a slow app import shows)
    reloading       RELOADING=1, MONOTONIC_USEC=<CLOCK_MONOTONIC in us>, STATUS=
                    (the notify-reload protocol: `systemctl reload` waits for...)
    reload_probation  STATUS=, READY=1, MAINPID=<pid>: the commit of a reload with
                    reload_probation (only the new code answers from here on)
    reload_ok       STATUS=, READY=1, MAINPID=<pid>
    reload_failed   STATUS=reload failed: <reason>; ..., READY=1, MAINPID=<pid>. A reload
                    refused before it started (a bad setting) said no RELOADING=1 yet:
                    that comes first, so a `Type=notify-reload` reload always gets its
                    RELOADING=1 ... READY=1 pair. systemd has no "reload failed" key:
                    the STATUS= says it (as HAProxy does)
    stopping        STOPPING=1, STATUS=; nothing but STATUS= after it

An upgrade (SIGUSR2) re-executes the master in place: the pid systemd knows
stays the main pid. NOTIFY_SOCKET stays in the master's environment (never
unset, unlike sd_notify(unset_environment=1)), so the new image attaches again
and its reload says RELOADING=1 ... READY=1 with the same MAINPID. Workers are
spawned without it (master/spawn.py): under NotifyAccess=main systemd would
drop what they send anyway, under NotifyAccess=all an app calling sd_notify
would speak for the whole service.

A send that fails (no socket there, refused, no room in systemd's queue
within a second) is logged once, and again only after a send worked in
between; it never reaches the supervisor (events.emit would log a traceback
per event otherwise).

Library choice: none; the protocol is the few lines of ipc/systemd.py
`notify` (one AF_UNIX SOCK_DGRAM datagram, '@' for the abstract namespace),
which sd_notify(3) declares stable and reimplementable without libsystemd.
Looked at: `sdnotify` (PyPI 0.3.2, last release 2017, unmaintained; does map
'@' to the abstract namespace, but connects once at construction and swallows
every error with a bare except, so a failure could be neither logged nor
retried) and `systemd-python` (235, 2023, maintained by the systemd project;
a C extension over libsystemd's sd_notify, so every install needs
libsystemd-dev, pkg-config and a compiler, a heavy build dependency for one
sendto; MONOTONIC_USEC and the rest are still ours to compose).
"""
from __future__ import annotations

import logging
import os
import time

from sockherd.ipc import systemd

log = logging.getLogger("sockherd.master")


def attach(sup) -> None:
    """Notify systemd of sup's life if NOTIFY_SOCKET is set; nothing otherwise."""
    value = os.environ.get(systemd.NOTIFY_VARIABLE)
    if not value:
        return
    try:
        systemd.notify_address(value)
    except ValueError as exc:
        log.error("systemd notify: %s: systemd will not hear from this master", exc)
        return
    sup.events.subscribe(Notifier(sup, value))


def _line(text: str) -> str:
    """One STATUS= value: a newline would start another key."""
    return " ".join(text.split())


def _counts(sup) -> dict[str, int]:
    from sockherd.master.inspect import snapshot

    out: dict[str, int] = {}
    for w in snapshot(sup)["workers"]:
        out[w["role"]] = out.get(w["role"], 0) + 1
    return out


def _draining(counts: dict[str, int]) -> str:
    n = counts.get("draining", 0) + counts.get("stopping", 0)
    return f", {n} draining" if n else ""


class Notifier:
    def __init__(self, sup, address: str) -> None:
        self.sup = sup
        self.address = address
        self.failing = False        # the last send failed (and that was said once)
        self.reloading = False      # RELOADING=1 said, READY=1 not yet
        self.stopped = False        # STOPPING=1 said: only STATUS= from now on

    def __call__(self, event: dict) -> None:
        try:
            lines = self._lines(event)
        except Exception:                             # noqa: BLE001 - never the master's end
            self._failed(f"cannot compose the message for {event.get('event')}",
                         exc_info=True)
            return
        for message in lines:
            self.send(message)

    def _lines(self, event: dict) -> list[list[str]]:
        """The datagrams (each a list of KEY=VALUE lines) an event makes."""
        kind, sup = event["event"], self.sup
        pid = f"MAINPID={os.getpid()}"
        if self.stopped:
            return []
        if kind == "ready" and not sup.announced:
            ready, total = _counts(sup).get("serving", 0), len(sup._active())
            # the last one: "serving" follows at once with READY=1
            return [[f"STATUS=starting: {ready} of {total} workers ready"]] \
                if ready < total else []
        if kind == "serving":
            return [["READY=1", pid, f"STATUS=serving: generation {event['generation']}, "
                                     f"{event['workers']} workers"]]
        if kind == "reloading":
            self.reloading = True
            c = _counts(sup)
            return [["RELOADING=1", _monotonic(),
                     f"STATUS=reloading: generation {event['generation']} starting "
                     f"({len(sup.pending.slots) if sup.pending else 0} workers); "
                     f"generation {sup.generation} serving "
                     f"({c.get('serving', 0)} workers)"]]
        if kind == "reload_probation":
            # the commit: only the new code answers; `systemctl reload` is
            # answered now, not after the probation (issue 36 §3)
            self.reloading = False
            c = _counts(sup)
            return [[f"STATUS=serving: generation {event['generation']}, "
                     f"{c.get('serving', 0)} workers (reloaded in {event['seconds']:g}s; on "
                     f"probation for {event['probation']:g}s, the previous generation standing "
                     f"by)", "READY=1", pid]]
        if kind == "reload_ok":
            self.reloading = False
            c = _counts(sup)
            return [[f"STATUS=serving: generation {event['generation']}, "
                     f"{c.get('serving', 0)} workers{_draining(c)} (reloaded in "
                     f"{event['seconds']:g}s)", "READY=1", pid]]
        if kind == "reload_failed":
            out = [] if self.reloading else [["RELOADING=1", _monotonic()]]
            self.reloading = False
            c = _counts(sup)
            return out + [[_line(f"STATUS=reload failed (generation {event['generation']}): "
                                 f"{event['reason']}; generation {sup.generation} serves on "
                                 f"({c.get('serving', 0)} workers)"), "READY=1", pid]]
        if kind == "stopping":
            self.stopped = True
            c = _counts(sup)
            what = "fast stop" if event["fast"] else "stopping"
            return [["STOPPING=1", f"STATUS={what}: {sum(c.values())} workers to end"]]
        return []

    def send(self, lines: list[str]) -> None:
        try:
            systemd.notify("\n".join(lines) + "\n", self.address)
        except (OSError, ValueError) as exc:
            self._failed(f"cannot notify systemd at {self.address}: {exc}")
            return
        if self.failing:
            self.failing = False
            log.info("systemd notify: %s answers again", self.address)

    def _failed(self, what: str, **kw) -> None:
        if self.failing:
            log.debug("systemd notify: %s", what, **kw)
            return
        self.failing = True
        log.warning("systemd notify: %s (said once: until a send works again, further "
                    "failures are not logged)", what, **kw)


def _monotonic() -> str:
    """MONOTONIC_USEC: CLOCK_MONOTONIC now, in microseconds (systemd compares it with
    the moment it asked for the reload)."""
    return f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}"
