"""TCP keep-alive on the master's TCP listeners (issue 35, point 27:
"nothing sets SO_KEEPALIVE: a peer that vanishes without a FIN holds its
connection forever"). The options are set once per listener; Linux copies
them into each accepted connection, which `ss -tnoe` shows as a
timer:(keepalive,...) on the server's side of an established connection.
--tcp-keepalive 0: none. A unix listener takes none and still serves."""
from __future__ import annotations

import re
import socket
import subprocess
import time

import pytest

from test_run import master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(90)


def server_side_timers(port: int) -> str:
    """ss's line(s) for the established connections whose local port is port."""
    done = subprocess.run(["ss", "-tnoe", "state", "established", f"( sport = :{port} )"],
                          capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr
    return "\n".join(done.stdout.splitlines()[1:])


def held_connection(port: int) -> socket.socket:
    """A client connection the worker has accepted (its bytes echoed)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"ping")
    assert s.recv(65536) == b"ping"
    return s


def test_accepted_connections_have_the_keepalive_timer(master):
    m = master("echoapp:Echo", "--interface", "stream", "-w", "1", "--tcp-keepalive", "60",
               ready=1)
    s = held_connection(m.port)
    try:
        line = wait_for(lambda: server_side_timers(m.port), 10, "the connection in ss")
        timer = re.search(r"timer:\((\w+),([^,]+),", line)
        assert timer and timer.group(1) == "keepalive", line
        # idle 60 s: the first probe is due within a minute
        value = timer.group(2)
        secs = float(re.match(r"(?:(\d+)min)?(?:([\d.]+)sec)?", value).group(1) or 0) * 60 + \
            float(re.match(r"(?:(\d+)min)?(?:([\d.]+)sec)?", value).group(2) or 0)
        assert 0 < secs <= 60, value
        with socket.socket(fileno=_listener_dup(m)) as lst:
            assert lst.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert lst.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 60
            assert lst.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 15
            assert lst.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 4
    finally:
        s.close()


def _listener_dup(m) -> int:
    """A duplicate of the master's listening socket (pidfd_getfd's cousin:
    /proc/PID/fd opened), to read its options."""
    import os

    for fd in os.listdir(f"/proc/{m.proc.pid}/fd"):
        try:
            target = os.readlink(f"/proc/{m.proc.pid}/fd/{fd}")
        except OSError:
            continue
        if not target.startswith("socket:"):
            continue
        try:
            pidfd = os.pidfd_open(m.proc.pid)
            dup = __import__("ctypes").CDLL(None, use_errno=True).syscall(438, pidfd, int(fd), 0)
            os.close(pidfd)
        except OSError:
            continue
        if dup < 0:
            continue
        s = socket.socket(fileno=dup)
        try:
            if s.type == socket.SOCK_STREAM and s.family == socket.AF_INET and \
                    s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) and \
                    s.getsockname()[1] == m.port:
                return s.detach()
        except OSError:
            pass
        s.close()
    raise AssertionError("no listening socket of the master on its port")


def test_keepalive_0_sets_none(master):
    m = master("echoapp:Echo", "--interface", "stream", "-w", "1", "--tcp-keepalive", "0",
               ready=1)
    s = held_connection(m.port)
    try:
        line = wait_for(lambda: server_side_timers(m.port), 10, "the connection in ss")
        assert "keepalive" not in line, line
    finally:
        s.close()


def test_default_is_on(master):
    m = master("echoapp:Echo", "--interface", "stream", "-w", "1", ready=1)
    s = held_connection(m.port)
    try:
        line = wait_for(lambda: server_side_timers(m.port), 10, "the connection in ss")
        assert "timer:(keepalive," in line, line
    finally:
        s.close()


def test_unix_listener_still_serves(master, tmp_path):
    path = tmp_path / "ka.sock"
    m = master("echoapp:Echo", "--interface", "stream", "-w", "1", "--tcp-keepalive", "30",
               bind=f"unix:{path}", ready=None)
    m.wait_log(r"worker \d+\.\d+: ready")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(path))
    s.sendall(b"ping")
    assert s.recv(65536) == b"ping"
    s.close()
    assert "tcp_keepalive" not in m.text()         # nothing refused, nothing warned


def test_negative_is_refused(master):
    m = master("echoapp:Echo", "--interface", "stream", "-w", "1", "--tcp-keepalive", "-1",
               ready=None)
    m.proc.wait(timeout=30)
    assert m.proc.returncode != 0
    assert "--tcp-keepalive = '-1': expected `int` >= 0" in m.text(), m.text()
