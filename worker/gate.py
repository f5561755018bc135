"""Whether a worker's threads poll its listeners, and the balance between
workers.

The listeners are polled unless some reason holds: an ASGI app's lifespan
startup not over yet, an EMFILE pause, the connection cap (max_connections),
or the balance (this worker is ahead of
the least loaded other worker: worker/board.py). Turning polling off or on
is an fd-level verb (stop_recv / want_recv), so every thread of the worker
follows; it happens on transitions only, under a lock (reasons come and go
from any loop thread).

The balance: a worker whose open connections exceed the least loaded other
serving worker's by more than 2 + its count / 8 stops polling; the others,
asleep on the shared listener, are woken by the next arrivals. It polls
again as soon as it is not ahead (checked when one of its connections
closes, and by a timer of the thread that turned it off). That timer also
covers connections already queued when it stopped (their wake-ups went to
it): when an accept queue stays non-empty over two checks (TCP_INFO of each
listening socket: nobody takes them), it polls again whatever the counts.
Any loop thread runs a check that is late (its thread may be in a slow
handler). The timer backs off from 5 ms to 1 s while the queues are empty:
a worker that stays ahead with idle connections wakes about once a second
(each of its loop threads, at most, when one is busy).
"""
from __future__ import annotations

import errno
import os
import socket
import struct
import threading
import time

EMFILE, CAP, BALANCE = "emfile", "cap", "balance"
STARTUP = "startup"        # an ASGI app's lifespan startup is not over (worker/bootstrap.py)
STANDBY = "standby"        # a reload's previous generation on probation (loop_drain.py)
STANDBY_CHECK = 0.05       # s between two looks at the accept queue while standing by
STANDBY_LOOKS = 8          # the rescue window: STANDBY_LOOKS * STANDBY_CHECK s after it began
TICK_SLACK = 0.05          # s after which any loop thread runs a late balance check


class Gate:
    def __init__(self, loop):
        self.loop = loop
        self.reasons: set[str] = set()
        self._lock = threading.Lock()
        # the balance (None: no board, a single worker or the stream tests)
        self.board = None
        self.index = 0
        self.upto = 0
        self._check_at = 0.0
        self._step = 0.005
        self._strikes = 0
        self._ticker = -1                 # tid of the thread that runs the check
        self._standby_check = 0.0         # standby_tick's next look
        self._standby_strikes = 0
        self._standby_until = 0.0         # the end of its rescue window
        self._standby_began = False       # standby_off ran (the transition is made)

    # ---- polling on and off ----------------------------------------------------------
    def off(self, th, reason: str) -> None:
        with self._lock:
            if reason in self.reasons:
                return
            first = not self.reasons
            self.reasons.add(reason)
            if first:
                self._each_listener(th.stop_recv)

    def on(self, th, reason: str) -> None:
        with self._lock:
            if reason not in self.reasons:
                return
            self.reasons.discard(reason)
            if not self.reasons:
                self._each_listener(th.want_recv)

    def _each_listener(self, verb) -> None:
        for fd in list(self.loop.listeners):        # a copy: a drain may empty it
            try:
                verb(fd)
            except OSError as exc:
                if exc.errno != errno.EBADF:         # deleted by a drain meanwhile
                    raise

    # ---- the balance -----------------------------------------------------------------
    def publish(self) -> None:
        """This worker's count on the board (after every accept and close)."""
        if self.board is not None and not self.loop.draining and not self.loop.standing_by:
            self.board.slots[self.index] = len(self.loop.conns)

    # ---- standing by (worker/loop_drain.py standby) -------------------------------------
    def standby_off(self, th, rescue: bool = True) -> None:
        """Polling off for a standby; its check (standby_tick) starts.
        rescue False: no rescue window (a worker of one loop thread: the
        thread turning polling off is the only poller, awake, and accepts
        whatever its poll already reported; no wake-up can be lost)."""
        self._standby_strikes = 0
        now = time.monotonic()
        self._standby_check = now + STANDBY_CHECK
        self._standby_until = now + (STANDBY_LOOKS * STANDBY_CHECK if rescue else 0.0)
        self._standby_began = True
        self.off(th, STANDBY)

    def standby_on(self, th) -> None:
        """The standby is over (a rollback): polling on, our count back on
        the board."""
        self._standby_began = False
        self.on(th, STANDBY)
        self.publish()

    def rescuing(self) -> bool:
        """A rescue look is on (standby_tick polled again for one look)."""
        return self._standby_began and STANDBY not in self.reasons

    def stood_by(self) -> bool:
        """Standing by with every rescue look over: none of our pollers has
        been on the listeners since, so no wake-up can be lost with us and
        whatever is queued is the new generation's (a drain then takes
        none of it: loop_drain.py). A plain read, from any thread."""
        return STANDBY in self.reasons and time.monotonic() >= self._standby_until

    def standby_tick(self, th) -> int:
        """While standing by, every STANDBY_CHECK s: a connection whose
        wake-up came to one of our pollers just before polling stopped
        waits in the accept queue for the next arrival (the listener is
        polled EXCLUSIVE: the others are not woken for it). Queued over two
        checks, nobody takes it: we poll again for one look (it is answered
        by this generation, with Connection: close, as may be what arrives
        in that look). A unix socket's queue cannot be seen: never. The
        poll timeout in ms.

        Only within the window's STANDBY_LOOKS * STANDBY_CHECK s after the
        standby began (issue 36 review), in time, not in looks: a wake-up
        is lost only at the transition (an EPOLLEXCLUSIVE wake-up goes to a
        poller with a thread waiting in it; one of ours busy in the app
        took none); later our pollers are not on the listener, every
        arrival wakes the new generation's, and a queue that stays is
        theirs (busy, at their cap). Counted in looks, a thread that was 3
        s in a slow app took its looks after it, and the old code answered
        connections made 1.5 s after the commit (reload_under_load). -1
        once the window is over and polling is off."""
        now = time.monotonic()
        if not self._standby_began:
            # the transition is standby_off's alone (loop_drain.py
            # _standby_gate: its rescue decided there); a tick before it
            # that turned polling off unmarked let a late gate half take
            # connections made seconds after the standby (review 4)
            return int(STANDBY_CHECK * 1000)
        if STANDBY in self.reasons and now >= self._standby_until:
            return -1
        if now < self._standby_check:
            return max(1, int((self._standby_check - now) * 1000))
        self._standby_check = now + STANDBY_CHECK
        if STANDBY not in self.reasons:
            # polled for one look (a rescue): off again whatever is queued
            # now; under load the queue is rarely empty, and waiting for an
            # empty one kept this generation accepting for good (CI, 3.13)
            self._standby_strikes = 0
            self.off(th, STANDBY)
            return int(STANDBY_CHECK * 1000)
        queued = self._accept_queue() or 0
        self._standby_strikes = self._standby_strikes + 1 if queued else 0
        if self._standby_strikes >= 2 and now < self._standby_until:
            self.on(th, STANDBY)
        return int(STANDBY_CHECK * 1000)

    def leave_board(self) -> None:
        """Draining: not serving any more (others stop comparing with us)."""
        if self.board is not None:
            self.board.slots[self.index] = -1

    def room(self, batch: int) -> int:
        """How many connections to accept now: up to batch, but not past
        being ahead (0: ahead already). A batch accepts until EAGAIN, so
        without this cap the first worker to wake took a whole burst."""
        if self.board is None:
            return batch
        least = self.board.least_other(self.index, self.upto)
        if least is None:
            return batch
        mine = len(self.loop.conns)
        return max(0, min(batch, least + 3 + mine // 8 - mine))

    def ahead(self) -> bool:
        return self.room(1) == 0

    def balance_off(self, th) -> None:
        self._ticker = th.tid
        self._step = 0.005
        self._strikes = 0
        self._check_at = time.monotonic() + self._step
        self.off(th, BALANCE)

    def maybe_balance_on(self, th) -> None:
        if BALANCE in self.reasons and not self.ahead():
            self.on(th, BALANCE)

    def tick(self, th) -> int:
        """A loop thread's poll timeout in ms (-1: none), after running the
        check when it is due. The thread that turned polling off runs it;
        any other runs it TICK_SLACK later if that one is stuck in a slow
        handler (review finding 2); whoever runs it first claims it."""
        if BALANCE not in self.reasons:
            return -1
        if self.loop.draining:                   # no listener left to poll
            with self._lock:
                self.reasons.discard(BALANCE)
            return -1
        now = time.monotonic()
        due = self._check_at + (0.0 if th.tid == self._ticker else TICK_SLACK)
        if now < due:
            return max(1, int((due - now) * 1000))
        with self._lock:
            if now < self._check_at:             # another thread just ran it
                return max(1, int((self._check_at - now) * 1000))
            self._ticker = th.tid
            self._check_at = now + 3600.0        # claimed while we look
        if not self.ahead():
            self.on(th, BALANCE)
            return -1
        queued = self._accept_queue()
        if queued is None or queued > 0:
            self._strikes += 1
            if self._strikes >= 2:                   # nobody takes them: we do
                self.on(th, BALANCE)
                return -1
        else:
            self._strikes = 0
            self._step = min(self._step * 2, 1.0)
        self._check_at = now + self._step
        return max(1, int(self._step * 1000))

    def _accept_queue(self) -> int | None:
        """Connections waiting in the listeners' accept queues (TCP_INFO of
        a listening socket: tcpi_unacked), summed over each distinct socket
        (a group's dup'ed copies share one queue; several binds do not:
        review finding 1); None where unknown (a unix socket)."""
        total, seen = 0, set()
        for fd in list(self.loop.listeners):
            try:
                # a draining thread may have deleted (and so closed) it since
                # the list was read: EBADF here, never out of the loop thread
                s = socket.socket(fileno=fd)
            except OSError:
                return None
            try:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                if s.family not in (socket.AF_INET, socket.AF_INET6):
                    return None
                info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
                total += struct.unpack_from("I", info, 24)[0]
            except OSError:
                return None
            finally:
                s.detach()
        return total
