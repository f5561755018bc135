"""The `stream` interface: a handler class and the connection it is given.

An app is a class; one instance handles one connection:

    class Echo:
        def on_connect(self, conn): ...
        def on_data(self, conn, data: bytes): conn.write(data)
        def on_eof(self, conn): conn.close()      # the default when absent
        def on_close(self, conn): ...

Every method is optional but on_data. They run on the thread that owns the
connection, while it holds the fd's running bit, one at a time: a handler
needs no lock for its own connection. on_connect runs before anything else,
also when the connection moved to another thread before it ran.

A handler may also act on other connections (a chat room, a proxy pair):
from a loop thread, `write`, `close`, `pause_reading` and `resume_reading`
work on any connection (fdcore's verbs take the calling thread's context,
never the owner's); from a thread of the app's own, they are queued to the
owning loop thread and run there. Bytes written to one connection from two
threads at the same moment may interleave.

`Connection.write` never blocks: what the kernel does not take now waits in
a buffer and goes out when the socket is writable (POLLOUT); past the
high-water mark the connection stops reading until the buffer drains below
the low-water mark, so a client that does not read cannot make the server
buffer without bound.
"""
from __future__ import annotations

import errno
import logging
import os
import select
import socket
import time

from sockherd.fdcore import State

log = logging.getLogger("sockherd.worker")

HIGH_WATER = 1 << 20      # pending output that pauses reading
LOW_WATER = 64 << 10      # pending output below which reading resumes
READ_SIZE = 64 << 10
# plain ints: an IntFlag & costs an enum construction per test, per event
_READABLE = int(State.POLL_IN | State.POLL_HUP | State.POLL_RDHUP)
_WRITABLE = int(State.POLL_OUT)
_FAILED = int(State.POLL_ERR)  # with POLL_CTL: the poller could not register the fd


def wait_ready(fd: int, event: int, deadline: float, what: str) -> None:
    """Blocks until fd may be ready for event (select.POLLIN or POLLOUT),
    or raises TimeoutError(what) once the monotonic deadline passed. For a
    thread that is the connection's while an app runs (a body read, a big
    response, a sendfile); callers retry their I/O and wait again."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(what)
    waiter = select.poll()
    waiter.register(fd, event)
    waiter.poll(max(1, int(left * 1000)))


def ready_now(interest: dict[int, int]) -> set[int]:
    """Which of the fds have the events they are asked for ({fd: events})
    pending right now (or a hang-up, an error): one poll(2), no wait."""
    probe = select.poll()
    for fd, events in interest.items():
        probe.register(fd, events)
    return {fd for fd, _ in probe.poll(0)}


class Connection:
    """One accepted connection, owned by one thread context of the fd table."""

    __slots__ = ("fd", "cookie", "th", "loop", "handler", "peer", "local", "last_active", "_out",
                 "_closing", "_closed", "_paused_by_app", "_paused_by_output", "_want_send",
                 "connected", "timer_at", "timer_entry")

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
        self._closing = False
        self._closed = False
        self._paused_by_app = False
        self._paused_by_output = False
        self._want_send = False
        self.connected = False                # on_connect ran (connect())
        self.timer_at = 0.0                   # set_timer's deadline (0: none)
        self.timer_entry = 0.0                # its entry in the owner's timer heap

    # ---- the app's side --------------------------------------------------------
    def write(self, data: bytes) -> None:
        """Sends data, buffering what the kernel does not take now."""
        if self._closed or self._closing:
            return
        if getattr(self.loop.local, "th", None) is None:
            self.loop.post(self, self.write, bytes(data))   # not a loop thread
            return
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
        self._sync()

    def close(self) -> None:
        """Closes once the buffered output is sent."""
        if self._closed:
            return
        if getattr(self.loop.local, "th", None) is None:
            self.loop.post(self, self.close)
            return
        self._closing = True
        if not self._out:
            self._close_now()
        else:
            self._sync()

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

    def set_timer(self, seconds: float | None) -> None:
        """Calls the handler's on_timeout(conn) (default: close) once
        `seconds` pass without another set_timer; None cancels. It runs on
        the owning thread like any handler (a timer costs no thread)."""
        if seconds is None:
            self.timer_at = 0.0
            return
        self.timer_at = time.monotonic() + seconds
        self.loop.arm(self, self.timer_at)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pending(self) -> int:
        """Bytes written by the app and not yet taken by the kernel."""
        return len(self._out)

    # ---- the loop's side -------------------------------------------------------
    # Called from loop threads only: every fdcore verb below takes the calling
    # thread's context (loop.local.th). Using the owner's context from another
    # OS thread would corrupt its update list and its running bit (review).
    def connect(self) -> None:
        """Runs on_connect once, by the owner while it holds the fd."""
        if self.connected:
            return
        self.connected = True
        self._call("on_connect")
        if not self._closed:
            self._sync()

    def adopted_by(self, th) -> None:
        """th took the connection over (fdcore takeover, recv stopped): it
        owns it from now on and polls what we want. Work was waiting on it:
        that is activity (a drain must not take it for idle)."""
        self.th = th
        self.last_active = time.monotonic()
        self._want_send = False          # the core keeps a wanted send: re-say it
        self._sync()

    def on_events(self, events: int) -> None:
        """Called by the owning thread while it holds the fd; events are the
        poll report's State.POLL_* bits."""
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
        if events & _READABLE and not self._closed and self._reading():
            self._read()

    def _reading(self) -> bool:
        return not (self._paused_by_app or self._paused_by_output or self._closing)

    def _read(self) -> None:
        try:
            data = os.read(self.fd, READ_SIZE)
        except BlockingIOError:
            self.loop.local.th.cant_recv(self.fd)
            return
        except OSError as exc:
            self._fail(exc)
            return
        if not data:
            self._call("on_eof", default=self.close)
            return
        self._call("on_data", data)

    def _flush(self) -> None:
        try:
            n = os.write(self.fd, self._out)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(exc)
            return
        del self._out[:n]
        if not self._out and self._closing:
            self._close_now()
        else:
            self._sync()

    def _sync(self) -> None:
        """Brings the fd's ACTIVE directions in line with what we want."""
        if self._closed:
            return
        if self._paused_by_output and len(self._out) < LOW_WATER:
            self._paused_by_output = False
        elif not self._paused_by_output and len(self._out) > HIGH_WATER:
            self._paused_by_output = True
        ctx = self.loop.local.th
        want_send = bool(self._out)
        if want_send != self._want_send:
            self._want_send = want_send
            (ctx.want_send if want_send else ctx.stop_send)(self.fd)
        if self._reading():
            ctx.want_recv(self.fd)
        else:
            ctx.stop_recv(self.fd)

    def _call(self, name: str, *args, default=None) -> None:
        fn = getattr(self.handler, name, None)
        try:
            if fn is not None:
                fn(self, *args)
            elif default is not None:
                default()
        except Exception:
            log.exception("stream handler %s.%s failed; closing connection from %s",
                          type(self.handler).__name__, name, self.peer)
            self._out.clear()
            self._close_now()

    def _fail(self, exc: OSError | None) -> None:
        if exc is not None and exc.errno not in (errno.ECONNRESET, errno.EPIPE):
            log.warning("connection from %s: %s", self.peer, exc)
        self._out.clear()
        self._close_now()

    def _close_now(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.loop.forget(self)
        # deferred to the leave of whichever thread is inside it
        self.loop.local.th.delete(self.fd)
        on_close = getattr(self.handler, "on_close", None)
        if on_close is not None:
            try:
                on_close(self)
            except Exception:
                log.exception("stream handler %s.on_close failed", type(self.handler).__name__)
