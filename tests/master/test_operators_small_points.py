"""Issue 36 §6, on real masters: a unix-socket bind that nginx (another
user) can connect to; a second instance that never takes a live
instance's pidfile; a worker killed by a signal logged as an error."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import stat
import tempfile
from pathlib import Path

import pytest

from test_run import children, master  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def open_dir():
    """A directory any user may enter (tmp_path is root's 0700)."""
    d = Path(tempfile.mkdtemp(prefix="ops", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="connects as another user: needs root")
def test_a_unix_socket_bind_serves_another_user(master, open_dir):
    """Before: 0660 root:root, and nginx as www-data got a 502 (EACCES)."""
    path = open_dir / "app.sock"
    master("-w", "1", bind=f"unix:{path}", ready=1)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666
    assert as_nobody(str(path)).startswith(b"HTTP/1.1 200 OK"), "nobody could not connect"


def as_nobody(path: str) -> bytes:
    """The first bytes of an answer to a GET over the unix socket at path,
    asked by a child process that runs as nobody (b"" if it could not)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                    # the child: socket calls only
        try:
            os.close(r)
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(10)
            s.connect(path)
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            os.write(w, s.recv(100))
        except BaseException:                       # noqa: BLE001 - b"" says it
            pass
        finally:
            os._exit(0)
    os.close(w)
    try:
        with os.fdopen(r, "rb") as f:
            return f.read()
    finally:
        os.waitpid(pid, 0)


def test_a_second_instance_leaves_a_live_pidfile_alone(master, tmp_path):
    pidfile = tmp_path / "app.pid"
    first = master("-w", "1", "-p", str(pidfile), ready=1)
    assert pidfile.read_text().strip() == str(first.proc.pid)
    second = master("-w", "1", "-p", str(pidfile), "--control", "off", ready=None)
    assert second.proc.wait(timeout=60) == 1
    assert f"holds pid {first.proc.pid}, a running sockherd" in second.text()
    assert pidfile.read_text().strip() == str(first.proc.pid)     # neither taken nor removed


def test_a_stale_pidfile_is_taken(master, tmp_path):
    pidfile = tmp_path / "app.pid"
    pidfile.write_text("999999999\n")
    m = master("-w", "1", "-p", str(pidfile), ready=1)
    assert pidfile.read_text().strip() == str(m.proc.pid)


def test_a_worker_killed_by_a_signal_is_an_error(master):
    m = master("-w", "1", ready=1)
    (worker,) = children(m.proc.pid)
    os.kill(worker, signal.SIGKILL)
    line = m.wait_log(r"\[master \d+\] (\w+) worker 1\.0: exited with signal SIGKILL "
                      r"\(crashed\)")[0]
    assert line == "ERROR"
    # a planned end (a drain at TERM) stays INFO
    m.wait_log(r"worker 1\.0: ready", count=2)           # the replacement
    m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(timeout=60) == 0
    assert re.search(r"INFO worker 1\.0: exited with status 0 \(drained\)", m.text())
