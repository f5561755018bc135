"""libzmq's own accepts kept off EMFILE (issue 19, finding 3).

libzmq accepts control clients and event subscribers in its I/O thread and
aborts the process when that accept meets EMFILE (master/fdbudget.py). What
the master accepts itself stops at its floor; what libzmq accepts cannot be
stopped one connection at a time: a process of our user opening
connections to the control socket (they need not even speak ZMTP: libzmq
holds them for its 30 s handshake interval) would fill the table on its
own, and so would anything else the floors do not cover.

So the guard watches the control sockets' accepts (a ZeroMQ socket
monitor: EVENT_ACCEPTED wakes the master's loop and counts one fd taken,
EVENT_DISCONNECTED one given back) and checks the free fds
at every one and at every turn of the loop: below its floor it unbinds
both endpoints (libzmq closes its listening sockets and the connections
accepted through them: nothing more is accepted, a flood's fds come back;
a `ctl` request in flight then gets no answer), and binds them again once
fdbudget's control_again are free (looked at every RECHECK seconds
meanwhile). While unbound, `sockherd ctl` finds nobody, which beats an
abort. The floor is a 16th of the table: what libzmq accepts between the
accept that crosses it and the unbind must fit in it (fdbudget.Floors).

The monitor sockets live in the control server's ZeroMQ context: it closes
them with its own sockets (control.monitors), before terminating the
context, which would otherwise wait for them for ever.
"""
from __future__ import annotations

import logging
import os
import selectors
import time

import zmq

from sockherd.master.fdbudget import BUDGET

log = logging.getLogger("sockherd.master")

RECHECK = 0.25               # seconds between looks while unbound


class ControlGuard:
    """An extra of the supervisor's (add_extra), beside the control server."""

    def __init__(self, sup, control):
        self.sup, self.control = sup, control
        self._watched = None                 # the router whose accepts are watched
        self._monitors: list[zmq.Socket] = []
        self._fds: list[int] = []
        self.unbound = False

    # ---- the supervisor's extra interface ---------------------------------------------------
    def fds(self) -> list[int]:
        return []                            # the monitors' fds: registered by _watch()

    def next_deadline(self) -> float | None:
        return time.monotonic() + RECHECK if self.unbound else None

    def poll(self) -> None:
        self._watch()
        if self.control.router is None:
            return
        floors = BUDGET.floors()
        for mon in self._monitors:
            try:
                while mon.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    event = mon.recv_multipart(zmq.NOBLOCK)
                    kind = int.from_bytes(event[0][:2], "little")
                    if kind == zmq.EVENT_ACCEPTED:
                        BUDGET.taken()              # a connection: one fd more
                    elif kind == zmq.EVENT_DISCONNECTED:
                        BUDGET.given()
                    # at each one: a flood's events come as fast as they are read
                    if not self.unbound and not BUDGET.free_at_least(floors.control):
                        self._unbind(floors.control)
            except zmq.ZMQError:
                pass
        if not self.unbound and not BUDGET.free_at_least(floors.control):
            self._unbind(floors.control)
        elif self.unbound and BUDGET.free_at_least(floors.control_again):
            self._bind()

    def close(self) -> None:
        self._unregister()
        self._monitors = []                  # closed by the control server

    # ---- inside ---------------------------------------------------------------------------
    def _endpoints(self):
        c = self.control
        return ((c.router, c.endpoint), (c.pub, c.events_at))

    def _unbind(self, floor: int) -> None:
        for sock, endpoint in self._endpoints():
            try:
                sock.unbind(endpoint)
            except zmq.ZMQError as exc:
                log.debug("control: unbind %s: %s", endpoint, exc)
        self.unbound = True
        log.warning("control: fewer than %d fds free: not accepting control clients until "
                    "there are (ZeroMQ would abort the master at EMFILE)", floor)

    def _bind(self) -> None:
        for sock, endpoint in self._endpoints():
            try:
                sock.bind(endpoint)
            except zmq.ZMQError as exc:
                log.error("control: binding %s again: %s; tried again in %gs", endpoint, exc,
                          RECHECK)
                return
            if endpoint.startswith("ipc://"):
                os.chmod(endpoint[len("ipc://"):], 0o600)
        self.unbound = False
        log.info("control: accepting control clients again")

    def _watch(self) -> None:
        """Monitors on the control server's current sockets (it makes new
        ones after a failed exec, and binds late during a takeover)."""
        c = self.control
        if c.router is self._watched:
            return
        self._unregister()
        self._monitors, self._watched, self.unbound = [], c.router, False
        if c.router is None:
            return
        for sock in (c.router, c.pub):
            mon = sock.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
            mon.linger = 0
            c.monitors.append(mon)
            self._monitors.append(mon)
            fd = mon.getsockopt(zmq.FD)
            self.sup.sel.register(fd, selectors.EVENT_READ, ("extra", fd))
            self._fds.append(fd)

    def _unregister(self) -> None:
        for fd in self._fds:
            try:
                self.sup.sel.unregister(fd)
            except (KeyError, ValueError):
                pass
        self._fds = []


def attach(sup) -> None:
    """Guards sup.control (if any): called right after control.attach."""
    if sup.control is not None:
        guard = ControlGuard(sup, sup.control)
        sup.add_extra(guard)
        guard.poll()
