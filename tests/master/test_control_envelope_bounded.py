"""The control ROUTER holds no more of a request than its bounds (issue 19
§5: `frames[:-1]` was taken as the envelope whatever its count and size,
held and echoed back: one message of 80 frames of 10 MB took the master to
1.6 GB, and a client that never reads pinned up to SNDHWM (1000) such
replies).

The hostile clients here speak ZMTP 3.0 by hand over the ipc socket, as any
process of the master's user can: no libzmq on their side buffering or
reading replies for them, and a 10 MB frame streamed from one small buffer.
"""
from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import time

import pytest

from test_control_odd_and_concurrent_requests import Client, _ask
from test_run import master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(180)

MB = 1 << 20


class RawDealer:
    """A ZMTP 3.0 DEALER written by hand: the NULL handshake, then frames."""

    def __init__(self, path: str, rcvbuf: int = 0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(60)
        self.sock.connect(path)
        greeting = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") \
            + b"\0" + b"\0" * 31
        prop = b"\x0bSocket-Type" + struct.pack("!I", 6) + b"DEALER"
        ready = b"\x05READY" + prop
        self.sock.sendall(greeting + b"\x04" + bytes([len(ready)]) + ready)
        # the master's greeting and READY before any frame of ours: libzmq
        # fails a handshake whose peer's frames came with it (UNEXPECTED_COMMAND)
        self._read(64)
        flags, size = self._read(2)
        assert flags == 4, f"not a short command: {flags}"
        assert self._read(size).startswith(b"\x05READY")

    def _read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            got = self.sock.recv(n - len(out))
            assert got, "the master closed the connection during the handshake"
            out += got
        return out

    @staticmethod
    def header(size: int, more: bool) -> bytes:
        flags = 1 if more else 0
        if size < 256:
            return bytes([flags, size])
        return bytes([flags | 2]) + struct.pack("!Q", size)

    @staticmethod
    def frame(data: bytes, more: bool) -> bytes:
        return RawDealer.header(len(data), more) + data

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _status_kb(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {key} for {pid}")


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _quiet(pid: int, timeout: float = 60.0) -> None:
    """Waits until the master has used no CPU for 0.5 s in a row: it has
    read and answered everything it was sent."""
    last = [_cpu_ticks(pid), time.monotonic()]

    def still():
        now, ticks = time.monotonic(), _cpu_ticks(pid)
        if ticks != last[0]:
            last[:] = [ticks, now]
            return False
        return now - last[1] >= 0.5

    wait_for(still, timeout, "the master idle again")


def _idle_master(master, tmp_path):
    """(a one-worker master answering ctl and idle, its pid, its control path)."""
    m = master("-w", "1", ready=1)
    assert _ask(tmp_path, "status")["result"]["pid"] == m.proc.pid
    _quiet(m.proc.pid)
    return m, m.proc.pid, str(tmp_path / "run" / "control")


def test_an_80_frame_envelope_of_10_mb_frames_is_cut_and_the_master_stays_small(
        master, tmp_path):
    """Finding 5: [80 x 10 MB frames, a request] from one client. The first
    10 MB frame is over ZMQ_MAXMSGSIZE: libzmq closes that connection on
    reading its length, before holding any of it; the master's peak RSS
    stays within a few MB, and ctl goes on answering."""
    m, pid, path = _idle_master(master, tmp_path)
    peak = _status_kb(pid, "VmHWM")
    chunk = b"e" * MB
    with RawDealer(path) as c:
        try:
            for _ in range(80):
                c.sock.sendall(RawDealer.header(10 * MB, more=True))
                for _ in range(10):
                    c.sock.sendall(chunk)
            c.sock.sendall(c.frame(b'{"command": "status"}', more=False))
        except (BrokenPipeError, ConnectionResetError):
            pass                             # cut by the master: what we want
        _quiet(pid)
    grown = (_status_kb(pid, "VmHWM") - peak) / 1024
    print(f"80 x 10 MB envelope: master peak RSS {peak / 1024:.0f} MB, grew {grown:.1f} MB")
    assert grown < 8, f"the master's peak RSS grew by {grown:.0f} MB"
    assert m.proc.poll() is None
    assert _ask(tmp_path, "status")["result"]["pid"] == pid


def test_a_client_flooding_requests_and_never_reading_pins_nothing(master, tmp_path):
    """Finding 5: 3,000 requests, each behind a 60 KB envelope frame (what
    was echoed back in every reply), from a client that never reads its
    socket (a small receive buffer): refused, and the master's RSS stays
    flat (the replies were kept up to SNDHWM = 1000 each: 60 MB)."""
    m, pid, path = _idle_master(master, tmp_path)
    before = _status_kb(pid, "VmRSS")
    one = RawDealer.frame(b"x" * 60000, True) + \
        RawDealer.frame(b'{"command": "status"}', False)
    with RawDealer(path, rcvbuf=4096) as c:
        for _ in range(30):
            c.sock.sendall(one * 100)
        _quiet(pid)
        grown = (_status_kb(pid, "VmRSS") - before) / 1024
        print(f"3000 requests never read: master RSS {before / 1024:.0f} MB, grew {grown:.1f} MB")
        assert grown < 8, f"the master's RSS grew by {grown:.0f} MB"
        # meanwhile others are answered
        assert _ask(tmp_path, "status")["result"]["pid"] == pid
    assert m.proc.poll() is None


def test_envelopes_of_more_than_one_frame_or_of_a_large_frame_are_refused(master, tmp_path):
    """The envelope is the routing id and at most one frame of at most 255
    bytes (a REQ client's empty delimiter): any other shape gets a clear
    error to what fits of it, and nothing else is echoed back."""
    m = master("-w", "1", ready=1)
    status = b'{"command": "status"}'
    with Client(tmp_path) as c:
        for frames, kept in [([b"a", b"b", b"c", status], [b"a"]),
                             ([b"e" * 256, status], []),
                             ([b"e" * 60000] * 5 + [status], []),
                             ([b""] * 80 + [status], [b""])]:
            c.send(*frames)
            assert c.sock.poll(10000), f"no reply to {len(frames)} frames"
            reply = c.sock.recv_multipart()
            assert reply[:-1] == kept, [len(f) for f in reply]
            got = json.loads(reply[-1])
            assert got["ok"] is False, got
            assert f"request of {len(frames)} frames after the routing id" in got["error"]
            assert "at most one envelope frame of at most 255 bytes" in got["error"]
        # a DEALER's own envelope frame of <= 255 bytes comes back with the reply
        c.send(b"t" * 255, status)
        assert c.sock.poll(10000)
        reply = c.sock.recv_multipart()
        assert reply[0] == b"t" * 255 and json.loads(reply[1])["ok"] is True
    assert m.wait_log(r"control: refused 1 request\(s\) since the last such line; the "
                      r"latest: request of 4 frames")
    assert "refused 2 request" not in m.text()        # one line a minute at most
    # `sockherd ctl` (REQ) works as ever
    done = subprocess.run([sys.executable, "-m", "sockherd.master", "ctl", "--runtime-dir",
                           str(tmp_path / "run"), "--json", "status"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout)["pid"] == m.proc.pid, done


def test_a_request_over_the_cap_gets_an_error_and_an_absurd_one_is_cut(master, tmp_path):
    """Up to 4 x 64 KiB a request too large gets the clear error; a frame
    past ZMQ_MAXMSGSIZE (256 KiB) is cut by libzmq: no reply, the
    connection closed, the master unaffected."""
    m = master("-w", "1", ready=1)
    import zmq
    with Client(tmp_path, zmq.REQ) as req:
        req.sock.send(b'{"command": "status"}' + b" " * 200000)
        assert req.sock.poll(10000), "no reply to 200 KB"
        assert json.loads(req.sock.recv())["error"] == "request of 200021 bytes: at most 65536"
    with RawDealer(str(tmp_path / "run" / "control")) as c:
        c.sock.settimeout(30)
        try:
            c.sock.sendall(c.frame(b" " * (300 * 1024), more=False))
            while c.sock.recv(65536):
                pass                                 # EOF
        except (BrokenPipeError, ConnectionResetError):
            pass                                     # cut while sending
    assert _ask(tmp_path, "status")["result"]["pid"] == m.proc.pid
