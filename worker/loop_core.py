"""What every part of the worker's Loop (worker/loop.py) calls: the fd
kinds in the table, a loop thread's mailbox (post), the app-code stamp the
relief's watchdog reads (_enter_app), the main-thread-only guard, and the
poll-timeout arithmetic. It calls no other part.

Connection verbs always use the calling loop thread's context (`local.th`);
a thread that is not a loop thread posts the call to the owner's mailbox.
"""
from __future__ import annotations

import logging
import time

from sockherd.worker.stream import Connection

log = logging.getLogger("sockherd.worker")

KIND_LISTENER = 1
KIND_CONN = 2
KIND_AIO = 3          # an fd an ASGI app registered with its asyncio loop (worker/aio.py)

# the longest poll wait (ms): a timer further off wakes the thread early, and
# _fire_timers finds it not due yet (a 30-day timer is 2.6e9 ms: past poll's
# 32-bit timeout, an OverflowError that ended the loop thread, review)
_MAX_WAIT_MS = 3_600_000


class LoopCore:
    """The Loop's shared verbs (its state is Loop.__init__'s, worker/loop.py)."""

    def _not_from_a_loop_thread(self, what: str) -> None:
        """stop() and drain() are the worker's main thread's: from a loop
        thread (an app reaches the loop through environ["sockherd.loop"])
        stop() ended every loop thread with no error, the worker silent."""
        if getattr(self.local, "th", None) is not None:
            raise RuntimeError(f"Loop.{what}() from a loop thread: the worker's main thread's")

    def post(self, conn: Connection, fn, *args) -> None:
        """Runs fn(*args) on the loop thread that owns conn (for a thread
        that is not a loop thread: fdcore verbs need a context)."""
        owner = conn.th
        self._mail[self._pos[owner.tid]].append((fn, args))
        self.table.wake(owner.tid)

    def _enter_app(self, me: int) -> None:
        """Marks loop thread `me` as inside app code from now (the watchdog's
        stamp; the store comes before the read of its sleep flag)."""
        self.relief.busy[me] = time.monotonic()
        if self.relief.asleep:
            self.relief.wake()

    @property
    def threads_alive(self) -> int:
        """Loop threads still running their loop (the worker's report)."""
        return len(self.loop_threads) - len(self.ended)


def _ms_until(when: float) -> int:
    """A poll timeout (ms) until the monotonic time `when`, at most an hour."""
    return max(0, min(_MAX_WAIT_MS, int((when - time.monotonic()) * 1000) + 1))


def _sooner(a: int, b: int) -> int:
    """The sooner of two poll timeouts in ms (-1: none)."""
    if a < 0:
        return b
    return a if b < 0 else min(a, b)
