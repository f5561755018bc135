"""The client side of the conformance cases: a frame writer that can break
every rule a client must keep (no mask, RSV bits, reserved opcodes, long
control frames, any length encoding), a handshake over a plain socket, and
a reader that gathers the server's answer to a case: its messages, its
close frame, and whether it then closed the TCP connection.

Every read has a deadline; a case ends with the server's close (or EOF),
never with a wait for something not to happen."""
from __future__ import annotations

import base64
import os
import socket
import struct
import time
from dataclasses import dataclass, field

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MASK = b"\x9e\x02\x51\xc7"
OPEN: list["Client"] = []            # closed after each case (conftest.py)

CONT, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


def frame(opcode: int, payload: bytes = b"", *, fin: bool = True, rsv: int = 0,
          masked: bool = True, width: int | None = None) -> bytes:
    """One client frame. width: the length field's encoding, 7, 16 or 64
    bits (None: the shortest the payload allows, as RFC 6455 5.2 asks)."""
    n = len(payload)
    if width is None:
        width = 7 if n < 126 else 16 if n < 1 << 16 else 64
    first = (fin << 7) | (rsv << 4) | opcode
    maskbit = 0x80 if masked else 0
    if width == 7:
        head = bytes((first, maskbit | n))
    elif width == 16:
        head = bytes((first, maskbit | 126)) + struct.pack("!H", n)
    else:
        head = bytes((first, maskbit | 127)) + struct.pack("!Q", n)
    if not masked:
        return head + payload
    # unmasking by whole 32-bit words through int.from_bytes: fast enough
    # for the 64 KiB payloads of the length cases
    pad = (-n) % 4
    words = int.from_bytes(payload + b"\0" * pad, "big")
    key = int.from_bytes(MASK * ((n + pad) // 4), "big") if n else 0
    body = (words ^ key).to_bytes(n + pad, "big")[:n] if n else b""
    return head + MASK + body


def close_frame(code: int | None = 1000, reason: bytes = b"") -> bytes:
    return frame(CLOSE, b"" if code is None else struct.pack("!H", code) + reason)


@dataclass
class Outcome:
    """What the server did in answer: its complete messages as (opcode,
    payload), pongs included, in order; its close code (None: no close
    frame; 1005: an empty one) and reason; whether it closed the TCP
    connection after."""
    frames: list = field(default_factory=list)
    compressed: list = field(default_factory=list)   # per message: RSV1 on its first frame
    close: int | None = None
    reason: bytes = b""
    eof: bool = False

    def __repr__(self) -> str:
        names = {TEXT: "text", BINARY: "binary", PING: "ping", PONG: "pong"}
        shown = ", ".join(f"{names.get(op, op)} {len(p)}B" for op, p in self.frames[:6])
        more = f" +{len(self.frames) - 6}" if len(self.frames) > 6 else ""
        close = "no close frame" if self.close is None else f"close {self.close}"
        return f"<{close}, {'EOF' if self.eof else 'no EOF'}, frames [{shown}{more}]>"

    @property
    def messages(self):
        return [(op, p) for op, p in self.frames if op in (TEXT, BINARY)]

    @property
    def pongs(self):
        return [p for op, p in self.frames if op == PONG]


class Client:
    def __init__(self, addr, *, key: str | None = None, version: str | None = "13",
                 timeout: float = 10.0, headers: tuple = ()):
        self.sock = socket.create_connection(addr, timeout=timeout)
        OPEN.append(self)
        self.timeout = timeout
        self.key = base64.b64encode(os.urandom(16)).decode() if key is None else key
        self.pending = b""
        self.parts, self.opcode = [], None       # a fragmented server message so far
        head = [f"GET /echo HTTP/1.1", f"Host: {addr[0]}:{addr[1]}", "Upgrade: websocket",
                "Connection: Upgrade"]
        if self.key:
            head.append(f"Sec-WebSocket-Key: {self.key}")
        if version is not None:
            head.append(f"Sec-WebSocket-Version: {version}")
        head += list(headers)               # extra request header lines
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        self.status, self.headers = self._response_head()

    def __repr__(self) -> str:
        return f"<response {self.status}>"

    def _more(self, deadline: float) -> bool:
        """Reads what the server sent next; False at EOF, reset or deadline."""
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(1 << 17)
        except (socket.timeout, ConnectionError):
            return False
        self.pending += data
        return bool(data)

    def _response_head(self):
        deadline = time.monotonic() + self.timeout
        while b"\r\n\r\n" not in self.pending:
            if not self._more(deadline):
                raise AssertionError(f"no complete response head: {self.pending!r}")
        head, self.pending = self.pending.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return int(lines[0].split()[1]), headers

    def send(self, *frames: bytes) -> "Client":
        self.sock.sendall(b"".join(frames))
        return self

    def _frame(self, deadline: float):
        """(fin, opcode, payload) of the server's next frame; None at EOF."""
        while True:
            buf = self.pending
            if len(buf) >= 2:
                assert not buf[1] & 0x80, "the server masked a frame (RFC 6455 5.1)"
                n, at = buf[1] & 0x7F, 2
                if n == 126:
                    n, at = (struct.unpack_from("!H", buf, 2)[0], 4) if len(buf) >= 4 else (-1, 4)
                elif n == 127:
                    n, at = (struct.unpack_from("!Q", buf, 2)[0], 10) if len(buf) >= 10 else (-1, 10)
                if n >= 0 and len(buf) >= at + n:
                    self.pending = buf[at + n:]
                    self.rsv = buf[0] >> 4 & 7
                    return buf[0] >> 7, buf[0] & 0x0F, buf[at:at + n]
            if not self._more(deadline):
                assert time.monotonic() < deadline, "the server neither answered nor closed"
                return None

    def outcome(self, out: Outcome | None = None, *, messages: int | None = None,
                timeout: float | None = None) -> Outcome:
        """The server's frames, added to `out`, up to its close frame, then
        whether the TCP connection ends (RFC 6455 7.1.1: the server closes
        it first). messages=N: returns early once out holds N messages."""
        deadline = time.monotonic() + (timeout or self.timeout)
        out = out or Outcome()
        while messages is None or len(out.messages) < messages:
            f = self._frame(deadline)
            if f is None:
                out.eof = True
                return out
            fin, op, payload = f
            if op == CLOSE:
                out.close = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                out.reason = payload[2:]
                while self._more(deadline):
                    self.pending = b""         # whatever follows the close frame
                out.eof = time.monotonic() < deadline
                return out
            if op >= 8:
                out.frames.append((op, payload))
                continue
            if not self.parts:
                self.first_rsv = self.rsv
            self.parts.append(payload)
            self.opcode = op or self.opcode
            if fin:
                out.frames.append((self.opcode, b"".join(self.parts)))
                out.compressed.append(self.first_rsv == 4)
                self.parts = []
        return out

    def close(self) -> None:
        self.sock.close()


def exchange(addr, *frames: bytes, close: bool = True, wait: int = 0) -> Outcome:
    """Opens a WebSocket, sends frames and returns the server's answer.
    With close (the default) the client then closes with 1000, after the
    first `wait` messages came back, as Autobahn's cases wait for the echo
    they expect before closing: a close sent right behind a message may be
    answered before the app's echo, which must then not be sent (5.5.1)."""
    c = Client(addr)
    assert c.status == 101, c.status
    c.send(*frames)
    out = c.outcome(messages=wait) if wait else Outcome()
    if close and out.close is None and not out.eof:
        c.send(close_frame(1000))
    return out if out.close is not None or out.eof else c.outcome(out)
