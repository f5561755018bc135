"""The `stream` interface: a handler class and the connection it is given.

An app is a class; one instance handles one connection:

    class Echo:
        def on_connect(self, conn): ...
        def on_data(self, conn, data: bytes): conn.write(data)
        def on_eof(self, conn): conn.close()      # the default when absent
        def on_close(self, conn): ...
        def pause_writing(self, conn): ...        # output past the high-water mark
        def resume_writing(self, conn): ...       # ... and back under the low one
        def on_drain(self, conn): ...             # the worker began to drain
        def on_timeout(self, conn): conn.close()  # set_timer's (the default)

Every method is optional but on_data. They run on the thread that owns the
connection, one at a time: a handler needs no lock for its own connection.
on_connect runs before anything else, also when the connection moved to
another thread before it ran.

Containment. Whatever a method (or the class, made for each connection)
raises (an Exception, SystemExit,
KeyboardInterrupt, GeneratorExit, any BaseException) is logged once and
ends that connection only: reading stops, what was already written is
sent, then the connection closes with a FIN (sent first, then its unread
input read, so the client sees a close, not a reset). The loop thread
serves on.

End of input. on_eof is called once, when the peer shut its sending side;
from then on the connection is not polled for input (a handler may keep a
half-closed connection open to finish writing; a reset of the peer is seen
by its next write, or at once while output is waiting). A connection whose reading
is paused (pause_reading, or its own output past the high-water mark) still
notices its peer leaving: on a hang-up the input that is left is read and
held (the peer can send no more, so at most its socket's receive buffer),
and on_eof comes at once if nothing was left, else after that input, once
reading resumes. A reset or an error closes the connection: on_close runs.

Output. `Connection.write` never blocks: what the kernel does not take now
waits in the connection's buffer and goes out when the socket is writable.
Flow control, as asyncio's protocols do it: when the buffer grows past
HIGH_WATER (1 MiB; half the output limit if that is less) the handler's
pause_writing(conn) is called, and resume_writing(conn) once it is down to
LOW_WATER (64 KiB; a quarter of the high mark if less); meanwhile the
connection also stops reading (an echo-style handler is throttled with no
code of its own). A handler that writes on its own (a broadcast, a push
server) must honour pause_writing, or poll `conn.pending`: writes are never
refused. What bounds a handler that does neither is the hard per-connection
limit, the `stream_output_limit` setting (OUTPUT_LIMIT, 16 MiB by default):
a write that leaves more than that waiting closes the connection at once
(what is buffered is dropped) with a log line. A single write larger than
the limit to a client that cannot take it at once is such a write: write
big payloads in pieces, under pause_writing.

Drains. When the worker starts draining (TERM, a reload, a replacement) the
handler's on_drain(conn) is called once per open connection (and at once
for one that opens while draining): the place to finish the exchange in
flight or send the protocol's goodbye and close. A connection that stays
idle (no byte in or out: writes count) for `idle_grace` is closed; the
others are served until `hard_stop_after`, then cut, and the worker's exit
says so (the master logs "hit the drain deadline").

A handler may also act on other connections (a chat room, a proxy pair):
from a loop thread, `write`, `close`, `pause_reading` and `resume_reading`
work on any connection (fdcore's verbs take the calling thread's context,
never the owner's); from a thread of the app's own, they are queued to the
owning loop thread and run there. Such queued writes count in `pending`
and `writing_paused` at once (a producer thread that holds back on either
is throttled), and under stream_output_limit like the others; `write`
takes a bytes-like object only (a TypeError in the caller otherwise). Bytes
written to one connection from two threads at the same moment may
interleave. A handler's pause_writing and resume_writing always run on its
own connection's loop thread.
"""
from __future__ import annotations

import math
import os
import socket
import time

from sockherd.fdcore import State
from sockherd.worker.fdwait import ready_now
# the parts a Connection is built of, each calling stream_core only
from sockherd.worker.stream_core import READ_SIZE, read_unread
from sockherd.worker.stream_output import (HIGH_WATER, LOW_WATER, OUTPUT_LIMIT, StreamOutput,
                                           water_marks)
from sockherd.worker.stream_proxy import StreamProxyHeader

# worker/loop.py and tests import these from here, as from before the split
__all__ = ["Connection", "HIGH_WATER", "LOW_WATER", "OUTPUT_LIMIT", "READ_SIZE", "read_unread",
           "ready_now", "water_marks"]

# plain ints: an IntFlag & costs an enum construction per test, per event
_READABLE = int(State.POLL_IN | State.POLL_HUP | State.POLL_RDHUP)
_HANGUP = int(State.POLL_HUP | State.POLL_RDHUP)
_WRITABLE = int(State.POLL_OUT)
_FAILED = int(State.POLL_ERR)  # with POLL_CTL: the poller could not register the fd


class Connection(StreamOutput, StreamProxyHeader):
    """One accepted connection, owned by one thread context of the fd table.
    Its state is all here; what it does is in its parts: StreamCore
    (stream_core.py: the handler boundary, the poll interest, the end),
    StreamOutput (stream_output.py: output and flow control),
    StreamProxyHeader (stream_proxy.py: a PROXY header before on_connect).
    This class adds the rest of the app's side (reading paused or not, the
    timer) and the loop's entry points (poll events, a takeover, a timer)."""

    __slots__ = ("fd", "cookie", "th", "loop", "handler", "peer", "local", "last_active", "_out",
                 "_closing", "_closed", "_paused_by_app", "_paused_by_output", "_want_send",
                 "_watching", "_eof", "_eof_told", "_held", "_delivering", "_writing_paused",
                 "_queued", "_pause_told", "told_drain", "connected", "timer_at", "timer_entry",
                 "proxy", "_proxy_wait", "_proxy_trusted", "_proxy_buf")

    def __init__(self, loop, th, fd: int, cookie: int, handler):
        self.fd = fd
        self.cookie = cookie
        self.th = th
        self.loop = loop
        self.handler = handler
        s = socket.socket(fileno=fd)
        try:
            self.peer = s.getpeername()
            self.local = s.getsockname()
        except OSError:
            self.peer = self.local = None
        finally:
            s.detach()            # the fd table owns the fd
        self.last_active = time.monotonic()   # last byte in or out (drain's idle grace)
        self._out = bytearray()
        self._queued = 0                     # bytes in the owner's mail (_post_write)
        self._closing = False
        self._closed = False
        self._paused_by_app = False
        self._paused_by_output = False
        self._want_send = False
        self._watching = False               # WATCH_HUP asked of the core (_sync)
        self._eof = False                    # the peer's end of input seen (read or held)
        self._eof_told = False               # on_eof called
        self._held = b""                     # input read at a hang-up while paused
        self._delivering = False             # _deliver_held posted
        self._writing_paused = False         # past high water, not back to low water yet
        self._pause_told = False             # pause_writing called, resume_writing not yet
        self.told_drain = False              # on_drain called
        self.connected = False                # on_connect ran (connect())
        self.timer_at = 0.0                   # set_timer's deadline (0: none)
        self.timer_entry = 0.0                # its entry in the owner's timer heap
        # the PROXY protocol (worker/proxy.py): a header may come ahead of
        # the handler's bytes; on_connect waits for it, within header_timeout
        self.proxy = None                     # what a header told (a dict), or None
        policy = loop.proxy
        self._proxy_wait = policy is not None and policy.on
        if self._proxy_wait:
            self._proxy_trusted = policy.allowed(self.peer)
            self._proxy_buf = bytearray()
            self.timer_at = time.monotonic() + loop.header_timeout
            loop.arm(self, self.timer_at)

    # ---- the app's side --------------------------------------------------------
    def pause_reading(self) -> None:
        if getattr(self.loop.local, "th", None) is None:
            self.loop.post(self, self.pause_reading)
            return
        self._paused_by_app = True
        self._sync()

    def resume_reading(self) -> None:
        if getattr(self.loop.local, "th", None) is None:
            self.loop.post(self, self.resume_reading)
            return
        self._paused_by_app = False
        self._sync()

    def set_timer(self, seconds: float | None) -> None:
        """Calls the handler's on_timeout(conn) (default: close) once
        `seconds` pass without another set_timer; None cancels. It runs on
        the owning thread like any handler (a timer costs no thread). A
        length that is not finite raises ValueError."""
        if seconds is None:
            self.timer_at = 0.0
            return
        seconds = float(seconds)
        if not math.isfinite(seconds):
            # NaN or an infinity in the loop's timer heap ended the loop
            # thread (review); "never" is None
            raise ValueError(f"set_timer: {seconds} seconds (a finite number, or None "
                             "to cancel)")
        self.timer_at = time.monotonic() + seconds
        self.loop.arm(self, self.timer_at)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def input_ended(self) -> bool:
        """The peer shut its sending side (its input read or held)."""
        return self._eof

    # ---- the loop's side -------------------------------------------------------
    # Called from loop threads only: every fdcore verb below takes the calling
    # thread's context (loop.local.th). Using the owner's context from another
    # OS thread would corrupt its update list and its running bit (review).
    def adopted_by(self, th) -> None:
        """th took the connection over (fdcore takeover, recv stopped): it
        owns it from now on and polls what we want. Work was waiting on it:
        that is activity (a drain must not take it for idle)."""
        self.th = th
        self.last_active = time.monotonic()
        self._want_send = False          # the core keeps a wanted send: re-say it
        self._watching = False           # ... and WATCH_HUP
        self._sync()

    def on_events(self, events: int) -> None:
        """Called by the owning thread while it holds the fd; events are the
        poll report's State.POLL_* bits."""
        if self._proxy_wait and not self._closed:
            if events & _FAILED:
                self._fail(None)
            elif events & _READABLE:
                self._proxy_read()
            return
        if not self.connected:
            self.connect()
            if self._closed:
                return
        self.last_active = time.monotonic()
        if events & _FAILED:
            self._fail(None)
            return
        if events & _WRITABLE and self._out:
            self._flush()
        if events & _READABLE and not self._closed:
            if self._reading():
                self._read()
            elif events & _HANGUP and not self._eof and not self._closing:
                self._hung_up()

    def timed_out(self) -> None:
        """The timer is due: the handler's on_timeout (default: close),
        or, while a PROXY header is awaited, header_timeout's close."""
        if self._proxy_wait:
            self._proxy_refuse("no whole PROXY protocol header within header_timeout")
            return
        self._call("on_timeout", default=self.close)

    def _read(self) -> None:
        data = self._read_once()
        if data is None:
            return
        if not data:
            self._eof = self._eof_told = True
            self._sync()                 # input is over: not polled any more
            self._call("on_eof", default=self.close)
            return
        self._call("on_data", data)

    def _hung_up(self) -> None:
        """A hang-up reported while reading is paused: the input left is
        read and held (the peer sends no more: bounded by its receive
        buffer), the watch stops (RDHUP is level-triggered), and on_eof is
        told now if nothing was left, else once reading resumes."""
        chunks = []
        while True:
            try:
                data = os.read(self.fd, READ_SIZE)
            except BlockingIOError:
                break                    # RDHUP with input still to come: not yet the end
            except OSError as exc:
                self._fail(exc)
                return
            if not data:
                self._eof = True
                break
            chunks.append(data)
        if chunks:
            self._held += b"".join(chunks)
        if not self._eof:
            return
        if not self._held:
            self._eof_told = True
        self._sync()
        if not self._held:
            self._call("on_eof", default=self.close)
