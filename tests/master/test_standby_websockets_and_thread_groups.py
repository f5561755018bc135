"""Issue 36 review of the reload standby (89defad): what a standing-by
worker keeps. An idle WebSocket and a slow event stream of the previous
generation live through the probation (the idle grace is for kept-alive
HTTP connections, not theirs), on a real master (tests/apps/asgi_versioned.py)."""
from __future__ import annotations

import http.client
import shutil
import threading
import time
from pathlib import Path

import pytest
import websockets.sync.client as wsc

from test_standby_busy_successor_idle_grace import commit
from test_run import master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)
APPS = Path(__file__).resolve().parents[1] / "apps"


def test_websockets_and_streams_of_a_standing_by_worker_live_on(master, tmp_path,
                                                                monkeypatch):
    shutil.copy(APPS / "asgi_versioned.py", tmp_path / "asgi_versioned.py")
    version = tmp_path / "version"
    version.write_text("v1")
    monkeypatch.setenv("ASGI_TEST_VERSION_FILE", str(version))
    m = master("asgi_versioned:app", "--interface", "asgi", "-w", "1", "--threads", "1",
               "--reload-probation", "60", "--idle-grace", "0.3", ready=1)
    with wsc.connect(f"ws://127.0.0.1:{m.port}/ws", open_timeout=10) as ws:
        assert ws.recv(timeout=10).startswith("v1 ")
        events: list[str] = []

        def stream():
            c = http.client.HTTPConnection("127.0.0.1", m.port, timeout=20)
            c.request("GET", "/sse?n=40&pause=0.1")
            r = c.getresponse()
            events.extend(line for line in r.read().decode().split("\n") if line)
            c.close()

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        version.write_text("v2")
        commit(m, tmp_path, 1)
        done = time.monotonic()
        # idle well past the grace (0.3 s) on the standing-by worker
        wait_for(lambda: time.monotonic() > done + 1.5, 5, "1.5 s of standby")
        ws.send("still here")
        assert ws.recv(timeout=10) == "still here"
        t.join(timeout=20)
        assert events == [f"data: v1 {i}" for i in range(40)], events


def unix_get(path: str) -> str:
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    try:
        s.connect(path)
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        got = b""
        while chunk := s.recv(4096):
            got += chunk
        return got.split(b"\r\n\r\n", 1)[1].decode()
    finally:
        s.close()


@pytest.mark.parametrize("bind", ["tcp", "unix"])
def test_thread_groups_and_unix_sockets_stand_by(master, tmp_path, bind):
    """A standing-by worker of 4 loop threads in 2 groups: no thread of it
    takes a connection after the commit; nor on a unix socket (no queue
    to look at there)."""
    from test_standby_busy_successor_idle_grace import get as tcp_get, write
    write(tmp_path, "v1")
    path = str(tmp_path / "s.sock")
    args = ["slowver:app", "-w", "2", "--threads", "4", "--thread-groups", "2",
            "--reload-probation", "60"]
    if bind == "unix":
        m = master(*args, "-b", f"unix:{path}", bind=None, ready=2)
        fetch = lambda: unix_get(path)          # noqa: E731
    else:
        m = master(*args, ready=2)
        fetch = lambda: tcp_get(m.port)         # noqa: E731
    assert fetch().startswith("v1 ")
    write(tmp_path, "v2")
    commit(m, tmp_path, 2)
    got = [fetch().split()[0] for _ in range(200)]
    assert got == ["v2"] * 200, got.count("v1")
