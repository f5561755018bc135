"""The servers the RFC 6455 conformance cases run against, all serving
tests/apps/asgi_ws_echo.py: sockherd always (a real master and worker,
started and reaped like tests/master/test_run.py's `master` fixture);
uvicorn (its `websockets` implementation) and granian only when
SOCKHERD_WS_PEERS_BIN names a bin directory holding their commands
(bench/ws_conformance.py points it at bench/.venv-peers/bin). They are
benchmark peers, not test dependencies: in `make test` their cases are
skipped and say so (uvicorn is in the test extras as issue 22's reference
ASGI server, but a peer's conformance findings are a benchmark result, not
a failure of sockherd's suite).

One server per test module and server kind (module scope): a case opens a
fresh connection, so cases do not see each other, and a hundred cases do
not start a hundred masters."""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rfc6455_client

HERE = Path(__file__).resolve().parent
APPS = HERE.parent / "apps"
SERVERS = ("sockherd", "uvicorn", "granian")


def peer_command(name: str) -> str | None:
    """The peer's command in SOCKHERD_WS_PEERS_BIN, None without one."""
    d = os.environ.get("SOCKHERD_WS_PEERS_BIN")
    cmd = Path(d) / name if d else None
    return str(cmd) if cmd and cmd.is_file() and os.access(cmd, os.X_OK) else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(fn, timeout: float, what):
    deadline = time.monotonic() + timeout
    while not (value := fn()):
        assert time.monotonic() < deadline, \
            f"timed out waiting for {what() if callable(what) else what}"
        time.sleep(0.02)
    return value


def answering(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def argv_of(server: str, port: int, run_dir: Path, deflate: bool = False) -> list[str]:
    """deflate: permessage-deflate on (sockherd's is off unless asked,
    uvicorn's on by default; granian is not asked)."""
    app = "asgi_ws_echo:app"
    if server == "sockherd":
        return [sys.executable, "-m", "sockherd.master", "run", app, "--interface", "asgi",
                "-w", "1", "--pythonpath", str(APPS), "-b", f"127.0.0.1:{port}",
                "--runtime-dir", str(run_dir)] + (["--ws-per-message-deflate"] if deflate else [])
    if server == "uvicorn":
        return [peer_command("uvicorn"), app, "--app-dir", str(APPS), "--ws", "websockets",
                "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    return [peer_command("granian"), "--interface", "asgi", "--host", "127.0.0.1",
            "--port", str(port), "--working-dir", str(APPS), "--log-level", "warning", app]


@pytest.fixture(scope="module", params=SERVERS)
def ws_server(request, tmp_path_factory):
    """(server name, (host, port)) of a running server, killed and reaped
    (its whole process group) after the module."""
    yield from _serve(request.param, tmp_path_factory, deflate=False)


@pytest.fixture(scope="module", params=("sockherd", "uvicorn"))
def ws_deflate_server(request, tmp_path_factory):
    """As ws_server, with permessage-deflate (RFC 7692) on."""
    yield from _serve(request.param, tmp_path_factory, deflate=True)


def _serve(server: str, tmp_path_factory, deflate: bool):
    if server != "sockherd" and not peer_command(server):
        pytest.skip(f"{server} is a benchmark peer, not a test dependency: its cases run with "
                    "bench/ws_conformance.py (after bench/setup_peers.sh), which names its "
                    "venv in SOCKHERD_WS_PEERS_BIN")
    tmp = tmp_path_factory.mktemp(f"ws-{server}{'-deflate' if deflate else ''}")
    log = tmp / "server.log"
    for attempt in range(3):                 # a port taken between probe and bind: retry
        port = free_port()
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv_of(server, port, tmp / "run", deflate), stdout=out,
                                    stderr=subprocess.STDOUT, cwd=tmp, start_new_session=True,
                                    env={**os.environ, "SOCKHERD_RUNTIME_DIR": str(tmp / "run")})
        try:
            wait_for(lambda: proc.poll() is not None or answering(port), 30,
                     lambda: f"{server} answering\n{log.read_text(errors='replace')}")
            if proc.poll() is None:
                break
        except BaseException:
            _reap(proc)
            raise
        if not re.search(r"in use", log.read_text(errors="replace")):
            raise AssertionError(f"{server} exited:\n{log.read_text(errors='replace')}")
    try:
        yield server, ("127.0.0.1", port)
    finally:
        _reap(proc)


def _reap(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)               # the server and its workers
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


@pytest.fixture(autouse=True)
def _raw_clients_closed():
    """Every raw client a case opened is closed after it, whatever happened."""
    yield
    while rfc6455_client.OPEN:
        rfc6455_client.OPEN.pop().close()
