"""gunicorn's short flags mean gunicorn's things (issue 36 §2): `-t 30`
is gunicorn's `--timeout 30`, not 30 threads (before: `sockherd run app
-w 4 -t 30` ran 4 x 30 threads with no timeout, and `-t 120` failed with
a message about thread groups). Threads are `--threads`, as in gunicorn.
The settings as the CLI resolves them, and a real master whose `-t 1`
replaces the worker of a request stuck for longer."""
from __future__ import annotations

import socket

import pytest

from test_python_config import check, config
from test_run import master  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)


def resolved(tmp_path, *argv: str) -> dict:
    (tmp_path / "app.py").write_text("def app(environ, start_response): pass\n")
    r = check("app:app", "--print-config", *argv, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return {k: v for k, (v, _) in config(r).items()}


@pytest.mark.parametrize("argv,timeout,threads", [
    (("-t", "30"), 30.0, 1),
    (("-t", "120", "--threads", "4"), 120.0, 4),
    (("-w", "4", "-t", "30", "--threads", "8"), 30.0, 8),
])
def test_t_is_the_timeout_and_threads_are_threads(tmp_path, argv, timeout, threads):
    got = resolved(tmp_path, *argv)
    assert (float(got["timeout"]), int(got["threads"])) == (timeout, threads)


HANG_APP = """
import time

def app(environ, start_response):
    if environ["PATH_INFO"] == "/hang":
        while True:
            time.sleep(0.05)
    start_response("200 OK", [("Content-Length", "2")])
    return [b"ok"]
"""


def test_t_replaces_the_worker_of_a_stuck_request(master, tmp_path):
    (tmp_path / "hangapp.py").write_text(HANG_APP)
    m = master("hangapp:app", "-w", "1", "-t", "1", "--hard-stop-after", "3", ready=1)
    with socket.create_connection(("127.0.0.1", m.port), timeout=30) as c:
        c.sendall(b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
        m.wait_log(r"worker 1\.0: timeout: request GET /hang in the app for \d+\.\ds "
                   r"\(timeout 1s\): starting its replacement")
        m.wait_log(r"worker 1\.0: replaced by pid \d+")
