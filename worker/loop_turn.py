"""A loop thread's body: its turn (poll, the connections' events, the
listeners, mail, timers, the drain step, the relief) run until stop(), or
as its asyncio loop's iterations for an ASGI app (worker/aio.py), and its
end when a bug of ours escapes (_ended: the worker drains and is replaced).

Each thread: poll (the update pass, epoll_wait with the GIL released, the
enter step, all in one C call) -> for a listener, accept a batch and insert
each connection owned by this thread (FDC_ACCEPTED: no probe syscall) -> for
a connection, its stream handler -> leave the whole batch in one C call.
There is no Python lock on this path: a connection is only touched by the
thread that owns it, and the fd -> connection dict is only changed by single
dict operations.

A handler may block (a database call): worker/relief.py moves the
connections with work waiting off a thread stuck in one handler. For that,
a thread with siblings in its group leaves its batch at once and enters each
fd again just before its handler; a thread alone in its group holds the
batch (one C call to leave it all).

Calls the parts below it: loop_drain.py (and through it loop_queued.py,
loop_accept.py), loop_timers.py, loop_core.py.
"""
from __future__ import annotations

import os
import time

from sockherd.fdcore import Outcome
from sockherd.worker.loop_core import KIND_AIO, KIND_LISTENER, _ms_until, _sooner, log
from sockherd.worker.loop_drain import LoopDrain
from sockherd.worker.loop_timers import LoopTimers


class LoopTurn(LoopDrain, LoopTimers):
    """What a loop thread runs (see the module)."""

    def _run(self, th) -> None:
        me = self._pos[th.tid]
        self.local.th = th
        if self.engine is not None:
            self.engine.bind(me)
        try:
            turn = self._turner(th, me)
            if self.asgi:
                # the thread's asyncio loop runs it: each of its iterations
                # is one turn (worker/aio.py; asyncio imported only for it)
                from sockherd.worker import aio
                aio.run(self, th, me, turn, self._aio_started[me].set)
            else:
                while not self._stopping:
                    turn(-1)
        except BaseException as exc:  # noqa: BLE001 - a loop thread's end, reported
            self._ended(th, me, exc)

    def _turner(self, th, me: int):
        """One turn of loop thread `me`'s body as a function of its own
        state: turn(wait_ms) polls at most wait_ms (-1: no bound of the
        caller's) and more only as the thread's own deadlines allow, runs
        what came (connections, listeners, mail, timers, the drain step, the
        relief), and returns the reports of the app's own fds (KIND_AIO,
        worker/aio.py), left already."""
        relief = self.relief
        busy = relief.busy
        relieved = relief.enabled and bool(relief.siblings(me))
        mail = self._mail[me]
        heap = self._timers[me]
        engine = self.engine
        asgi = self.asgi
        no_reports: list = []

        def turn(wait: int) -> list:
            app = no_reports
            # (the call only during a pause: a turn's cost, see _stopping)
            timeout = self._resume_accepting(th) if self._accept_paused_until else -1
            # asyncio's bound (aio.py); a WSGI turn has none. _sooner(wait,
            # timeout) inline: a call is ~250 instructions of an ASGI
            # request's turn (callgrind)
            if wait >= 0 and (timeout < 0 or wait < timeout):
                timeout = wait
            if self.gate.reasons:
                timeout = _sooner(timeout, self.gate.tick(th))
            # the drain's or the standby's step (None: neither; one read a turn)
            if self._step is not None:
                timeout = _sooner(timeout, self._step(th, me))
            if heap:
                timeout = _sooner(timeout, _ms_until(heap[0][0]))
            if engine is not None:
                # the connections' reports are handled in there; what
                # comes back is the listeners' (held, or left if relieved)
                # and the app's own fds' (asgi)
                handled, events = engine.turn(me, timeout, relieved)
                if handled:
                    relief.activity += 1
                if events and asgi:
                    app = [ev for ev in events if ev.kind == KIND_AIO]
                    if app:
                        if not relieved:
                            for ev in app:       # asyncio's now: held by no one
                                th.leave(ev.fd, ev.gen)
                        events = [ev for ev in events if ev.kind != KIND_AIO]
                if events:
                    relief.activity += 1
                    self._enter_app(me)
                    if relieved:
                        self._dispatch_entering(th, me, events)
                    else:
                        try:
                            self._dispatch_held(th, me, events)
                        finally:
                            for ev in events:
                                th.leave(ev.fd, ev.gen)
                    busy[me] = 0.0
            else:
                events = th.poll(timeout)
                if events:
                    relief.activity += 1
                    self._enter_app(me)
                    if relieved:
                        th.leave_all()       # siblings may take what we have not reached
                        self._dispatch_entering(th, me, events)
                    else:
                        self._dispatch_held(th, me, events)
                        th.leave_all()
                    busy[me] = 0.0
            if mail:
                self._enter_app(me)
                while mail:
                    fn, args = mail.popleft()
                    fn(*args)
                busy[me] = 0.0
            if heap and heap[0][0] <= time.monotonic():
                self._fire_timers(th, me, heap)
            if relief.asked[me] is not None:
                relief.take_from(th, me)
            return app

        return turn

    def _dispatch_held(self, th, me: int, events) -> None:
        """A batch whose fds th holds until the caller leaves them all."""
        busy = self.relief.busy
        clock = time.monotonic
        conns = self.conns
        for ev in events:
            busy[me] = clock()
            if ev.kind == KIND_LISTENER:
                self._accept(th, ev.fd, False)
                continue
            conn = conns.get(ev.fd)
            if conn is not None and conn.cookie == ev.owner and conn.th is th:
                conn.on_events(ev.events)

    def _dispatch_entering(self, th, me: int, events) -> None:
        """A batch already left: each fd is entered again right before its
        handler, and skipped if a sibling took it meanwhile (or it closed)."""
        busy = self.relief.busy
        clock = time.monotonic
        conns = self.conns
        done = Outcome.DONE
        for ev in events:
            busy[me] = clock()
            conn = None
            if ev.kind != KIND_LISTENER:
                conn = conns.get(ev.fd)
                if conn is None or conn.cookie != ev.owner or conn.th is not th:
                    continue
            outcome, gen = th.enter(ev.fd)
            if outcome is not done:
                continue
            if gen == ev.gen:                    # else a new incarnation: not this report's
                if conn is None:
                    self._accept(th, ev.fd, True)
                elif conn.th is th:
                    conn.on_events(ev.events)
            th.leave(ev.fd, gen)

    def _ended(self, th, me: int, exc: BaseException) -> None:
        """Loop thread `me` ends (a bug of ours: the app's errors are
        contained before they get here). What it owned is nobody's now:
        its batch is left and its connections closed, so their clients see
        an end instead of waiting forever (a request in flight on it is
        lost; the other threads' are not). Then the main thread is told
        (failed_fd): it stops accepting, drains and exits to be replaced."""
        self.errors.append(exc)
        with self._posted_lock:
            self.ended.add(me)
            # connections posted to us that we will never adopt: to a live
            # sibling (the drain waits for them; found by a CI run where one
            # waited out the whole drain deadline in a dead thread's mail)
            # (refuse_posted may have taken them already: not in _posted then)
            mail, woken = self._mail[me], set()
            while mail:                      # popleft: others may append meanwhile
                fn, args = mail.popleft()
                if fn == self._adopt_posted and args[1] in self._posted:
                    woken.add(self._mail_posted(args[1]))
        for pos in woken - {None}:
            self.table.wake(self.loop_threads[pos].tid)
        self.relief.busy[me] = 0.0
        # never picked by the watchdog as the idle sibling to relieve another
        # (a non-None ask is one in progress): nobody would ever take it
        self.relief.asked[me] = me
        log.critical("loop thread %d ended (%s), %d of %d left: this worker stops accepting, "
                     "drains and exits to be replaced", th.tid, type(exc).__name__,
                     self.threads_alive, len(self.loop_threads), exc_info=exc)
        try:
            th.leave_all()
            for conn in [c for c in list(self.conns.values()) if c.th is th]:
                conn._close_now()
        except BaseException:  # noqa: BLE001 - the main thread must still be told
            log.exception("loop thread %d: closing its connections failed", th.tid)
        finally:
            os.eventfd_write(self.failed_fd, 1)
