"""The drain: accepting stops (every listener deleted through fdcore), the
connections finish, and each is closed once it stayed idle for the grace;
`drained` is set once none remains. drain() is the worker's main thread's;
each draining loop thread's turn runs _drain_step. Calls loop_queued.py
(the listeners' queued connections) and the parts below it.
"""
from __future__ import annotations

import os
import select
import time

from sockherd.fdcore import Outcome
from sockherd.worker.loop_core import _sooner, log
from sockherd.worker.loop_queued import LoopQueued
from sockherd.worker.stream import Connection, ready_now


class LoopDrain(LoopQueued):
    """Stopping to accept, and closing the idle connections (see the module)."""

    def drain(self, idle_grace: float) -> None:
        """Stops accepting (every listener deleted through fdcore, so each is
        DEL'ed from every thread's epoll before its close: seed 004), lets
        connections finish, and closes a connection once it stayed idle for
        idle_grace seconds (a client may be sending on it right now: cutting
        an idle connection at once is the reset nginx and HAProxy users see
        on reload). `drained` is set once none remains. The thread that owns
        the control context if there is one (it deletes the listeners with
        it), else any thread."""
        self._not_from_a_loop_thread("drain")
        self.idle_grace = idle_grace
        # a standby's end: its listeners' queues hold only what came for the
        # new generation since (gate.stood_by), and taking that would have
        # the old code answer connections made after the commit (bench
        # reload_under_load: old code answered 10 s after the HUP, at the
        # probation's end); otherwise what a wake-up of ours left is ours
        # a standby whose gate half no loop thread made yet (the only one,
        # or every one, in the app since: none of ours is asleep in a poll,
        # no wake-up can be lost with us) stood by too: its queue is the
        # new generation's; swept, it waited behind the slow call (old code
        # answering 1.5 s after the new's first, or a 503). The engine keeps
        # no busy stamps for a single thread: not asleep, or it had made it
        alive = [i for i in range(len(self.loop_threads)) if i not in self.ended]
        pending = self._standby_now and self._standby_made != self._standby_seq and (
            len(alive) == 1 or all(self.relief.busy[i] for i in alive))
        self._sweep = not (self.gate.stood_by() or pending)
        if self.engine is not None:
            self.engine.draining = True          # responses carry Connection: close
        self.gate.leave_board()
        if self.control is not None and self._listeners_deleted.acquire(blocking=False):
            self._delete_listeners(self.control, drain=self._sweep)
            self._take_queued()
        self._draining_now = True
        self._step = self._drain_step
        self._draining.set()
        for th in self.loop_threads:
            self.table.wake(th.tid)

    def _delete_listeners(self, th, *, drain: bool = False) -> None:
        """Deletes the listeners (any thread may delete any fd; deferred to
        a thread still inside one, accepting). With drain: a dup of each is
        kept until the delete is complete, then its queue is emptied here
        (_accept_stragglers): a listener is polled EXCLUSIVE, and a
        connection whose wake-up went to one of our pollers just before the
        delete would wait, unaccepted, for the next one to arrive (review:
        at a reload's commit, two idle new workers and one queued client)."""
        for fd in list(self.listeners):
            if drain:
                try:
                    self._stragglers.append((os.dup(fd), fd, self.table.dump(fd).generation))
                except OSError as exc:
                    log.warning("listener fd %d: cannot keep it to empty its queue: %s", fd,
                                exc.strerror)
            th.delete(fd)
        self.listeners.clear()

    def _drain_step(self, th, me: int) -> int:
        """A draining thread's turn: delete the listeners (the first thread to
        get here), close its own connections idle for the grace, and return
        the poll timeout until its next idle deadline (-1: none left). A
        connection with a request waiting (readable now: it arrived while this
        thread was busy elsewhere) is not idle, whatever its last event says."""
        if self._listeners_deleted.acquire(blocking=False):
            self._delete_listeners(th, drain=self._sweep)
        straggling = self._accept_stragglers(th, me) if self._stragglers else -1
        mine = [c for c in list(self.conns.values()) if c.th is th]
        if self._tells_drain:
            self._tell_drain(th, me, mine)
        idle = self._close_idle(me, mine)
        if not self.conns and not self._stragglers and not self._posted and not self._adopting \
                and not self.drained.is_set():
            self.drained.set()
            os.eventfd_write(self.drained_fd, 1)
        return _sooner(straggling, idle)

    # ---- standing by (a reload's previous generation on probation) ----------------------
    def standby(self, on: bool, idle_grace: float | None = None) -> None:
        """on: accepting stops (the gate's STANDBY: the listeners kept, not
        polled, so the new generation alone takes new connections), each
        response says Connection: close and a connection idle for the grace
        is closed, so its client reconnects to the new generation; what is
        in flight finishes. off: accepting again (a rollback), as before.
        Unlike drain() nothing is deleted: off undoes on. The worker's main
        thread's; ignored while draining."""
        self._not_from_a_loop_thread("standby")
        if self.draining or on == self._standby_now:
            return
        self._standby_now = on
        self._step = self._standby_step if on else None
        if idle_grace is not None:
            self.idle_grace = idle_grace         # the settings' (drain() sets it too)
        if self.engine is not None:
            self.engine.draining = on            # Connection: close while standing by
        if on:
            self.gate.leave_board()              # the new workers do not wait for us
        # the gate's half to every loop thread: the first to turn makes the
        # transition, the others find it made (a single thread chosen
        # could be in a slow app call: the half ran when it ended, late)
        with self._standby_lock:
            self._standby_seq += 1
            seq = self._standby_seq
        for i in range(len(self.loop_threads)):
            if i not in self.ended:
                self._mail[i].append((self._standby_gate, (on, seq)))
        for th in self.loop_threads:
            self.table.wake(th.tid)

    def _standby_gate(self, on: bool, seq: int) -> None:
        """The gate's half of standby() number seq, on a loop thread (its
        verbs need one's context): made once, by the first thread to get
        here; a later standby() (seq) supersedes it."""
        th = self.local.th
        with self._standby_lock:
            if seq != self._standby_seq or self._standby_made == seq \
                    or on != self._standby_now:
                return
            self._standby_made = seq
            me = self._pos[th.tid]
            # a sibling that may be asleep in its poll now (not in the app)
            awake = any(not self.relief.busy[i] for i in range(len(self.loop_threads))
                        if i != me and i not in self.ended)
        if not on:
            self.gate.standby_on(th)
            return
        # a wake-up is lost only to a sibling asleep in its poll as polling
        # goes off (gate.standby_tick): none with one thread, nor when the
        # others are all in the app. Then the HTTP engine takes what is
        # queued at this instant, once (connections made before we stood
        # by; one whose wake-up a sibling lost is among them); a stream
        # protocol keeps the gate's rescue window instead. Under load that
        # window's "queued over two checks" was nearly always true: old
        # code answered connections made 0.5 s after the commit
        # (reload_under_load, --threads 4)
        self.gate.standby_off(th, rescue=awake and self.engine is None)
        if awake and self.engine is not None:
            for lfd in list(self.listeners):
                self._accept_native(th, lfd, self.accept_batch, False)

    def _standby_step(self, th, me: int) -> int:
        """A standing-by thread's turn: its connections idle for the grace
        closed; the poll timeout until the next deadline (-1: none)."""
        tick = self.gate.standby_tick(th)
        if self.engine is None:
            return tick                  # a stream protocol's connections are its own
        mine = [c for c in list(self.conns.values()) if c.th is th]
        return _sooner(self._close_idle(me, mine), tick)

    def _close_idle(self, me: int, mine: list) -> int:
        """Closes those of mine idle for idle_grace; the poll timeout until
        the next one is due (-1: none)."""
        now = time.monotonic()
        due_now, next_due = [], None
        for conn in mine:
            due = conn.last_active + self.idle_grace
            if conn.pending or getattr(conn, "buffering", False):
                # not idle while a request body arrives (its body timer
                # ends a stalled one) nor while output waits, and no
                # deadline to wake for: its flush (its body's read) is an event (a turn, this step again) that moves
                # last_active; one past due here asked poll for 1 ms waits,
                # a spin until the client read (review)
                continue
            if due <= now:
                due_now.append(conn)
            else:
                next_due = due if next_due is None else min(next_due, due)
        if due_now:
            # (a stream connection's input at its end is always readable: not
            # a request waiting; conns also holds the HTTP engine's, which
            # have no input_ended)
            waiting = ready_now({c.fd: select.POLLIN for c in due_now
                                 if not getattr(c, "input_ended", False)})
            self._enter_app(me)                  # on_close is app code: watched too
            for conn in due_now:
                if conn.fd in waiting:
                    conn.last_active = now
                    due = now + self.idle_grace
                    next_due = due if next_due is None else min(next_due, due)
                else:
                    conn.close()
            self.relief.busy[me] = 0.0
        return -1 if next_due is None else max(1, int((next_due - now) * 1000) + 1)

    def _tell_drain(self, th, me: int, mine: list[Connection]) -> None:
        """on_drain, once, to each of th's connections not told yet (one
        that connects while draining is told by its connect()), under the
        fd's running bit like any handler."""
        for conn in mine:
            if conn.told_drain or not conn.connected or conn.closed:
                continue
            outcome, gen = th.enter(conn.fd)
            if outcome is not Outcome.DONE:
                continue
            try:
                if conn.th is th:
                    self._enter_app(me)
                    conn.tell_drain()
                    self.relief.busy[me] = 0.0
            finally:
                th.leave(conn.fd, gen)
