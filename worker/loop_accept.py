"""Accepting: a listener's batch taken (fdcore's accept, or the native
engine's in one C call), each fd registered in the table as a connection of
the accepting thread, and what stops accepting for a while: an EMFILE/ENFILE
pause (every thread stops accepting for `emfile_pause` seconds instead of
spinning, logs once, resumes by itself) and max_connections (the cap).
Whether the listeners are polled at all is worker/gate.py's.

Listeners are inserted once per thread group (dup'ed numbers, CLONED,
EXCLUSIVE): only one idle thread is woken per new connection, and the thread
that accepted moves its registration to the end of the wait queue
(fdc_requeue), so connections go round-robin over the idle pollers.
Calls loop_core.py only.
"""
from __future__ import annotations

import errno
import os
import socket
import time

from sockherd.fdcore import Outcome
from sockherd.worker.gate import CAP, EMFILE
from sockherd.worker.loop_core import KIND_CONN, LoopCore, log
from sockherd.worker.stream import Connection, read_unread


class LoopAccept(LoopCore):
    """A listener's connections made the loop's (see the module)."""

    def _accept(self, th, lfd: int, relieved: bool) -> None:
        if time.monotonic() < self._accept_paused_until:
            return
        if self._standby_now and not self.gate.rescuing():
            # standing by: the listeners are the gate's to take from (its
            # accept-once, its rescue look), never a report in hand. One
            # read before a slow call took, after it, the queue of
            # connections made since the commit (50 reloads under load,
            # --threads 1: up to 1.96 s after the HUP); the transition if
            # its gate half has not run yet (loop_drain.py _standby_gate)
            if self._standby_made != self._standby_seq:
                self._standby_gate(True, self._standby_seq)
            return
        batch = self.accept_batch
        if self.max_connections:
            batch = min(batch, self.max_connections - len(self.conns))
            if batch <= 0:
                self._cap(th)
                return
        room = self.gate.room(batch)
        ahead = room == 0
        # ahead: this arrival's wake-up came to us: take it, then yield
        batch = 1 if ahead else room
        if self.engine is not None:
            self._accept_native(th, lfd, batch, ahead)
            return
        try:
            fds = th.accept(lfd, batch)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                self._pause_accepting(th, exc)
                return
            raise
        if fds and self.rotate_accept:
            self._requeue(th, lfd)
        if ahead:
            self.gate.balance_off(th)
        # the whole batch is in the table and in conns before any on_connect
        # runs: a slow one must not hide the others from a relieving sibling
        new = [conn for fd in fds if (conn := self._register(th, fd)) is not None]
        self.gate.publish()
        busy = self.relief.busy
        me = self._pos[th.tid]
        for conn in new:
            busy[me] = time.monotonic()
            if not relieved:
                conn.connect()
                continue
            # on_connect under the running bit, as any handler: a sibling
            # that took the connection meanwhile runs it itself, first
            outcome, gen = th.enter(conn.fd)
            if outcome is Outcome.DONE:
                if conn.th is th:
                    conn.connect()
                th.leave(conn.fd, gen)

    def _accept_native(self, th, lfd: int, batch: int, ahead: bool) -> None:
        """The engine's accept: the batch taken, registered and reading in
        one C call (its connections need no on_connect from here)."""
        try:
            n = self.engine.accept(self._pos[th.tid], lfd, batch, lfd in self.plain_listeners)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                self._pause_accepting(th, exc)
                return
            raise
        try:
            if n and self.rotate_accept:
                self._requeue(th, lfd)
            if ahead:
                self.gate.balance_off(th)
            self.gate.publish()
        finally:
            if n and self.engine.dispatch:
                # the app may run in here: the listener is done with first;
                # whatever happened there, what the first reads brought is
                # served (each such connection waits for it: engine_accept.c)
                self.engine.serve_accepted(self._pos[th.tid])

    def _requeue(self, th, lfd: int) -> None:
        """Moves th's own registration of the listener to the end of the
        listener's wait queue (fdcore requeue: DEL + ADD on th's epoll
        only), so the next connection wakes the idle poller that waited
        longest. Why: the kernel hands an EPOLLEXCLUSIVE listener's
        connection to the FIRST registered epoll that has an idle waiter, so
        under a light load one thread of one worker took every connection
        (measured: 200 of 200 kept-alive connections on one of 2 workers)
        while the others idled; with the GIL that is one core serving
        everything. Two epoll_ctl per accept batch buy round-robin over
        every thread of every worker."""
        try:
            th.requeue(lfd)
        except OSError as exc:
            # EPERM / EBADF: not held or deleted by a drain; anything else
            # is a failed re-registration, which the next poll reports
            # (FDC_POLL_CTL) like any other: not a reason to end this thread
            if exc.errno not in (errno.EPERM, errno.EBADF):
                log.warning("listener fd %d: re-registration failed: %s", lfd, exc.strerror)

    def _cap(self, th) -> None:
        if CAP not in self.gate.reasons:
            self.paused_cap += 1
            log.warning("%d connections open (max_connections): not accepting until one "
                        "closes", len(self.conns))
        self.gate.off(th, CAP)
        if len(self.conns) < self.max_connections:      # one closed meanwhile
            self.gate.on(th, CAP)

    def _pause_accepting(self, th, exc: OSError) -> None:
        self._accept_paused_until = time.monotonic() + self.emfile_pause
        self.paused_emfile += 1
        if not self._emfile_logged:
            self._emfile_logged = True
            log.warning("%s; not accepting for %.1fs (logged once)", exc.strerror,
                        self.emfile_pause)
        # th's own context: a verb may touch the caller's local update list,
        # so never another running thread's (any fd of any group is fine)
        self.gate.off(th, EMFILE)

    def _resume_accepting(self, th) -> int:
        """Poll timeout: -1, or until accepting resumes (any thread resumes it)."""
        until = self._accept_paused_until
        if not until:
            return -1
        left = until - time.monotonic()
        if left > 0:
            return max(1, int(left * 1000))
        self._accept_paused_until = 0.0
        self.gate.on(th, EMFILE)
        return -1

    def _register(self, th, fd: int) -> Connection | None:
        """An accepted fd into the table (owned by th) and into conns as a
        stream Connection; None if the table refused it (closed then)."""
        try:
            handler = self.handler_class()
        except BaseException as exc:  # noqa: BLE001 - contained: this connection ends
            # the app's code, as any handler method: it ends this connection
            # (a FIN, its input read first), never the loop thread (review)
            log.error("stream handler %s() failed (%s); closing the connection",
                      getattr(self.handler_class, "__name__", self.handler_class),
                      type(exc).__name__, exc_info=exc)
            read_unread(fd)
            os.close(fd)
            return None
        cookie = next(self._cookies)
        try:
            socket_opt_nodelay(fd)
            self.table.insert(fd, cookie, tgid=th.tgid, thread_mask=th.bit, kind=KIND_CONN,
                              accepted=True)
        except OSError:
            log.exception("cannot take connection fd %d", fd)
            os.close(fd)
            return None
        conn = Connection(self, th, fd, cookie, handler)
        self.conns[fd] = conn
        return conn


def socket_opt_nodelay(fd: int) -> None:
    s = socket.socket(fileno=fd)
    try:
        if s.family in (socket.AF_INET, socket.AF_INET6):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    finally:
        s.detach()
