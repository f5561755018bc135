"""The `stream` interface: a handler class and the connection it is given.

An app is a class; one instance handles one connection:

    class Echo:
        def on_connect(self, conn): ...
        def on_data(self, conn, data: bytes): conn.write(data)
        def on_eof(self, conn): conn.close()      # the default when absent
        def on_close(self, conn): ...

Every method is optional but on_data. They run on the thread that owns the
connection, while it holds the fd's running bit, one at a time: a handler
needs no lock for its own connection.

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
import socket
import time

from sockherd.fdcore import State

log = logging.getLogger("sockherd.worker")

HIGH_WATER = 1 << 20      # pending output that pauses reading
LOW_WATER = 64 << 10      # pending output below which reading resumes
READ_SIZE = 64 << 10
_READABLE = State.POLL_IN | State.POLL_HUP | State.POLL_RDHUP
_WRITABLE = State.POLL_OUT
_FAILED = State.POLL_ERR     # with POLL_CTL: the poller could not register the fd


class Connection:
    """One accepted connection, owned by one thread context of the fd table."""

    __slots__ = ("fd", "cookie", "th", "loop", "handler", "peer", "local", "last_active", "_out",
                 "_closing", "_closed", "_paused_by_app", "_paused_by_output", "_want_send")

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

    # ---- the app's side --------------------------------------------------------
    def write(self, data: bytes) -> None:
        """Sends data, buffering what the kernel does not take now."""
        if self._closed or self._closing:
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
        self._closing = True
        if not self._out:
            self._close_now()
        else:
            self._sync()

    def pause_reading(self) -> None:
        self._paused_by_app = True
        self._sync()

    def resume_reading(self) -> None:
        self._paused_by_app = False
        self._sync()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pending(self) -> int:
        """Bytes written by the app and not yet taken by the kernel."""
        return len(self._out)

    # ---- the loop's side -------------------------------------------------------
    def on_events(self, events: int) -> None:
        """Called by the owning thread while it holds the fd; events are the
        poll report's State.POLL_* bits."""
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
            self.th.cant_recv(self.fd)
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
        want_send = bool(self._out)
        if want_send != self._want_send:
            self._want_send = want_send
            (self.th.want_send if want_send else self.th.stop_send)(self.fd)
        if self._reading():
            self.th.want_recv(self.fd)
        else:
            self.th.stop_recv(self.fd)

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
        self.th.delete(self.fd)          # deferred to our leave if we hold it
        on_close = getattr(self.handler, "on_close", None)
        if on_close is not None:
            try:
                on_close(self)
            except Exception:
                log.exception("stream handler %s.on_close failed", type(self.handler).__name__)
