"""A stream connection's output and its flow control (the `stream`
docstring's Output): writes that never block, from a loop thread or from a
thread of the app's own (through the owner's mail), the buffer sent as the
socket takes it, pause_writing past high water and resume_writing back at
low water, the hard stream_output_limit, and flush_now for a thread that
is the connection's while an app runs. Connection (worker/stream.py) is
built on StreamOutput; it calls StreamCore (stream_core.py) only."""
from __future__ import annotations

import logging
import os
import select
import time

from sockherd.worker.fdwait import wait_ready
from sockherd.worker.stream_core import StreamCore

log = logging.getLogger("sockherd.worker")

HIGH_WATER = 1 << 20      # pending output that pauses reading, and pause_writing
LOW_WATER = 64 << 10      # pending output below which reading resumes, resume_writing
OUTPUT_LIMIT = 16 << 20   # stream_output_limit's default: pending output that closes


def water_marks(output_limit: int) -> tuple[int, int]:
    """(high, low) for a stream_output_limit: HIGH_WATER and LOW_WATER, or
    under a limit below them half the limit and a quarter of that (a limit
    under the high mark closed a handler that honours pause_writing before
    it was ever told, review)."""
    high = min(HIGH_WATER, output_limit // 2)
    return high, min(LOW_WATER, high // 4)


class StreamOutput(StreamCore):
    """What a Connection writes and how fast (see the module)."""

    __slots__ = ()

    def write(self, data: bytes) -> None:
        """Sends data, buffering what the kernel does not take now (flow
        control and the hard limit: the module's docstring)."""
        if self._closed or self._closing:
            return
        ctx = getattr(self.loop.local, "th", None)
        if ctx is None:
            self._post_write(data)                # not a loop thread
            return
        self.last_active = time.monotonic()   # output is activity (a push protocol)
        if not self._out:
            try:
                n = os.write(self.fd, data)
            except BlockingIOError:
                n = 0
            except OSError as exc:
                self._fail(exc)
                return
            data = data[n:]
            if not data:
                return
        self._out += data
        if len(self._out) > self.loop.output_limit:
            self._over_limit()
            return
        self._sync()
        if not self._writing_paused and len(self._out) > self.loop.high_water \
                and self._mark_paused():
            if ctx is self.th:
                self._tell_pause()
            else:                            # the handler runs on its own thread
                self.loop.post(self, self._tell_pause)

    def _post_write(self, data) -> None:
        """write() from a thread that is not a loop thread: the bytes go to
        the owner's mail, counted in `pending` until it writes them, and
        past high water pause_writing is asked of the owner: a producer
        thread that holds back on either is throttled (uncounted, one
        posted dozens of MiB before the owner ran any, review). Past
        stream_output_limit the connection is closed, these bytes dropped,
        so the mail is no buffer without bound either."""
        data = bytes(memoryview(data))   # bytes-like only: bytes(5) sent five NULs
        loop = self.loop
        pause = False
        with loop.queue_lock:
            self._queued += len(data)
            waiting = self._queued + len(self._out)
            if waiting > loop.output_limit:
                self._queued -= len(data)
            elif waiting > loop.high_water and not self._writing_paused:
                # before the write is posted: the owner may run it (and see
                # the end of the pause) before this thread gets further
                self._writing_paused = pause = True
        if waiting > loop.output_limit:
            self._closing = True         # what this thread writes next is dropped
            loop.post(self, self._over_limit, waiting)
            return
        loop.post(self, self._write_posted, data)
        if pause:
            loop.post(self, self._tell_pause)

    def _write_posted(self, data: bytes) -> None:
        with self.loop.queue_lock:
            self._queued -= len(data)
        self.write(data)
        self._maybe_resume()             # the kernel may have taken it all: no flush

    def flush_now(self, timeout: float, below: int = 0) -> None:
        """Sends buffered output until at most `below` bytes wait, waiting
        for the socket with poll (the caller's thread is the connection's
        while it runs: a WSGI app writing a big response, a sendfile).
        Raises TimeoutError, or OSError if the client went away."""
        deadline = time.monotonic() + timeout
        while len(self._out) > below and not self._closed:
            try:
                n = os.write(self.fd, self._out)
            except BlockingIOError:
                n = 0
            del self._out[:n]
            if len(self._out) <= below:
                break
            wait_ready(self.fd, select.POLLOUT, deadline, "the client does not read")
        if self._closed:
            raise ConnectionResetError("the connection is closed")
        self._sync()

    @property
    def pending(self) -> int:
        """Bytes written by the app and not yet taken by the kernel (those
        written from a thread of the app's own and not yet run by the
        owner included)."""
        return len(self._out) + self._queued

    @property
    def writing_paused(self) -> bool:
        """Output went past high water and is not back to low water yet
        (set at once, also by a write from a thread of the app's own;
        pause_writing and resume_writing follow on the owner)."""
        return self._writing_paused

    def _flush(self) -> None:
        try:
            n = os.write(self.fd, self._out)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(exc)
            return
        del self._out[:n]
        if n:
            self.last_active = time.monotonic()
        if not self._out and self._closing:
            self._close_now()
            return
        self._sync()
        self._maybe_resume()

    def _mark_paused(self) -> bool:
        """writing_paused set at once, by whichever thread wrote past high
        water (a producer thread sees it at its next look, before the owner
        ran anything: review); True if it was not set yet, so pause_writing
        is to be told (_tell_pause, on the owner)."""
        with self.loop.queue_lock:
            if self._writing_paused:
                return False
            self._writing_paused = True
            return True

    def _tell_pause(self) -> None:
        """pause_writing, on the owner, unless writing resumed meanwhile."""
        if self._writing_paused and not self._pause_told and not self._closed:
            self._pause_told = True
            self._call("pause_writing")

    def _maybe_resume(self) -> None:
        """Once what waits is down to low water: writing_paused cleared, and
        resume_writing if pause_writing was told (on the owner)."""
        if not self._writing_paused or self._closed:
            return
        with self.loop.queue_lock:
            if self.pending > self.loop.low_water:
                return
            self._writing_paused = False
        if self._pause_told:
            self._pause_told = False
            self._call("resume_writing")

    def _over_limit(self, waiting: int = 0) -> None:
        """Closes at once, output dropped, with a log line; `waiting`: a
        write posted by _post_write was refused (said even if the owner
        closed meanwhile: those bytes are lost)."""
        if self._closed and not waiting:
            return
        log.warning("connection from %s: %d bytes of output waiting, past stream_output_limit "
                    "(%d): closing it, its output dropped", self.peer,
                    waiting or len(self._out), self.loop.output_limit)
        if not self._closed:
            self._out.clear()
            self._close_now()
