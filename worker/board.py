"""The balance board: each serving worker's open connection count, in a
small shared memory file the master creates (memfd) and every worker maps.

Why: idle pollers share one listener (EPOLLEXCLUSIVE, one accept queue for
lossless reloads), and the thread that just accepted is already running
when the next connections of a burst arrive, so it wins every race: 50
connections opened at once landed 50/0 on 2 workers (bench/RESULTS.md).
With the GIL that is one core for all of them. A worker whose count is
ahead of the least loaded other worker's stops polling the listener (the
others, asleep on it, are woken by the next arrivals) until it is not
ahead any more (worker/loop.py).

Slot i belongs to worker index i: its count, or -1 while it is not serving
(starting, draining, gone: written by the master at spawn and reap, by the
worker when its drain starts). Single aligned 8-byte stores and loads: a
reader sees an old or a new count, never a torn one; a stale count only
delays a decision until the next check.
"""
from __future__ import annotations

import mmap
import os

SLOTS = 1024                  # the settings' bound on workers
NOT_SERVING = -1


class Board:
    def __init__(self, fd: int, owner: bool = False):
        self.fd = fd
        if owner:
            os.ftruncate(fd, SLOTS * 8)
        self._map = mmap.mmap(fd, SLOTS * 8)
        self.slots = memoryview(self._map).cast("q")
        if owner:
            for i in range(SLOTS):
                self.slots[i] = NOT_SERVING

    @classmethod
    def create(cls) -> "Board":
        """The master's: a new memfd (close-on-exec; passed explicitly)."""
        return cls(os.memfd_create("sockherd-board", os.MFD_CLOEXEC), owner=True)

    def least_other(self, me: int, upto: int) -> int | None:
        """The smallest count among serving workers 0 .. upto-1 but me,
        None if no other serves."""
        least = None
        slots = self.slots
        for i in range(upto):
            if i != me:
                v = slots[i]
                if v >= 0 and (least is None or v < least):
                    least = v
        return least

    def close(self) -> None:
        self.slots.release()
        self._map.close()
        os.close(self.fd)
