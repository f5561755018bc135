"""A raw WebSocket client over a plain socket: the handshake as a test
words it, client frames as wsmodel.frame builds them (bad ones included),
and the server's frames read back one by one. Every read has a deadline."""
from __future__ import annotations

import base64
import hashlib
import os
import socket
import struct
import time

from wsmodel import close_payload, frame  # noqa: F401  (re-exported for the tests)

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OPEN: list["RawWs"] = []        # closed by conftest.py's fixture after each test


def accept_of(key: str) -> str:
    return base64.b64encode(hashlib.sha1(key.encode() + GUID).digest()).decode()


class RawWs:
    def __init__(self, addr, *, path="/", key=None, version="13", extra=(), timeout=10.0):
        self.sock = socket.create_connection(addr, timeout=timeout)
        OPEN.append(self)
        self.key = key if key is not None else base64.b64encode(os.urandom(16)).decode()
        self.buf = b""
        lines = [f"GET {path} HTTP/1.1", f"Host: {addr[0]}:{addr[1]}", "Upgrade: websocket",
                 "Connection: Upgrade"]
        if self.key:
            lines.append(f"Sec-WebSocket-Key: {self.key}")
        if version:
            lines.append(f"Sec-WebSocket-Version: {version}")
        lines += list(extra)
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.status, self.headers, self.body = self._head()

    def _fill(self, deadline: float) -> bool:
        self.sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = self.sock.recv(1 << 16)
        except (socket.timeout, ConnectionResetError):
            return False
        if not data:
            return False
        self.buf += data
        return True

    def _head(self):
        deadline = time.monotonic() + 10
        while b"\r\n\r\n" not in self.buf:
            if not self._fill(deadline):
                raise AssertionError(f"no response head: {self.buf!r}")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = [tuple(x.strip() for x in line.split(":", 1)) for line in lines[1:]]
        body = b""
        length = {k.lower(): v for k, v in headers}.get("content-length")
        if status != 101 and length is not None:
            while len(self.buf) < int(length):
                if not self._fill(deadline):
                    break
            body, self.buf = self.buf[:int(length)], self.buf[int(length):]
        return status, headers, body

    def header(self, name: str):
        return {k.lower(): v for k, v in self.headers}.get(name.lower())

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_frame(self, timeout: float = 10.0):
        """(opcode, fin, payload) of the server's next frame, None at EOF."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 2:
                b0, b1 = self.buf[0], self.buf[1]
                assert not b1 & 0x80, "a server frame must not be masked"
                n, at = b1 & 0x7F, 2
                if n == 126 and len(self.buf) >= 4:
                    n, at = struct.unpack_from("!H", self.buf, 2)[0], 4
                elif n == 127 and len(self.buf) >= 10:
                    n, at = struct.unpack_from("!Q", self.buf, 2)[0], 10
                if (b1 & 0x7F) < 126 or at > 2:
                    if len(self.buf) >= at + n:
                        payload = self.buf[at:at + n]
                        self.buf = self.buf[at + n:]
                        return b0 & 0x0F, b0 >> 7, payload
            if not self._fill(deadline):
                if time.monotonic() >= deadline:
                    raise AssertionError("no frame in time")
                return None

    def close_code(self, timeout: float = 10.0):
        """The code of the server's close frame (skipping data and pongs),
        None if the connection ended without one."""
        while True:
            f = self.recv_frame(timeout)
            if f is None:
                return None
            if f[0] == 8:
                return struct.unpack("!H", f[2][:2])[0] if len(f[2]) >= 2 else 1005

    def at_eof(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._fill(deadline):
                return True
            self.buf = b""
        return False

    def close(self):
        self.sock.close()
