"""Issue 36 review of many masters per host (855ddf3): instance_key names
a master's own directory after proc_name, else its bind setting. Two
socket-activated apps (systemd passes each its socket as fd 3) whose
units give neither a name nor a runtime directory have the same bind
setting (none, or `fd://3`), so the same key: the second is refused as
"served by another running master" although they share nothing."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from test_many_masters_per_host import host  # noqa: F401 (fixture)
from test_run import Master, reap, wait_for

pytestmark = pytest.mark.timeout(120)

APP = 'def app(environ, start_response):\n    start_response("200 OK", [])\n    return [b"x"]\n'


def activated(host, tmp_path: Path, name: str, sock: socket.socket, *args: str) -> Master:
    """A master given `sock` as systemd gives one: fd 3, LISTEN_FDS=1,
    LISTEN_PID its own pid."""
    log = tmp_path / f"{name}.log"
    env = host.env

    def child():
        os.environ.clear()
        os.environ.update(env)
        os.environ.update(LISTEN_FDS="1", LISTEN_PID=str(os.getpid()))
        os.dup2(sock.fileno(), 3)

    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sockherd.master", "run", "app:app",
                                 "-w", "1", "--chdir", str(tmp_path), *args],
                                stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
                                preexec_fn=child, close_fds=False)
    return Master(proc, log)


@pytest.mark.parametrize("args", [(), ("-b", "fd://3")])
def test_two_socket_activated_apps_run_side_by_side(host, tmp_path, args):
    (tmp_path / "app.py").write_text(APP)
    socks = []
    for _ in range(2):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        socks.append(s)
    a = activated(host, tmp_path, "a", socks[0], *args)
    try:
        a.wait_log(r"worker \d+\.\d+: ready", timeout=60)
        b = activated(host, tmp_path, "b", socks[1], *args)
        try:
            wait_for(lambda: b.proc.poll() is not None or "ready, pid" in b.text(), 60,
                     "the second master ready or gone")
            assert b.proc.poll() is None, b.text()
        finally:
            reap(b.proc)
    finally:
        reap(a.proc)
        for s in socks:
            s.close()
