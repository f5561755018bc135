"""A gunicorn.conf.py of the kind real projects ship runs unchanged (issue 24
§3's test): bind, workers, threads, worker_class, timeout, graceful_timeout,
keepalive, accesslog/errorlog to stderr with gunicorn's default access
format, loglevel, when_ready logging, post_worker_init opening a per-worker
"pool" the app uses, child_exit cleaning a Prometheus-multiprocess-style
file of the exited worker, a post_fork that only logs (warned about: never
called). Before: `-c gunicorn.conf.py` was "not valid TOML"."""
from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from test_run import gone, http_get, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

GUNICORN_CONF = '''\
# gunicorn.conf.py
import multiprocessing
import os

bind = "127.0.0.1:0"
workers = int(os.environ.get("GUNICORN_WORKERS", "2"))
threads = 4
worker_class = "gthread"
timeout = 30
graceful_timeout = 10
keepalive = 5
accesslog = "-"
errorlog = "-"
loglevel = "info"
access_log_format = '%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s"'

METRICS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prom")


def when_ready(server):
    server.log.info("Server is ready. Spawning workers")


def post_fork(server, worker):
    server.log.info("Worker spawned (pid: %s)", worker.pid)


def post_worker_init(worker):
    import sqlite3

    import app
    app.POOL = sqlite3.connect(":memory:", check_same_thread=False)
    os.makedirs(METRICS_DIR, exist_ok=True)
    open(os.path.join(METRICS_DIR, "counter_%d.db" % worker.pid), "w").close()
    worker.log.info("pool opened for worker %s", worker.pid)


def child_exit(server, worker):
    # prometheus_client.multiprocess.mark_process_dead, in spirit
    path = os.path.join(METRICS_DIR, "counter_%d.db" % worker.pid)
    if os.path.exists(path):
        os.remove(path)
'''

APP = '''\
import os
POOL = None

def application(environ, start_response):
    (one,) = POOL.execute("select 1").fetchone()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"pool %d in %d" % (one, os.getpid())]
'''


def get(port: int) -> bytes:
    return http_get(port, "/ping?x=1", "User-Agent: probe\r\n")


def test_a_real_gunicorn_conf_runs_unchanged(master, tmp_path: Path):
    (tmp_path / "gunicorn.conf.py").write_text(GUNICORN_CONF)
    (tmp_path / "app.py").write_text(APP)
    m = master("-c", "gunicorn.conf.py", "app:application", bind=None, ready=None)
    port = int(m.wait_log(r"listening on 127\.0\.0\.1:(\d+)")[0])
    m.wait_log(r"worker \d+\.\d+: ready", count=2)
    # when_ready runs just after the master logs the last worker's ready line
    m.wait_log(r"Server is ready\. Spawning workers")
    text = m.text()
    assert "gunicorn's hook post_fork() is ignored" in text
    assert len(re.findall(r"pool opened for worker \d+", text)) == 2
    files = {p.name for p in (tmp_path / "prom").iterdir()}
    workers = {int(p) for p in re.findall(r"worker 1\.\d: ready, pid (\d+)", text)}
    assert files == {f"counter_{p}.db" for p in workers}
    # served with the pool post_worker_init opened, logged in gunicorn's format
    body = get(port)
    assert body.startswith(b"HTTP/1.1 200") and b"pool 1 in " in body
    line = m.wait_log(r'127\.0\.0\.1 - - \[[^\]]+\] "GET /ping\?x=1 HTTP/1\.1" 200 \d+ "-" '
                      r'"probe"')
    assert line
    m.proc.send_signal(signal.SIGHUP)             # new workers; the old ones exit
    wait_for(lambda: len(re.findall(r"pool opened for worker \d+", m.text())) == 4, 60,
             "the new generation's post_worker_init")
    wait_for(lambda: all(gone(p) for p in workers), 60, "the old workers gone")
    # child_exit removed each exited worker's file, and only theirs
    wait_for(lambda: not any((tmp_path / "prom" / f"counter_{p}.db").exists()
                             for p in workers), 30, "child_exit's clean-up")
    assert len(list((tmp_path / "prom").iterdir())) == 2
    m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(timeout=60) == 0
    assert not list((tmp_path / "prom").iterdir())


def test_its_settings_read_as_gunicorn_means_them(tmp_path: Path):
    from test_python_config import check, config

    (tmp_path / "gunicorn.conf.py").write_text(GUNICORN_CONF)
    (tmp_path / "app.py").write_text(APP)
    r = check("-c", "gunicorn.conf.py", "--print-config", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = {k: v for k, (v, _) in config(r).items()}
    assert (got["workers"], got["threads"], got["timeout"], got["hard_stop_after"],
            got["keepalive_timeout"], got["access_log"], got["bind"]) == \
        ("2", "4", "30.0", "10.0", "5.0", "true", '["127.0.0.1:0"]')
    assert got["hooks"] == f'"{tmp_path / "gunicorn.conf.py"}"'
