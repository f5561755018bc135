"""WebSockets across a drain (issue 23 §3), on a real master and workers
with the `websockets` client: a reload drains the old worker, whose open
WebSockets keep working until hard_stop_after and only then get close
1001 (going away), their app told 1001; the worker then exits without
"cut" connections. `sockherd ctl show proc` and the metrics count the
open WebSockets per worker. Without the going-away step the worker
exited at the deadline with its WebSockets cut (1006, no close frame)."""
from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import websockets.sync.client as wsc
from websockets.exceptions import ConnectionClosed

from test_run import wait_for

pytestmark = pytest.mark.timeout(120)

HARD_STOP = 4.0


def show_proc(tmp_path: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "sockherd.master", "ctl", "--runtime-dir",
                           str(tmp_path / "run"), "--json", "show proc"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.stdout, done.stderr)
    return json.loads(done.stdout)


def websockets_of(tmp_path: Path) -> dict[int, int]:
    """generation -> open WebSockets of its workers"""
    out: dict[int, int] = {}
    for w in show_proc(tmp_path)["workers"]:
        st = w.get("stats") or {}
        out[w["generation"]] = out.get(w["generation"], 0) + (st.get("websockets") or 0)
    return out


def test_reload_keeps_websockets_until_hard_stop_then_1001(ws_server, tmp_path):
    srv = ws_server("asgi_ws_fastapi:app", "--hard-stop-after", str(HARD_STOP), "--idle-grace",
                    "0.2")
    with contextlib.ExitStack() as stack:
        clients = [stack.enter_context(wsc.connect(srv.url(f"/ws/hold/{n}"))) for n in "ab"]
        for n, ws in zip("ab", clients):
            srv.record(f"hold-{n}-open")
            ws.send(f"before {n}")
            assert ws.recv(timeout=10) == f"before {n}"
        wait_for(lambda: websockets_of(tmp_path) == {1: 2}, 20, "show proc counting 2")
        metrics = show_proc(tmp_path)
        assert metrics["workers"][0]["stats"]["connections"] >= 2

        srv.master.proc.send_signal(signal.SIGHUP)
        srv.master.wait_log(r"worker 2\.\d+: ready")
        drained_at = time.monotonic()
        # draining: the old worker's WebSockets are served on, new ones go to the new worker
        deadline = drained_at + HARD_STOP - 1.0
        rounds = 0
        while time.monotonic() < deadline:
            for n, ws in zip("ab", clients):
                ws.send(f"draining {n} {rounds}")
                assert ws.recv(timeout=10) == f"draining {n} {rounds}"
            rounds += 1
            time.sleep(0.2)
        assert rounds >= 2
        with wsc.connect(srv.url("/ws/hold/new")) as fresh:
            fresh.send("fresh")
            assert fresh.recv(timeout=10) == "fresh"
        with httpx.Client(timeout=10) as c:
            assert c.get(f"http://127.0.0.1:{srv.port}/").json() == {"ok": True}
        # the deadline: close 1001 to each, never before
        for ws in clients:
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=HARD_STOP + 10)
            assert ws.protocol.close_rcvd is not None, "cut without a close frame"
            assert ws.protocol.close_rcvd.code == 1001
        assert time.monotonic() - drained_at >= HARD_STOP - 1.0
        assert srv.record("hold-a") == {"code": 1001} and srv.record("hold-b") == {"code": 1001}
        srv.master.wait_log(r"closing 2 WebSocket\(s\) with 1001")
        wait_for(lambda: list(websockets_of(tmp_path)) == [2], 20, "the old worker gone")
        assert "they are cut" not in srv.master.text()
