"""Wire format of a channel, and the incremental (sans-I/O) decoder of it.

Some facts about fd passing on an AF_UNIX stream socket, and what they mean for us:

* fds sent with sendmsg() are attached to the first byte of the data of that call, and a
  recvmsg() returns them together with some bytes; but it may also return bytes of earlier
  data in the same call. So received fds go to a FIFO, and a frame claims its fds once its
  header is complete (its first byte carries them, so they have arrived by then).
* The kernel refuses more than SCM_MAX_FD (253) fds per sendmsg, and fds in flight count
  against the sender's RLIMIT_NOFILE (ETOOMANYREFS). So a message carries at most 252 fds
  in its own frame; the rest follow in FDS frames of at most 252, each sent only after the
  receiver acknowledged the previous batch (an ACK frame), which bounds fds in flight.
* A receiver that gives recvmsg() room for exactly 252 fds gets MSG_CTRUNC when a peer
  sends more; the kernel closes the fds that did not fit, we close the ones that did.

A frame is a 12-byte header then `length` payload bytes:

    magic "SH" | version u8 | kind u8 | nfds u32 | length u32     (network byte order)

kind MSG: payload is one msgpack message; nfds is the total number of fds of the message,
          of which min(nfds, 252) ride on this frame.
kind FDS: no payload; nfds (1..252) more fds of the message in progress.
kind ACK: no payload, no fds; "your last batch arrived, send the next one".

Any violation is a ProtocolError: the stream cannot be resynchronised, the decoder closes
every fd it holds and refuses further input.
"""

import struct
from typing import NamedTuple

from .errors import ProtocolError
from .fds import close_all

MAGIC = b"SH"
VERSION = 1
HEADER = struct.Struct("!2sBBII")
KIND_MSG, KIND_FDS, KIND_ACK = 1, 2, 3
FD_BATCH = 252                   # fds per sendmsg: SCM_MAX_FD (253) minus one of margin
MAX_FRAME = 16 * 1024 * 1024     # payload bytes; an assignment with its config is far below
MAX_FDS = 65536                  # fds per message; more than any master holds listeners

ACK_FRAME = HEADER.pack(MAGIC, VERSION, KIND_ACK, 0, 0)


class Delivered(NamedTuple):
    """A complete message frame: its payload and every fd it announced (owned by the
    receiver of this tuple)."""

    payload: bytes
    fds: list[int]


class SendAck(NamedTuple):
    """The peer sent one batch of a large fd set and waits for our ACK frame."""


class GotAck(NamedTuple):
    """The peer acknowledged our last fd batch."""


def encode_frames(payload: bytes, fds, max_frame: int = MAX_FRAME) -> list[tuple[bytes, list[int]]]:
    """The sendmsg() units of one message: (bytes, fds to attach). Between two units the
    sender must wait for an ACK frame."""
    if len(payload) > max_frame:
        raise ValueError(f"message of {len(payload)} bytes exceeds cap {max_frame}")
    fds = list(fds)
    if len(fds) > MAX_FDS:
        raise ValueError(f"message with {len(fds)} fds exceeds cap {MAX_FDS}")
    units = [(HEADER.pack(MAGIC, VERSION, KIND_MSG, len(fds), len(payload)) + payload,
              fds[:FD_BATCH])]
    for start in range(FD_BATCH, len(fds), FD_BATCH):
        batch = fds[start:start + FD_BATCH]
        units.append((HEADER.pack(MAGIC, VERSION, KIND_FDS, len(batch), 0), batch))
    return units


class FrameDecoder:
    """Bytes and fds in, complete frames out. Owns every fd fed to it until it hands them
    out in a Delivered; close() releases what it still holds."""

    def __init__(self, max_frame: int = MAX_FRAME):
        self._max_frame = max_frame
        self._buf = bytearray()
        self._fds: list[int] = []             # received, not yet claimed by a header
        self._header = None                   # (kind, nfds, length, claimed fds)
        self._partial = None                  # [payload, fds so far, fds still to come]
        self._broken = None

    @property
    def at_boundary(self) -> bool:
        """True when no frame or fd batch is half-received."""
        return not (self._buf or self._fds or self._header or self._partial)

    def feed(self, data: bytes, fds=()) -> list:
        """Take data and the fds that came with it; return the events now complete
        (Delivered, SendAck, GotAck), in stream order."""
        self._fds.extend(fds)
        if self._broken:
            self.close()
            self.raise_if_failed()
        self._buf += data
        events: list = []
        try:
            self._drain(events)
        except ProtocolError as exc:
            self._broken = str(exc)
            for event in events:
                if isinstance(event, Delivered):
                    close_all(event.fds)
            self.close()
            raise
        return events

    def eof(self) -> None:
        """The peer closed its end: fine between frames, a ProtocolError inside one."""
        if self.at_boundary:
            return
        if self._partial:
            problem = f"{self._partial[2]} fds of a message still to come"
        elif self._header:
            problem = f"got {len(self._buf)} of {self._header[2]} payload bytes"
        elif self._buf:
            problem = f"got {len(self._buf)} of {HEADER.size} header bytes"
        else:
            problem = f"{len(self._fds)} fds arrived without their frame"
        self.close()
        self._broken = "peer closed mid-frame"
        raise ProtocolError(f"peer closed the channel mid-frame: {problem}")

    def raise_if_failed(self) -> None:
        """Refuse to go on after a violation, before waiting for input that cannot help."""
        if self._broken:
            raise ProtocolError(f"channel already failed: {self._broken}")

    def fail(self, reason: str) -> ProtocolError:
        """The channel found a violation the decoder could not see (MSG_CTRUNC, an
        unexpected ACK): refuse further input as if the decoder had found it itself."""
        self._broken = reason
        self.close()
        return ProtocolError(reason)

    def close(self) -> None:
        """Close every fd still held; called on errors and when the channel closes."""
        held, self._fds = self._fds, []
        if self._header:
            held += self._header[3]
            self._header = None
        if self._partial:
            held += self._partial[1]
            self._partial = None
        self._buf.clear()
        close_all(held)

    def _drain(self, events: list) -> None:
        while True:
            if self._header is None:
                if len(self._buf) < HEADER.size:
                    break
                self._header = self._parse_header(bytes(self._buf[:HEADER.size]))
                del self._buf[:HEADER.size]
            kind, nfds, length, claimed = self._header
            if len(self._buf) < length:
                break
            payload = bytes(self._buf[:length])
            del self._buf[:length]
            self._header = None
            self._complete(kind, nfds, payload, claimed, events)
        if not self._buf and self._header is None and self._fds:
            raise ProtocolError(f"received {len(self._fds)} fds not announced by any frame")

    def _parse_header(self, raw: bytes):
        magic, version, kind, nfds, length = HEADER.unpack(raw)
        if magic != MAGIC:
            raise ProtocolError(f"bad frame magic {magic!r}, expected {MAGIC!r}")
        if version != VERSION:
            raise ProtocolError(f"protocol version {version}, expected {VERSION}")
        if kind == KIND_MSG:
            if length > self._max_frame:
                raise ProtocolError(f"frame of {length} bytes exceeds cap {self._max_frame}")
            if nfds > MAX_FDS:
                raise ProtocolError(f"frame announces {nfds} fds, cap is {MAX_FDS}")
            if self._partial:
                raise ProtocolError(f"message frame while {self._partial[2]} fds of the "
                                    "previous message are still to come")
            want = min(nfds, FD_BATCH)
        elif kind == KIND_FDS:
            if length:
                raise ProtocolError(f"fd batch frame with a {length}-byte payload")
            if not self._partial:
                raise ProtocolError("fd batch frame outside a message")
            want = min(self._partial[2], FD_BATCH)
            if nfds != want:
                raise ProtocolError(f"fd batch frame announces {nfds} fds, expected {want}")
        elif kind == KIND_ACK:
            if length or nfds:
                raise ProtocolError("ack frame with payload or fds")
            want = 0
        else:
            raise ProtocolError(f"unknown frame kind {kind}")
        if len(self._fds) < want:
            if nfds > want:
                raise ProtocolError(f"frame header announces {nfds} fds, received "
                                    f"{len(self._fds)} of its first batch of {want}")
            raise ProtocolError(f"frame header announces {nfds} fds, received {len(self._fds)}")
        claimed, self._fds = self._fds[:want], self._fds[want:]
        return kind, nfds, length, claimed

    def _complete(self, kind, nfds, payload, claimed, events) -> None:
        if kind == KIND_ACK:
            events.append(GotAck())
        elif kind == KIND_MSG and nfds == len(claimed):
            events.append(Delivered(payload, claimed))
        elif kind == KIND_MSG:
            self._partial = [payload, claimed, nfds - len(claimed)]
            events.append(SendAck())
        else:
            self._partial[1] += claimed
            self._partial[2] -= len(claimed)
            if self._partial[2]:
                events.append(SendAck())
            else:
                payload, fds, _ = self._partial
                self._partial = None
                events.append(Delivered(payload, fds))
