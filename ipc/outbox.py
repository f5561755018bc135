"""Pending output of a channel: partial writes, fd batches and the acks that gate them.

The outbox never blocks. write() sends what the socket takes and stops at EAGAIN, or when
the next batch of fds must wait for the peer's ACK; the channel calls it again when the
socket is writable or an ACK came in. Our own ACK frames (for the peer's batches) jump the
queue at the next frame boundary: two peers each sending a large fd set would otherwise
wait for each other's ACK forever.
"""

import socket
from array import array
from collections import deque

from .errors import PeerClosed, ProtocolError
from .fds import close_all
from .frames import ACK_FRAME, encode_frames


class _Unit:
    """One sendmsg() worth of frame bytes with the fds riding on its first byte."""

    __slots__ = ("data", "fds", "sent", "ack_after", "is_ack")

    def __init__(self, data: bytes, fds: list[int], ack_after: bool, is_ack: bool = False):
        self.data = memoryview(data)
        self.fds = fds              # ours (duplicates): closed once the kernel has them
        self.sent = 0
        self.ack_after = ack_after  # another batch of the same message follows
        self.is_ack = is_ack


class Outbox:
    def __init__(self):
        self._units: deque[_Unit] = deque()
        self._current: _Unit | None = None
        self._acks = 0
        self._awaiting_ack = False

    def push(self, payload: bytes, fds: list[int], max_frame: int) -> None:
        """Queue one message; the outbox owns fds from now on and closes them once sent
        or dropped. (Owning them, rather than borrowing the caller's numbers, is what
        makes a send that timed out safe: a number the caller closed and the kernel
        reused would otherwise go out as the wrong file.)"""
        units = encode_frames(payload, fds, max_frame)
        for i, (data, batch) in enumerate(units):
            self._units.append(_Unit(data, batch, ack_after=i < len(units) - 1))

    def push_ack(self) -> None:
        self._acks += 1

    def got_ack(self) -> None:
        if not self._awaiting_ack:
            raise ProtocolError("unexpected ack frame: no fd batch of ours awaits one")
        self._awaiting_ack = False

    @property
    def units_left(self) -> int:
        """Units of our messages not yet completely written (acks not counted)."""
        return len(self._units) + (
            self._current is not None and not self._current.is_ack)

    @property
    def wants_write(self) -> bool:
        return bool(self._current is not None or self._acks
                    or (self._units and not self._awaiting_ack))

    def write(self, sock: socket.socket) -> None:
        """Write until done, EAGAIN, or an ACK is needed. Raises PeerClosed."""
        while True:
            if self._current is None:
                if self._acks:
                    self._acks -= 1
                    self._current = _Unit(ACK_FRAME, [], False, is_ack=True)
                elif self._units and not self._awaiting_ack:
                    self._current = self._units.popleft()
                else:
                    return
            unit = self._current
            try:
                if unit.sent == 0 and unit.fds:
                    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", unit.fds))]
                    n = sock.sendmsg([unit.data], rights, socket.MSG_NOSIGNAL)
                else:
                    n = sock.send(unit.data[unit.sent:], socket.MSG_NOSIGNAL)
            except BlockingIOError:
                return
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise PeerClosed(f"peer closed the channel while we were sending ({exc.strerror})") from None
            if unit.sent == 0:
                # The kernel holds its own references from here on.
                close_all(unit.fds)
                unit.fds = []
            unit.sent += n
            if unit.sent == len(unit.data):
                self._current = None
                if unit.ack_after:
                    self._awaiting_ack = True

    def close(self) -> None:
        """Drop unsent output, closing the fd duplicates we own."""
        units = list(self._units) + ([self._current] if self._current else [])
        self._units.clear()
        self._current = None
        for unit in units:
            close_all(unit.fds)
