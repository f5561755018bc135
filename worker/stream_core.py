"""A stream connection's core, which the rest of worker/stream*.py builds
on: the handler call boundary (every call into the handler contained: the
`stream` docstring's Containment), on_connect and on_drain, the fd's poll
interest kept in line with what the connection wants, the input held at a
hang-up delivered, and the connection's end (close, a failure, on_close).

StreamCore holds no state of its own: Connection (worker/stream.py)
declares and initialises every slot; stream_output.py (output flow
control) and stream_proxy.py (a PROXY protocol header before on_connect)
build on this class and nothing here calls into them."""
from __future__ import annotations

import errno
import logging
import os
import socket

log = logging.getLogger("sockherd.worker")

READ_SIZE = 64 << 10


class StreamCore:
    """The part of a Connection every other part calls (see the module)."""

    __slots__ = ()

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

    # Called from loop threads only: every fdcore verb below takes the calling
    # thread's context (loop.local.th). Using the owner's context from another
    # OS thread would corrupt its update list and its running bit (review).
    def connect(self) -> None:
        """Runs on_connect once, by the owner while it holds the fd (and
        on_drain after it if the worker is draining already); with a
        PROXY protocol header to wait for, once it came (_proxy_done)."""
        if self.connected:
            return
        if self._proxy_wait:
            self._sync()                     # reading on, for the header
            return
        self.connected = True
        self._call("on_connect")
        if not self._closed:
            self._sync()
            if self.loop.draining:
                self.tell_drain()

    def tell_drain(self) -> None:
        """on_drain, once (the owner, holding the fd, or its drain step)."""
        if self.told_drain or self._closed:
            return
        self.told_drain = True
        self._call("on_drain")

    def _reading(self) -> bool:
        return not (self._paused_by_app or self._paused_by_output or self._closing or self._eof)

    def _read_once(self) -> bytes | None:
        """One read: its bytes (b"": the end of input), or None: nothing
        now (the core told), or the connection failed (closed)."""
        try:
            return os.read(self.fd, READ_SIZE)
        except BlockingIOError:
            self.loop.local.th.cant_recv(self.fd)
        except OSError as exc:
            self._fail(exc)
        return None

    def _deliver_held(self) -> None:
        """Input held at a hang-up, then on_eof, once reading resumed (the
        owner's mail)."""
        self._delivering = False
        if self._closed or self._paused_by_app or self._paused_by_output or self._closing:
            return
        if self._held:
            data, self._held = self._held, b""
            self._call("on_data", data)
            if self._closed or self._paused_by_app or self._paused_by_output or self._closing:
                return
        self._tell_eof()

    def _tell_eof(self) -> None:
        if self._eof_told or self._closed:
            return
        self._eof_told = True
        self._call("on_eof", default=self.close)

    def _sync(self) -> None:
        """Brings the fd's ACTIVE directions (and its hang-up watch) in line
        with what we want."""
        if self._closed:
            return
        if self._paused_by_output and len(self._out) < self.loop.low_water:
            self._paused_by_output = False
        elif not self._paused_by_output and len(self._out) > self.loop.high_water:
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
        # paused, not at its end: a hang-up must still be heard (fd-t.h WATCH_HUP)
        watch = not self._eof and not self._closing and not self._reading()
        if watch != self._watching:
            self._watching = watch
            (ctx.want_hup if watch else ctx.stop_hup)(self.fd)
        if self._eof and not self._eof_told and not self._delivering and not (
                self._paused_by_app or self._paused_by_output or self._closing):
            # reading resumed over input held at a hang-up: the owner delivers it
            self._delivering = True
            self.loop.post(self, self._deliver_held)

    def _call(self, name: str, *args, default=None) -> None:
        """Calls the handler's method `name` (or default): whatever it
        raises ends this connection, never the loop thread (containment:
        the module's docstring)."""
        fn = getattr(self.handler, name, None)
        try:
            if fn is not None:
                fn(self, *args)
            elif default is not None:
                default()
        except BaseException as exc:  # noqa: BLE001 - contained: this connection ends
            self._contain(name, exc)

    def _contain(self, name: str, exc: BaseException) -> None:
        log.error("stream handler %s.%s failed (%s); closing the connection from %s after "
                  "its pending output", type(self.handler).__name__, name,
                  type(exc).__name__, self.peer, exc_info=exc)
        if self._closed:
            return
        self._closing = True
        if not self._out:
            self._close_now()
        else:
            self._sync()                 # reading stops; the output goes, then the FIN

    def _fail(self, exc: OSError | None) -> None:
        if exc is not None and exc.errno not in (errno.ECONNRESET, errno.EPIPE):
            log.warning("connection from %s: %s", self.peer, exc)
        self._out.clear()
        self._close_now(gone=True)

    def _close_now(self, gone: bool = False) -> None:
        """Closes now. Unless the peer is gone (gone: a reset, an error),
        the input it sent and nobody read is read first: a close over
        unread input is a reset on the wire (a client that sent a request
        to a connection its handler refused sees a FIN, as with HTTP)."""
        if self._closed:
            return
        self._closed = True
        if not gone and not self._eof:
            # the FIN first: a byte the peer sends after the read below
            # makes close() a reset, which then comes after the FIN (the
            # peer reads our last bytes and its end); a reset before it
            # was ECONNRESET where the peer waited for our end
            shutdown_write(self.fd)
            read_unread(self.fd)
        self.loop.forget(self)
        # deferred to the leave of whichever thread is inside it
        self.loop.local.th.delete(self.fd)
        on_close = getattr(self.handler, "on_close", None)
        if on_close is not None and not self._proxy_wait:   # on_connect ran
            try:
                on_close(self)
            except BaseException:  # noqa: BLE001 - contained: the connection is closed already
                log.exception("stream handler %s.on_close failed", type(self.handler).__name__)


def shutdown_write(fd: int) -> None:
    """Our FIN on fd now (its buffered output goes first); the fd stays
    open and readable. A peer gone already is no error here."""
    s = socket.socket(fileno=fd)
    try:
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        s.detach()                   # the fd table owns the fd


def read_unread(fd: int, budget: int = 4 << 20) -> None:
    """Reads (and drops) what is waiting on fd, at most `budget` bytes."""
    while budget > 0:
        try:
            data = os.read(fd, READ_SIZE)
        except OSError:
            return
        if not data:
            return
        budget -= len(data)
