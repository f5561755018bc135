"""Connection timers (header and keep-alive timeouts, a stream handler's
set_timer): a heap per loop thread of (when, seq, conn), at most about two
entries per connection, fired under the running bit like any event. The
turn (loop_turn.py) fires what is due; a connection arms its deadline with
arm(). Calls loop_core.py only.
"""
from __future__ import annotations

import heapq
import time

from sockherd.fdcore import Outcome
from sockherd.worker.loop_core import LoopCore
from sockherd.worker.stream import Connection


class LoopTimers(LoopCore):
    """The loop threads' timer heaps (Loop._timers) and their firing."""

    def arm(self, conn: Connection, when: float) -> None:
        """Puts conn's deadline in its owner's heap, unless an entry at or
        before `when` is there already (it re-arms itself when it fires
        early). The owner's loop thread only (others post it there)."""
        if getattr(self.local, "th", None) is not conn.th:
            self.post(conn, self.arm, conn, when)
            return
        if conn.timer_entry and conn.timer_entry <= when:
            return
        conn.timer_entry = when
        heapq.heappush(self._timers[self._pos[conn.th.tid]], (when, next(self._timer_seq), conn))

    def _fire_timers(self, th, me: int, heap: list) -> None:
        now = time.monotonic()
        while heap and heap[0][0] <= now:
            when, _, conn = heapq.heappop(heap)
            if conn.timer_entry != when:
                continue                         # superseded by an earlier entry
            conn.timer_entry = 0.0
            if conn.closed or not conn.timer_at:
                continue                         # closed, or cancelled
            if conn.th is not th:                # taken over: its new owner's heap
                self.post(conn, self.arm, conn, conn.timer_at)
                continue
            if conn.timer_at > now:              # moved later meanwhile
                self.arm(conn, conn.timer_at)
                continue
            # the handler runs under the running bit, as for an event
            outcome, gen = th.enter(conn.fd)
            if outcome is not Outcome.DONE:
                continue
            try:
                if conn.th is th and not conn.closed and conn.timer_at and conn.timer_at <= now:
                    conn.timer_at = 0.0
                    self._enter_app(me)
                    conn.timed_out()
                    self.relief.busy[me] = 0.0
            finally:
                th.leave(conn.fd, gen)
