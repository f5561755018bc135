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
sent, then the connection closes with a FIN (its unread input is read
first, so the client sees a close, not a reset). The loop thread serves on.

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

import errno
import logging
import math
import os
import select
import socket
import time

from sockherd.fdcore import State
from sockherd.worker._http import proxy_parse, proxy_signature

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
READ_SIZE = 64 << 10
# plain ints: an IntFlag & costs an enum construction per test, per event
_READABLE = int(State.POLL_IN | State.POLL_HUP | State.POLL_RDHUP)
_HANGUP = int(State.POLL_HUP | State.POLL_RDHUP)
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
    def pending(self) -> int:
        """Bytes written by the app and not yet taken by the kernel (those
        written from a thread of the app's own and not yet run by the
        owner included)."""
        return len(self._out) + self._queued

    @property
    def input_ended(self) -> bool:
        """The peer shut its sending side (its input read or held)."""
        return self._eof

    @property
    def writing_paused(self) -> bool:
        """Output went past high water and is not back to low water yet
        (set at once, also by a write from a thread of the app's own;
        pause_writing and resume_writing follow on the owner)."""
        return self._writing_paused

    # ---- the loop's side -------------------------------------------------------
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

    # ---- the PROXY protocol header, ahead of the handler's bytes ---------------
    def _proxy_read(self) -> None:
        """One read into the header's buffer, then the parser's verdict (the
        engine's own parser, worker/native/proxy_proto.c)."""
        data = self._read_once()
        if data is None:
            return
        self.last_active = time.monotonic()
        self._proxy_buf += data
        self._proxy_feed(eof=not data)

    def _proxy_feed(self, eof: bool) -> None:
        buf = self._proxy_buf
        if not self._proxy_trusted:
            sig = proxy_signature(buf)
            if sig == 1:
                self._proxy_refuse("a PROXY protocol header from a peer not in proxy_allow_from")
            elif sig == 0 or eof:
                self._proxy_done(None, 0, eof)  # not a header: the handler's bytes
            return
        used, info = proxy_parse(buf, self.loop.proxy.mode)
        if used == 0:
            if eof:                              # a bare connect-and-close: no line
                self._proxy_refuse("a truncated PROXY protocol header" if buf else None)
            return
        if used < 0:
            self._proxy_refuse(info)
            return
        info["peer"] = self.peer
        if not info["local"]:
            self.peer = info["src"]
        self._proxy_done(info, used, eof)

    def _proxy_done(self, info, used: int, eof: bool) -> None:
        """The header is in (or there is none): on_connect, then the bytes
        after it as on_data, then the end of input if it came."""
        rest = bytes(self._proxy_buf[used:])
        self.proxy = info
        self._proxy_buf = None
        self._proxy_wait = False
        self.timer_at = 0.0                      # header_timeout's: the handler's from now
        self.connect()
        if rest and not self._closed:
            self._call("on_data", rest)
        if eof and not self._closed:
            self._eof = self._eof_told = True
            self._sync()
            self._call("on_eof", default=self.close)

    def _proxy_refuse(self, reason: str | None) -> None:
        """Closed over its header (logged, at most a line a second); the
        handler was never told of the connection, nor is of its end."""
        if reason:
            self.loop.proxy.refused(self.peer, reason)
        self._out.clear()
        self._close_now(gone=True)

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
