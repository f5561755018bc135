"""Fixtures of the WebSocket tests: the in-process ASGI server of
tests/worker/conftest.py (a real Loop and Table, loopback, the native
engine; its ASAN build when SOCKHERD_HTTP_MODULE names one), and a raw
WebSocket client (wsclient.py) for the cases no well-behaved client
sends."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "ws_worker_fixtures", Path(__file__).resolve().parents[1] / "worker" / "conftest.py")
_worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_worker)

serve_stream = _worker.serve_stream
serve_asgi = _worker.serve_asgi
serve_wsgi = _worker.serve_wsgi


@pytest.fixture(autouse=True)
def _raw_clients_closed():
    """Every raw client a test opened is closed after it, whatever happened."""
    import wsclient
    yield
    while wsclient.OPEN:
        wsclient.OPEN.pop().close()


# ---- a real master and workers (tests/master/test_run.py's `master` fixture) ----
import json  # noqa: E402
import sys  # noqa: E402

HERE = Path(__file__).resolve().parent
APPS = HERE.parent / "apps"
sys.path.insert(0, str(HERE.parent / "master"))
from test_run import master, wait_for  # noqa: E402,F401  (master: the fixture)


class Served:
    """A sockherd master serving one ASGI app; what the app recorded
    (tests/apps/asgi_records.py) read from `records`."""

    def __init__(self, m, records: Path):
        self.master, self.records = m, records
        self.port = m.port

    def url(self, path: str) -> str:
        return f"ws://127.0.0.1:{self.port}{path}"

    def record(self, name: str, timeout: float = 15) -> dict:
        path = self.records / name
        wait_for(path.exists, timeout, lambda: f"the app's record {name!r}\n{self.master.text()}")
        return json.loads(path.read_text())


@pytest.fixture
def ws_server(master, tmp_path, monkeypatch):
    """serve(app, *extra_args, workers=1) -> Served: `sockherd run APP
    --interface asgi` on loopback, its runtime dir under tmp_path, reaped
    by the master fixture."""
    records = tmp_path / "records"
    records.mkdir()
    monkeypatch.setenv("ASGI_TEST_RECORDS", str(records))

    def serve(app: str, *extra: str, workers: int = 1) -> Served:
        m = master(app, "--interface", "asgi", "-w", str(workers), "--pythonpath", str(APPS),
                   *extra, ready=workers)
        return Served(m, records)

    return serve
