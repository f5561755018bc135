"""The ASGI test apps (tests/apps/asgi_*.py) served by a real server, the
same tests run against each server kind (differential tests, issue 22 §4):

  sockherd  `sockherd run APP --interface asgi -w N` as tests/master/test_run.py
            starts it (its `master` fixture: real master and workers, loopback,
            ephemeral port, reaped whatever happens). Skipped, with the reason,
            while this tree has no sockherd.worker.asgi (the ASGI adapter).
  uvicorn   the reference server, a real process on an ephemeral port; only
            with SOCKHERD_ASGI_REFERENCE=1 (it shows the tests themselves are
            right: every test passes against it; CI tests sockherd only).

The apps record what they saw (a background task that ran, a stream that
ended early, a lifespan startup) into `server.records`, a directory of the
test's own (asgi_records.py).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
APPS = HERE.parent / "apps"
sys.path.insert(0, str(HERE.parent / "master"))
from test_run import master, module_master, wait_for  # noqa: E402,F401  (the fixtures)

KINDS = ["sockherd"] + (["uvicorn"] if os.environ.get("SOCKHERD_ASGI_REFERENCE") == "1" else [])


class Server:
    """One running server of either kind, serving one app."""

    def __init__(self, kind: str, proc: subprocess.Popen, log: Path, port: int, records: Path,
                 master=None):
        self.kind, self.proc, self.log, self.port, self.records = kind, proc, log, port, records
        self.master = master        # sockherd: test_run's Master (wait_log, reload helpers)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def record(self, name: str, timeout: float = 15) -> dict:
        """The app's record `name`, polled for until the deadline."""
        path = self.records / name
        wait_for(path.exists, timeout, lambda: f"the app's record {name!r}; log:\n{self.text()}")
        return json.loads(path.read_text())

    def stop(self, timeout: float = 30) -> None:
        """A graceful stop (TERM) that must end in a clean exit: status 0
        (sockherd's master), or uvicorn's own way, the TERM raised again at
        its end once it has shut down (so its status is -SIGTERM)."""
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=timeout)
        clean = (0, -signal.SIGTERM) if self.kind == "uvicorn" else (0,)
        assert rc in clean, f"{self.kind} exited {rc} after TERM:\n{self.text()}"


def _starter(kind: str, start_master, tmp_path: Path, records: Path,
             started: list[subprocess.Popen]):
    """serve(app, *extra_sockherd_args, workers=1) -> Server, on a master
    started by start_master (test_run's fixtures) or a uvicorn process
    (added to `started`: the caller kills and reaps them)."""

    def serve(app: str, *extra: str, workers: int = 1) -> Server:
        if kind == "sockherd":
            m = start_master(app, "--interface", "asgi", "-w", str(workers),
                             "--pythonpath", str(APPS), *extra, ready=workers)
            return Server(kind, m.proc, m.log, m.port, records, master=m)
        log = tmp_path / f"uvicorn{len(started)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", app, "--app-dir", str(APPS),
                 "--host", "127.0.0.1", "--port", "0", "--workers", str(workers)],
                stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)
        started.append(proc)
        srv = Server(kind, proc, log, 0, records)

        def port():
            assert proc.poll() is None, f"uvicorn exited {proc.returncode}:\n{srv.text()}"
            m = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", srv.text())
            return m and int(m.group(1))
        srv.port = wait_for(port, 30, lambda: f"uvicorn listening\n{srv.text()}")
        if workers > 1:
            wait_for(lambda: srv.text().count("Started server process") >= workers, 30,
                     lambda: f"{workers} uvicorn workers\n{srv.text()}")
        return srv

    serve.kind = kind
    return serve


def _reap(started: list[subprocess.Popen]) -> None:
    for proc in started:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)     # uvicorn and any worker it forked
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)


@pytest.fixture(params=KINDS)
def asgi_server(request, master, tmp_path, monkeypatch):
    """serve(app, *extra_sockherd_args, workers=1) -> Server."""
    records = tmp_path / "records"
    records.mkdir()
    # both servers' processes inherit the environment they are started with
    monkeypatch.setenv("ASGI_TEST_RECORDS", str(records))
    started: list[subprocess.Popen] = []
    yield _starter(request.param, master, tmp_path, records, started)
    _reap(started)


@pytest.fixture(scope="module", params=KINDS)
def shared_asgi_server(request, module_master, tmp_path_factory):
    """served(app) -> Server: one server per app (and kind) that the tests
    of a module share, started by the first test that asks (a FastAPI app's
    start was most of each of its tests). Only for tests that send requests
    and check the answers; any record one leaves (server.records) must
    carry a name of that test's own (a fresh tag per run: order-independent
    and repeatable). Apps that need extra arguments or a fresh server take
    asgi_server."""
    tmp_path = tmp_path_factory.mktemp("asgi-shared")
    records = tmp_path / "records"
    records.mkdir()
    started: list[subprocess.Popen] = []
    serve = _starter(request.param, module_master, tmp_path, records, started)
    servers: dict[str, Server] = {}

    def served(app: str) -> Server:
        if app not in servers:
            with pytest.MonkeyPatch.context() as mp:
                # inherited by the server and every worker it (re)spawns
                mp.setenv("ASGI_TEST_RECORDS", str(records))
                servers[app] = serve(app)
        srv = servers[app]
        assert srv.proc.poll() is None, f"the shared server exited:\n{srv.text()}"
        return srv

    served.kind = request.param
    yield served
    _reap(started)
