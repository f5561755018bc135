"""A message channel over a connected AF_UNIX stream socket.

Two ways to drive the same object:

* blocking, for the worker bootstrap and the hand-off client: send(msg, fds, timeout) and
  recv(timeout), each a poll() loop with a deadline;
* non-blocking, from the master's poll loop: register fileno(); when readable call
  read_available() then next_message() until it returns None; post(msg, fds) queues a
  message and flush() writes it, again whenever wants_write says so.

The socket is switched to O_NONBLOCK in both cases: the blocking calls are built on the
non-blocking ones, so a large fd set can wait for an ACK while the peer's own messages keep
arriving (they are kept in the inbox for recv()/next_message()).

Ownership: fds of a received message belong to the caller. post() and send() queue
duplicates of the fds they are given: the caller keeps its own copies and may close them
at once.
"""

import os
import select
import socket
import time
from array import array
from collections import deque
from typing import NamedTuple

from . import messages
from .errors import ChannelTimeout, MessageError, PeerClosed, ProtocolError
from .fds import close_all, dup_all
from .frames import FD_BATCH, HEADER, MAX_FRAME, Delivered, FrameDecoder, GotAck, SendAck
from .outbox import Outbox

_RECV_BYTES = 256 * 1024
# Room for exactly one batch: a peer sending more gets MSG_CTRUNC instead of being trusted.
_CMSG_ROOM = socket.CMSG_SPACE(FD_BATCH * array("i").itemsize)
_READS_PER_CALL = 64   # fairness in the master loop; poll() is level-triggered anyway


class Received(NamedTuple):
    """A message and the fds that came with it (the caller owns and must close them)."""

    msg: object
    fds: list[int]

    def close_fds(self) -> None:
        close_all(self.fds)


class Channel:
    def __init__(self, sock: socket.socket, *, max_frame: int = MAX_FRAME,
                 max_frame_in: int | None = None, takes_fds: bool = True,
                 read_bytes: int | None = None):
        """max_frame caps the messages we send, max_frame_in (default: the same) the
        ones the peer may send: a larger frame is refused from its header, before its
        payload is buffered. takes_fds=False: a peer that sends any fd is refused, and
        the kernel discards them (no room for ancillary data: MSG_CTRUNC), so they never
        enter our fd table. read_bytes: the most one read_available() reads (one
        recvmsg of at most that), so a peer flooding small messages costs a bounded
        amount of work per call; a poll loop is woken again for the rest."""
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
            raise ValueError("a channel needs a connected AF_UNIX stream socket")
        sock.setblocking(False)
        self._sock = sock
        self._max_frame = max_frame
        max_in = max_frame if max_frame_in is None else max_frame_in
        self._decoder = FrameDecoder(max_in)
        # never more than one largest frame per read: a peer's oversized or
        # flooding input is refused before much of it is held
        self._recv_bytes = min(_RECV_BYTES, HEADER.size + max_in, read_bytes or _RECV_BYTES)
        self._reads_per_call = 1 if read_bytes else _READS_PER_CALL
        self._cmsg_room = _CMSG_ROOM if takes_fds else 0
        self._outbox = Outbox()
        self._inbox: deque[Delivered] = deque()
        self._eof = False

    @classmethod
    def pair(cls, **kwargs) -> tuple["Channel", "Channel"]:
        """Two connected channels (socketpair, close-on-exec)."""
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        return cls(a, **kwargs), cls(b, **kwargs)

    @classmethod
    def from_fd(cls, fd: int, **kwargs) -> "Channel":
        """Channel over an inherited socketpair end (the worker's, passed with pass_fds);
        takes ownership of fd and makes it close-on-exec again."""
        sock = socket.socket(fileno=fd)
        sock.set_inheritable(False)
        try:
            return cls(sock, **kwargs)
        except BaseException:
            sock.close()
            raise

    @classmethod
    def connect(cls, path: str, timeout: float | None = None, **kwargs) -> "Channel":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(path)
        except BaseException:
            sock.close()
            raise
        return cls(sock, **kwargs)

    def fileno(self) -> int:
        return self._sock.fileno()

    @property
    def socket(self) -> socket.socket:
        return self._sock

    @property
    def eof(self) -> bool:
        """The peer closed its end (messages may still be waiting in the inbox)."""
        return self._eof

    # -- non-blocking side -------------------------------------------------------------

    def post(self, msg, fds=()) -> None:
        """Queue msg with duplicates of fds and write what the socket takes now."""
        self._queue(msg, fds)
        self.flush()

    def _queue(self, msg, fds) -> None:
        payload = messages.encode(msg)
        dups = dup_all(fds)
        try:
            self._outbox.push(payload, dups, max_frame=self._max_frame)
        except BaseException:
            close_all(dups)
            raise

    def flush(self) -> bool:
        """Write pending output; True when none of our messages is left unsent."""
        self._write()
        return not self._outbox.units_left

    @property
    def wants_write(self) -> bool:
        """Register for POLLOUT while this is true."""
        return self._outbox.wants_write

    @property
    def pending(self) -> int:
        """Messages read and not yet taken (next_message): a poll loop must
        not wait for the socket while any is left, the socket's readiness
        does not show them (a recv() that read two takes one)."""
        return len(self._inbox)

    def read_available(self) -> int:
        """Read what the socket holds without blocking; return how many messages wait in
        the inbox. Raises ProtocolError (channel dead) or PeerClosed (EOF, inbox empty)."""
        self._decoder.raise_if_failed()
        for _ in range(self._reads_per_call):
            if not self._read_once():
                break
        if self._outbox.wants_write:
            try:
                self._write()                    # acks we owe, batches the peer just acked
            except PeerClosed:
                if not self._inbox:
                    raise    # else: deliver what the peer said before leaving first
        if self._eof and not self._inbox:
            raise PeerClosed("peer closed the channel")
        return len(self._inbox)

    def next_message(self) -> Received | None:
        """The next complete message, or None. A malformed one raises MessageError (its
        fds closed) and the channel carries on with the following ones."""
        if not self._inbox:
            return None
        payload, fds = self._inbox.popleft()
        try:
            msg = messages.decode(payload)
            want = messages.expected_fds(msg)
            if want != len(fds):
                tag = type(msg).__struct_config__.tag
                raise MessageError(f"{tag} message carries {len(fds)} fds, expects {want}")
        except BaseException:
            close_all(fds)
            raise
        return Received(msg, fds)

    # -- blocking side -----------------------------------------------------------------

    def send(self, msg, fds=(), timeout: float | None = None) -> None:
        """Send msg and its fds, waiting for the peer's ACKs between fd batches. On
        ChannelTimeout the message stays queued (with its own fd duplicates) and goes out
        with the next send() or flush()."""
        self._queue(msg, fds)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._write()
            if not self._outbox.units_left:
                return
            if self._eof:
                raise PeerClosed("peer closed the channel before our message was sent")
            # Either the socket buffer is full or we wait for an ACK: both need poll().
            events = self._wait(deadline, "send")
            if events & (select.POLLIN | select.POLLHUP | select.POLLERR):
                self.read_available()

    def recv(self, timeout: float | None = None) -> Received:
        """The next message, waiting up to timeout seconds (None: forever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._inbox:
                return self.next_message()
            self._decoder.raise_if_failed()
            if self._eof:
                raise PeerClosed("peer closed the channel")
            self._wait(deadline, "receive")
            self.read_available()            # writes what we owe (ACKs) too

    def close(self) -> None:
        """Close the socket and every fd the channel still owns."""
        self._decoder.close()
        self._outbox.close()
        while self._inbox:
            close_all(self._inbox.popleft().fds)
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- internals -----------------------------------------------------------------------

    def _wait(self, deadline, what: str) -> int:
        poller = select.poll()
        mask = select.POLLIN
        if self._outbox.wants_write:
            mask |= select.POLLOUT
        poller.register(self._sock, mask)
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise ChannelTimeout(f"timed out waiting to {what}")
        ready = poller.poll(None if remaining is None else max(1, int(remaining * 1000)))
        if not ready:
            raise ChannelTimeout(f"timed out waiting to {what}")
        return ready[0][1]

    def _write(self) -> None:
        """Write what the outbox may send now; PeerClosed if the peer is gone (EPIPE,
        ECONNRESET). Gone, it can no longer finish a message it was sending us: the next
        batch of fds waits for an ACK it will never read, and no more bytes come once it
        has closed. So read what it sent before leaving, then settle the decoder as at EOF:
        a half-received message is a ProtocolError, raised after its fds are closed
        (errors.py), not left to close()."""
        try:
            self._outbox.write(self._sock)
            return
        except PeerClosed as exc:
            gone = exc
        for _ in range(_READS_PER_CALL):
            if not self._read_once():        # EOF mid-frame raises here, fds closed
                break
        if not self._decoder.at_boundary:
            self._eof = True
            self._decoder.eof()              # raises ProtocolError, fds closed
        raise gone

    def _read_once(self) -> bool:
        """One recvmsg(); False when nothing more is to be read now."""
        if self._eof:
            return False
        try:
            data, ancdata, flags, _ = self._sock.recvmsg(
                self._recv_bytes, self._cmsg_room, socket.MSG_CMSG_CLOEXEC)
        except BlockingIOError:
            return False
        except ConnectionResetError:
            data, ancdata, flags = b"", [], 0
        except OSError:
            # Any other failure leaves us unsure what the kernel consumed: the stream is
            # lost. Release what a half-received message holds and give the error as is.
            self._decoder.fail("recvmsg() failed")
            raise
        fds = _fds_from(ancdata)
        if flags & socket.MSG_CTRUNC:
            close_all(fds)
            if not self._cmsg_room:
                raise self._decoder.fail("peer sent fds on a channel that takes none "
                                         "(the kernel discarded them)")
            raise self._decoder.fail(f"ancillary data truncated (MSG_CTRUNC): peer sent "
                                     f"more than {FD_BATCH} fds in one sendmsg")
        if not data:
            close_all(fds)   # cannot happen on a stream socket; never leak anyway
            self._eof = True
            self._decoder.eof()
            return False
        events = self._decoder.feed(data, fds)
        for i, event in enumerate(events):
            try:
                if isinstance(event, Delivered):
                    self._inbox.append(event)
                elif isinstance(event, SendAck):
                    self._outbox.push_ack()
                elif isinstance(event, GotAck):
                    self._outbox.got_ack()
            except ProtocolError as exc:
                for later in events[i + 1:]:
                    if isinstance(later, Delivered):
                        close_all(later.fds)
                raise self._decoder.fail(str(exc)) from None
        return True


def _fds_from(ancdata) -> list[int]:
    """Every fd in SCM_RIGHTS control messages (others are ignored: we enable none)."""
    fds = array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % fds.itemsize
            fds.frombytes(data[:usable])
    return list(fds)
