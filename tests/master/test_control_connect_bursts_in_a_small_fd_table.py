"""Bursts of connections to both control endpoints never abort a master
with a small fd table (adversarial review of issue 19, after finding 3's
fix). The control guard unbinds the ROUTER and the PUB once fewer than
their floor of fds are free (a 16th of the table), because libzmq's ipc
listener aborts the process at EMFILE. With a hard RLIMIT_NOFILE of 512
(floor 32) two processes of the master's user connecting raw unix sockets
to `control` and to `events` as fast as they can, in rounds, aborted the
master ("Too many open files (src/ipc_listener.cpp:297)", exit 134, every
worker gone) within 2 to 4 rounds in 5 runs out of 6: libzmq's I/O thread
accepts more between the crossing accept and the unbind taking effect
than the floor leaves. A floor of 128 at that limit still aborted it, so
the margin is not the whole story (the unbind and the monitor's events are
asynchronous in libzmq's I/O thread); at 1024 and above eight flooders did
not. Not fixed here: it needs libzmq's accepts bounded by something other
than a race with the loop (a listener of our own, or a separate process)."""
from __future__ import annotations

import multiprocessing
import os
import socket
import time

import pytest

from test_control_odd_and_concurrent_requests import _ask
from test_run import gone, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(180)

NOFILE = 512
ROUNDS = 12


def _flood(path: str, n: int, hold: float) -> None:
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(path)
        except OSError:
            s.close()
            break                          # refused: unbound, or the backlog full
        socks.append(s)
    time.sleep(hold)                       # held: the master's fds stay taken meanwhile
    for s in socks:
        s.close()


@pytest.mark.xfail(strict=True, reason="libzmq accepts control and events clients in its "
                   "I/O thread faster than the guard's unbind takes effect: with a table of "
                   "512 a burst meets EMFILE and libzmq aborts the master")
def test_bursts_to_both_control_endpoints_never_abort_a_small_master(master, tmp_path):
    m = master("-w", "2", nofile=NOFILE)
    run = tmp_path / "run"
    ctx = multiprocessing.get_context("fork")
    for r in range(ROUNDS):
        procs = [ctx.Process(target=_flood, args=(str(run / ep), NOFILE + 100, 0.5))
                 for ep in ("control", "events")]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        assert m.proc.poll() is None, f"round {r + 1}: the master exited\n{m.text()}"
        # the flood's connections closed: ctl is served again
        wait_for(lambda: (_ask(tmp_path, "status", timeout=2) or {}).get("ok"), 30,
                 "ctl answering again")
    assert "Too many open files" not in m.text()
    assert len(os.listdir(f"/proc/{m.proc.pid}/fd")) < NOFILE // 2
