"""The WebSocket reload contract (issue 23, Tests): "0 failed requests and
no WebSocket cut across 20 reloads of an app under HTTP load while
WebSocket clients stay connected, each seeing only 1001 at the end of its
generation's drain"; and server-sent-event streams that run across the
reloads are never cut before hard_stop_after.

A real master serves tests/apps/asgi_versioned.py (HTTP `/`, `/sse`, a
WebSocket echo on `/ws` that greets with its generation's version). The
HTTP load is tests/master/test_reload.py's `Clients` (fresh and kept-alive
connections; refused, reset, bad status and short bodies all counted),
the streams tests/asgi/test_asgi_reload_under_load.py's `Streams` (each
stream whole, from one generation). After each reload (a SIGHUP, its end
polled through the control endpoint's `status`) two WebSockets are opened
on the new generation; every WebSocket echoes a message every 50 ms until
its server closes it. Each one of a replaced generation must end with a
close frame of code 1001, at that generation's drain deadline
(hard_stop_after after it was replaced, not before), with every message
it sent echoed (the one in flight when the close came excepted)."""
from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import websockets.sync.client as wsc
from websockets.exceptions import ConnectionClosed

from sockherd.master.ctl import request
from test_reload import Clients
from test_run import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "asgi"))
from test_asgi_reload_under_load import Streams  # noqa: E402

pytestmark = pytest.mark.timeout(180)

RELOADS = 20
HARD_STOP = 3.0
PER_GENERATION = 2       # WebSockets opened on each generation


class Socket(threading.Thread):
    """One WebSocket echoing until its server closes it (or the test stops
    it): what it sent and got back, how and when it ended."""

    def __init__(self, port: int, name: str, stop: threading.Event):
        super().__init__(daemon=True)
        self.name_, self.stop = name, stop
        # entered as a context (websockets 17.1+); run() closes it
        self.ws = wsc.connect(f"ws://127.0.0.1:{port}/ws", open_timeout=10).__enter__()
        version, self.pid = self.ws.recv(timeout=10).split()
        self.generation = int(version.lstrip("g"))
        self.sent: list[str] = []
        self.echoed: list[str] = []
        self.close = None          # the close frame received, None: none (1006)
        self.closed_at: float | None = None
        self.error: str | None = None
        self.start()

    def run(self) -> None:
        try:
            k = 0
            while not self.stop.wait(0.05):
                message = f"{self.name_} {k}"
                self.sent.append(message)
                self.ws.send(message)
                self.echoed.append(self.ws.recv(timeout=10))
                k += 1
            self.ws.close()                  # the test's end: the last generation's
        except ConnectionClosed:
            self.closed_at = time.monotonic()
            self.close = self.ws.protocol.close_rcvd
        except Exception as exc:  # noqa: BLE001 - a timeout, a reset: kept, asserted on
            self.error = repr(exc)
            self.ws.close()

    def verdict(self, replaced_at: dict[int, float]) -> str | None:
        """What is wrong with how this WebSocket went, or None."""
        if self.error:
            return f"{self.error} after {len(self.echoed)} echoes"
        if self.echoed != self.sent[:len(self.echoed)] or len(self.sent) - len(self.echoed) > 1:
            return f"echoes {self.echoed[-3:]} for {self.sent[-3:]}"
        if self.generation not in replaced_at:             # the serving generation
            return f"closed ({self.close})" if self.closed_at is not None else None
        if self.close is None:
            return "cut without a close frame (1006)" if self.closed_at else "never closed"
        if self.close.code != 1001:
            return f"closed with {self.close.code} {self.close.reason!r}, not 1001"
        after = self.closed_at - replaced_at[self.generation]
        if not HARD_STOP <= after <= HARD_STOP + 5:
            return f"closed {after:.2f} s after its generation was replaced, not at " \
                   f"hard_stop_after ({HARD_STOP:g} s)"
        return None


def reload(m, endpoint: str, i: int, timeout: float = 60) -> float:
    """SIGHUP, then the control endpoint's `status` polled until the i-th
    reload is over (generation i + 1 serves, the old one drains). Returns
    when the last poll that still saw it under way was sent: the drain
    began after that (the master's Drain message carries the deadline, sent
    at the reload's commit), so a WebSocket closed at hard_stop_after was
    closed at least HARD_STOP after it."""
    under_way = time.monotonic()
    m.proc.send_signal(signal.SIGHUP)
    deadline = under_way + timeout
    while True:
        sent = time.monotonic()
        st = request(endpoint, "status")
        if st["generation"] == i + 1 and st["reloads_ok"] == i and not st["starting_generation"]:
            return under_way
        under_way = sent
        assert sent < deadline, f"reload {i} not over in {timeout:g} s: {st}\n{m.text()}"
        time.sleep(0.02)                     # the poll's interval


def test_reloads_under_load_keep_websockets_until_their_drain_ends_then_1001(
        ws_server, tmp_path, monkeypatch):
    version = tmp_path / "version"
    version.write_text("g1")
    monkeypatch.setenv("ASGI_TEST_VERSION_FILE", str(version))
    srv = ws_server("asgi_versioned:app", "--hard-stop-after", str(HARD_STOP))
    m = srv.master
    endpoint = f"ipc://{tmp_path / 'run' / 'control'}"
    stop = threading.Event()
    sockets: list[Socket] = []
    replaced_at: dict[int, float] = {}     # generation -> a time before its drain began

    def open_sockets(generation: int) -> None:
        """PER_GENERATION more WebSockets on `generation` (one that a worker
        of the generation before still accepted is kept and judged too)."""
        def opened() -> bool:
            sockets.append(Socket(m.port, f"ws{len(sockets)}", stop))
            return sum(s.generation == generation for s in sockets) >= PER_GENERATION
        wait_for(opened, 10, f"{PER_GENERATION} WebSockets on generation {generation}")

    clients = Clients(m.port, fresh=2, kept=2)
    # streams of 1.5 s (< HARD_STOP): many run across a reload
    streams = Streams(m.port, readers=1, events=16, pause=0.1)
    try:
        open_sockets(1)
        wait_for(lambda: clients.ok > 20, 20, "HTTP traffic")
        for i in range(1, RELOADS + 1):
            version.write_text(f"g{i + 1}")
            replaced_at[i] = reload(m, endpoint, i)
            open_sockets(i + 1)
        # the last replaced generation's drain ends at its deadline
        wait_for(lambda: all(s.closed_at is not None or s.error for s in sockets
                             if s.generation <= RELOADS),
                 HARD_STOP + 15, lambda: f"the replaced generations' WebSockets closed\n"
                                         f"{m.text()}")
        assert any(s.is_alive() for s in sockets if s.generation == RELOADS + 1)
    finally:
        stop.set()
        clients.stop()
        streams.stop()
        for s in sockets:
            s.join(15)
    problems = [f"{s.name_} (generation {s.generation}): {why}" for s in sockets
                if (why := s.verdict(replaced_at))]
    assert problems == [], problems[:10]
    assert {s.generation for s in sockets} == set(range(1, RELOADS + 2))
    assert sum(len(s.echoed) for s in sockets) > 20 * RELOADS
    assert clients.failures == [], clients.failures[:5]
    assert clients.ok > 200
    assert streams.failures == [], streams.failures[:5]
    assert streams.ok >= 5
    # each drain ended with no connection open (the master may still kill a
    # worker that is slow to exit after that: its WebSockets had their 1001)
    assert "they are cut" not in m.text()
    m.wait_log(r"drain deadline: closing \d+ WebSocket\(s\) with 1001", count=RELOADS)
