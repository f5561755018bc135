"""Memory per idle WebSocket (issue 23: <= 4 KiB), on a real master and
one worker serving tests/apps/asgi_ws_echo.py: the worker's RSS grows by
at most BOUND bytes per WebSocket upgraded and left idle, over N of them
opened after a warm-up (the first allocations, the fd table's pages).

It reproduces the finding of bench/ws_echo.py (5.5 KiB per idle WebSocket,
2026-11-26): an upgraded connection kept the whole HTTP parser's state,
per-connection copies of constant address objects, header names and an
extension's name, and a done() function object per call. Then (issue 23's
last aim, branch wsidle) the merges after it grew it past 4 KiB (4,173 B on
a quiet box, ~4,200 on a loaded one): permessage-deflate's state held by
every WebSocket, deflate on or off (32 bytes more a WsCall, a pymalloc size
class up), on top of what was already there (the handshake's header pairs
a tuple each, padding in the connection's and parser's structs). Measured
with this test's N, today's main tree gives ~4,150-4,250 B, the fixed one
~3,700-3,800: BOUND, 4,000, sits between with ~200 B of margin either way
(RSS moves by whole pages and malloc's arenas: over N = 2,000 WebSockets a
64 KiB arena is 33 B each). bench/ws_echo.py gives the figure."""
from __future__ import annotations

import re
import resource
import socket
import time
from pathlib import Path

import pytest

from test_run import wait_for

pytestmark = pytest.mark.timeout(180)

N = 2000
WARM = 200
APPS = Path(__file__).resolve().parent.parent / "apps"
BOUND = 4000                # under issue 23's 4 KiB, over the fixed tree's ~3,750 (above)


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def settled_rss(pid: int) -> int:
    """The RSS once two reads 0.3 s apart agree within 0.5 % (a deadline)."""
    last = [rss_kib(pid)]

    def steady():
        time.sleep(0.3)
        now = rss_kib(pid)
        same = abs(now - last[0]) <= last[0] / 200
        last[0] = now
        return same
    wait_for(steady, 30, "a steady RSS")
    return last[0]


def open_idle(port: int, n: int) -> list[socket.socket]:
    req = (f"GET /echo HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
           "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
           "Sec-WebSocket-Version: 13\r\n\r\n").encode()
    out: list[socket.socket] = []
    try:
        while len(out) < n:
            batch = [socket.create_connection(("127.0.0.1", port), timeout=30)
                     for _ in range(min(100, n - len(out)))]
            out += batch
            for s in batch:
                s.sendall(req)
            for s in batch:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = s.recv(4096)
                    assert chunk, f"EOF before the upgrade's answer: {head!r}"
                    head += chunk
                assert head.startswith(b"HTTP/1.1 101"), head[:80]
    except BaseException:
        for s in out:
            s.close()
        raise
    return out


@pytest.fixture
def nofile():
    """Room for the test's own sockets (the worker gets it from the master's limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 4096)
    if want < N + WARM + 200:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} too low for {N + WARM} WebSockets")
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    yield want
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_idle_websocket_costs_at_most_4_kib(master, nofile):
    m = master("asgi_ws_echo:app", "--interface", "asgi", "-w", "1", "--threads", "1",
               "--pythonpath", str(APPS), ready=1,
               nofile=(nofile, nofile))
    pid = int(m.wait_log(r"worker \d+\.\d+: ready, pid (\d+)")[0])
    socks: list[socket.socket] = []
    try:
        socks += open_idle(m.port, WARM)
        before = settled_rss(pid)
        socks += open_idle(m.port, N)
        after = settled_rss(pid)
    finally:
        for s in socks:
            s.close()
    per = (after - before) * 1024 / N
    print(f"{per:,.0f} B per idle WebSocket (RSS {before} -> {after} KiB)")
    assert per <= BOUND, f"{per:,.0f} B per idle WebSocket (RSS {before} -> {after} KiB)"
