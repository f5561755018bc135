"""`timeout` for an ASGI app (issue 35 point 7): a loop thread blocked in
the app (time.sleep in a coroutine: the whole asyncio loop stopped) is
noticed as a WSGI handler is (test_request_timeout.py): its request and
the app's stack logged, the worker replaced (a new one READY first, the
stuck one drained and killed at hard_stop_after). Before, no busy stamp
was ever written for a loop thread running asyncio callbacks (the stamp
was the engine's, per WSGI handler), so `--timeout 3` never fired and
the worker stayed blocked for the whole 8 s sleep.

A real master with one real worker on loopback; every wait a poll with a
deadline. A request that awaits longer than `timeout` is no stuck loop (the
thread waits in its poll, unstamped): it is left alone."""
from __future__ import annotations

import re
import socket

import pytest

from test_request_timeout import pid_of
from test_run import gone, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

BLOCK_APP = """
import asyncio, os, time

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    if scope["path"] == "/block":
        await asyncio.sleep(0)
        time.sleep(8)                   # blocks the loop thread's asyncio loop
    if scope["path"] == "/await":
        await asyncio.sleep(4.5)        # a long request that awaits: never stuck
    body = b"%d" % os.getpid()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})
"""


def test_a_blocked_asyncio_loop_gets_its_worker_replaced(master, tmp_path):
    (tmp_path / "blockapp.py").write_text(BLOCK_APP)
    m = master("blockapp:app", "--interface", "asgi", "-w", "1", "--timeout", "3",
               "--hard-stop-after", "4", ready=1)
    old = pid_of(m.port)
    stuck = socket.create_connection(("127.0.0.1", m.port), timeout=30)
    try:
        stuck.sendall(b"GET /block?x=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        line = m.wait_log(r"request GET /block in the app for (\d+\.\d)s on thread \d+ "
                          r"\(timeout 3s\); its stack:", timeout=7)[0]
        assert 3.0 <= float(line) < 8.0
        text = m.text()
        # the app's own line, in the stack of the blocked loop thread
        assert re.search(r'blockapp\.py", line 9, in app\n\s+time\.sleep\(8\)', text), text
        m.wait_log(r"worker 1\.0: timeout: request GET /block in the app for \d+\.\ds "
                   r"\(timeout 3s\): starting its replacement", timeout=5)
        new = int(m.wait_log(r"worker 1\.0: replaced by pid (\d+); draining pid %d" % old,
                             timeout=10)[0])
        wait_for(lambda: gone(old), 30, f"the blocked worker {old} gone")
        assert pid_of(m.port) == new
        assert len(re.findall(r"starting its replacement", m.text())) == 1
    except BaseException:
        print(m.text())
        raise
    finally:
        stuck.close()


def test_a_request_that_awaits_longer_than_timeout_is_left_alone(master, tmp_path):
    (tmp_path / "blockapp.py").write_text(BLOCK_APP)
    m = master("blockapp:app", "--interface", "asgi", "-w", "1", "--timeout", "3", ready=1)
    old = pid_of(m.port)
    c = socket.create_connection(("127.0.0.1", m.port), timeout=30)
    try:
        c.sendall(b"GET /await HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while not got.endswith(b"%d" % old):
            chunk = c.recv(65536)
            assert chunk, got
            got += chunk
        assert got.startswith(b"HTTP/1.1 200")
    finally:
        c.close()
    assert "timeout:" not in m.text() and pid_of(m.port) == old
