"""Issue 35 review: `timeout` for an ASGI app (point 7) missed a loop
blocked in a pass that asyncio's own _run_once runs. The C runner
(worker/aio_native/runner.c runner_once) stamps the loop thread busy
around the ready pass it runs itself, but when the timer heap holds more
than 100 timers, over half of them cancelled, it hands that one iteration
to asyncio's base _run_once ("asyncio's purge, this once"), which runs the
ready callbacks with no stamp. Cancelled timers are what every
asyncio.wait_for / asyncio.timeout that finished early leaves behind, so a
busy app goes through such passes all the time; a callback that blocks in
one of them (here: time.sleep(8) with `--timeout 3`) is never noticed.

A real master with one real worker on loopback; every wait a poll with a
deadline (as test_request_timeout_asgi.py, of which this is the twin).

The same holds for asyncio's debug mode (loop.set_debug(True),
PYTHONASYNCIODEBUG=1, python -X dev): aio.py's _fast() then takes the C
runner off altogether, and no pass is stamped."""
from __future__ import annotations

import socket

import pytest

from test_request_timeout import pid_of
from test_run import gone, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

PURGE_APP = """
import asyncio, os, time

def nothing():
    pass

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    if scope["path"] == "/block":
        loop = asyncio.get_running_loop()
        # 200 far timers, the 150 latest cancelled (the heap's top stays
        # live): the next iteration is asyncio's purge pass
        timers = [loop.call_later(1000 + i, nothing) for i in range(200)]
        for t in timers[50:]:
            t.cancel()
        await asyncio.sleep(0)          # the rest of this step runs in that pass
        time.sleep(8)                   # blocks the loop thread's asyncio loop
    if scope["path"] == "/debug":
        # asyncio's debug mode (also PYTHONASYNCIODEBUG=1, -X dev): the
        # loop's C parts are taken off (aio.py _fast), the runner with them
        asyncio.get_running_loop().set_debug(True)
        await asyncio.sleep(0)
        time.sleep(8)
    if scope["path"] == "/debug-await":
        asyncio.get_running_loop().set_debug(True)
        await asyncio.sleep(4.5)        # awaits, in debug mode: never stuck
    body = b"%d" % os.getpid()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})
"""


@pytest.mark.parametrize("path", ["/block", "/debug"])
def test_a_loop_blocked_in_asyncios_own_pass_gets_its_worker_replaced(master, tmp_path, path):
    (tmp_path / "purgeapp.py").write_text(PURGE_APP)
    m = master("purgeapp:app", "--interface", "asgi", "-w", "1", "--timeout", "3",
               "--hard-stop-after", "4", ready=1)
    old = pid_of(m.port)
    stuck = socket.create_connection(("127.0.0.1", m.port), timeout=30)
    try:
        stuck.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
        line = m.wait_log(r"request GET %s in the app" % path + r" for (\d+\.\d)s on thread \d+ "
                          r"\(timeout 3s\); its stack:", timeout=7)[0]
        assert 3.0 <= float(line) < 8.0
        new = int(m.wait_log(r"worker 1\.0: replaced by pid (\d+); draining pid %d" % old,
                             timeout=10)[0])
        wait_for(lambda: gone(old), 30, f"the blocked worker {old} gone")
        assert pid_of(m.port) == new
    finally:
        stuck.close()


def test_a_debugging_loop_that_awaits_longer_than_timeout_is_left_alone(master, tmp_path):
    """The debug-mode stamp (aio.py PollerSelector.select) brackets the
    callbacks only, not the turn's wait."""
    (tmp_path / "purgeapp.py").write_text(PURGE_APP)
    m = master("purgeapp:app", "--interface", "asgi", "-w", "1", "--timeout", "3", ready=1)
    old = pid_of(m.port)
    c = socket.create_connection(("127.0.0.1", m.port), timeout=30)
    try:
        c.sendall(b"GET /debug-await HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while not got.endswith(b"%d" % old):
            chunk = c.recv(65536)
            assert chunk, got
            got += chunk
        assert got.startswith(b"HTTP/1.1 200")
    finally:
        c.close()
    assert "timeout:" not in m.text() and pid_of(m.port) == old
