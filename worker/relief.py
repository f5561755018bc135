"""Relief for a thread stuck in a slow handler.

A handler may block (a database call). The watchdog thread notices a loop
thread that has been inside one handler for `takeover_after` seconds and
asks an idle thread of the same group to take over (fdcore takeover) the
stuck thread's connections that have work waiting, so one slow request does
not stall the other clients of its thread.

For that to reach the connections a stuck thread has already polled, a
relieved loop (one with siblings in its group) does not hold its batch while
it works through it: it leaves the batch at once and enters each fd again
just before its handler (worker/loop.py). A sibling can then take anything
but the connection being handled. A loop thread with no sibling keeps the
cheaper hold-the-batch path: nobody could relieve it anyway.

The watchdog costs nothing when nothing happens: it sleeps with no timeout
once a whole period passed with no handler run, and the first loop thread to
run a handler after that wakes it (one eventfd write per quiet-to-busy
transition, never per event). Per loop thread, by position: `busy` is when
its current handler started (0.0: in none) and `asked` which stuck sibling it
was asked to relieve; both are written by single stores.
"""
from __future__ import annotations

import logging
import os
import select
import threading
import time

from sockherd.worker.fdwait import ready_now

log = logging.getLogger("sockherd.worker")


class Relief:
    def __init__(self, loop, takeover_after: float):
        self.loop = loop
        self.period = takeover_after
        threads = loop.loop_threads
        self.busy = [0.0] * len(threads)
        self.asked: list[int | None] = [None] * len(threads)
        self.takeovers = [0] * len(threads)      # connections taken, per thread
        self.activity = 0                        # handler batches run (a hint, not exact)
        self.asleep = False
        self.enabled = takeover_after > 0 and any(self.siblings(i) for i in range(len(threads)))
        self._fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)

    def siblings(self, i: int) -> list[int]:
        threads = self.loop.loop_threads
        return [j for j, th in enumerate(threads) if th.tgid == threads[i].tgid and j != i]

    # ---- the watchdog ----------------------------------------------------------------
    def start(self) -> threading.Thread | None:
        if not self.enabled:
            return None
        t = threading.Thread(target=self._watch, name="sockherd-watchdog", daemon=True)
        t.start()
        return t

    def wake(self) -> None:
        """From a loop thread that found the watchdog asleep after stamping
        busy (the other half of the handshake in _watch)."""
        self.asleep = False
        os.eventfd_write(self._fd, 1)

    def stop(self) -> None:
        if self._fd >= 0:
            os.eventfd_write(self._fd, 1)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _watch(self) -> None:
        """Wakes at the moment a running handler reaches the period (then
        every half period while it stays stuck) and asks an idle sibling to
        relieve its thread; sleeps with no timeout once a period went by with
        no handler run."""
        period = self.period
        seen = -1
        stop = self.loop._stop
        try:
            while not stop.is_set():
                now = time.monotonic()
                due = None
                for i, since in enumerate(self.busy):
                    if not since:
                        continue
                    if now - since >= period:
                        self._ask(i, now - since)
                        at = now + period / 2
                    else:
                        at = since + period
                    due = at if due is None else min(due, at)
                if due is not None:
                    timeout = max(0.0, due - now)
                elif self.activity != seen:
                    seen = self.activity
                    timeout = period
                else:
                    # Dekker with the loop threads: our flag store, then a
                    # re-read of their state; a loop thread stores its busy
                    # stamp, then reads the flag: one of us sees the other
                    self.asleep = True
                    if self.activity != seen or any(self.busy):
                        self.asleep = False
                        continue
                    timeout = None
                select.select([self._fd], [], [], timeout)
                try:
                    os.eventfd_read(self._fd)
                except BlockingIOError:
                    pass
        except BaseException as exc:
            self.loop.errors.append(exc)
            log.exception("watchdog failed")

    def _ask(self, stuck: int, for_s: float) -> None:
        for j in self.siblings(stuck):
            if not self.busy[j] and self.asked[j] is None:
                self.asked[j] = stuck
                self.loop.table.wake(self.loop.loop_threads[j].tid)
                return
        log.debug("thread %d in one handler for %.1fs; no idle sibling to relieve it",
                  self.loop.loop_threads[stuck].tid, for_s)

    # ---- the taking (in the sibling's loop thread) -------------------------------------
    def take_from(self, th, me: int) -> None:
        """th (position me) takes over the connections of its stuck sibling
        that have work waiting: readable, or output the kernel will take.
        The one the sibling is inside is refused by the core (EBUSY)."""
        stuck, self.asked[me] = self.asked[me], None
        loop = self.loop
        victim = loop.loop_threads[stuck]
        since = self.busy[stuck]
        if not since or time.monotonic() - since < self.period:
            return                                   # it came back meanwhile
        theirs = {c.fd: c for c in list(loop.conns.values()) if c.th is victim}
        if not theirs:
            return
        moved = 0
        for fd in ready_now({fd: select.POLLIN | (select.POLLOUT if conn.pending else 0)
                             for fd, conn in theirs.items()}):
            conn = theirs[fd]
            try:
                if conn.th is not victim or conn.closed or not th.takeover(fd, conn.cookie):
                    continue
                conn.adopted_by(th)
            except OSError as exc:
                # closed from elsewhere between our checks and the core's: a
                # lost race, not a reason to end this loop thread
                log.debug("takeover of fd %d abandoned: %s", fd, exc)
                continue
            moved += 1
        if moved:
            self.takeovers[me] += moved
            log.info("thread %d took %d connection(s) from thread %d, inside one handler "
                     "for %.1fs", th.tid, moved, victim.tid, time.monotonic() - since)
