"""20 reloads of an ASGI app under load fail no request and cut no
server-sent-event stream (issue 22 §4: "0 failed requests across 20
reloads of an ASGI app under load, streaming (SSE) responses included,
none cut before hard_stop_after").

The load is tests/master/test_reload.py's (the WSGI version of this test):
its `Clients` (fresh and kept-alive connections, every failure kept with
its reason) against tests/apps/asgi_versioned.py, plus clients reading
half-second SSE streams, each checked whole (its 10 events in order, from
one generation, the chunked body terminated). Streams run across every
reload: a draining worker must finish them. sockherd only: the reference
server has no reload of this kind to compare with."""
from __future__ import annotations

import http.client
import re
import threading

import pytest

from test_reload import Clients, reload
from test_run import wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.long]     # 20 reloads: scheduled first

RELOADS = 20
EVENTS = 10          # asgi_versioned.EVENTS


class Streams:
    """Closed-loop SSE readers until stopped, one stream per connection;
    a stream counts when it is whole, anything else is a failure."""

    def __init__(self, port: int, readers: int = 2, events: int = EVENTS, pause: float = 0.05):
        self.port = port
        self.events = events
        self.path = f"/sse?n={events}&pause={pause:g}"
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._read, daemon=True) for _ in range(readers)]
        for t in self._threads:
            t.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
            try:
                conn.request("GET", self.path)
                r = conn.getresponse()
                body = r.read().decode()        # chunked: raises IncompleteRead if cut
                events = re.findall(r"^data: (\S+) (\d+)$", body, re.M)
                versions = {v for v, _ in events}
                if r.status != 200:
                    self.failures.append(f"sse: status {r.status}")
                elif [int(i) for _, i in events] != list(range(self.events)) or len(versions) != 1:
                    self.failures.append(f"sse: events {events}")
                else:
                    self.ok += 1
            except Exception as exc:  # noqa: BLE001 - counted, that is the test
                self.failures.append(f"sse: {exc!r}")
            finally:
                conn.close()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


def test_reloads_under_load_fail_no_request_and_cut_no_stream(asgi_server, tmp_path,
                                                             monkeypatch):
    if asgi_server.kind != "sockherd":
        pytest.skip("a reload under load is sockherd's own (SIGHUP, generations)")
    version = tmp_path / "version"
    version.write_text("v0")
    monkeypatch.setenv("ASGI_TEST_VERSION_FILE", str(version))
    srv = asgi_server("asgi_versioned:app", workers=2)
    m = srv.master
    clients = Clients(srv.port, fresh=2, kept=2)
    streams = Streams(srv.port)
    try:
        wait_for(lambda: clients.ok > 20 and streams.ok > 2, 20, "traffic")
        for i in range(1, RELOADS + 1):
            version.write_text(f"v{i}")
            before = streams.ok
            reload(m, i)
            wait_for(lambda: f"v{i}" in clients.versions[-5:], 15, f"v{i} answers")
            # a stream of this generation or one running across the reload
            wait_for(lambda: streams.ok > before, 15, f"a whole stream after reload {i}")
    finally:
        clients.stop()
        streams.stop()
    assert clients.failures == [], clients.failures[:5]
    assert streams.failures == [], streams.failures[:5]
    assert clients.ok > 200 and streams.ok >= RELOADS
    assert "still draining at hard_stop_after" not in m.text()
    m.wait_log(r"worker \d+\.\d: exited with status 0 \(drained\)", count=2 * RELOADS)
