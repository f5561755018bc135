"""Server hooks (issue 24 §3) on a real master and workers: defined in the
`-c FILE.py` itself or in a module named by `hooks`, called where README
says with the views worker/hooks.py documents. A failing on_starting stops
the start with its traceback; a failing post_worker_init means that worker
never becomes READY (a reload is refused, the old generation serves on);
any other hook's failure is logged and serving goes on. Before: no hook was
ever called."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest

from test_run import http_get, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

HOOKS = '''
import os
HERE = os.path.dirname(os.path.abspath(__file__))

def note(*words):
    with open(os.path.join(HERE, "events.txt"), "a") as f:
        f.write(" ".join(str(w) for w in words) + "\\n")

def on_starting(server):
    note("on_starting", server.pid, os.getpid())
    if os.path.exists(os.path.join(HERE, "fail_on_starting")):
        raise RuntimeError("no database")

def when_ready(server):
    note("when_ready", server.pid)

def on_reload(server):
    note("on_reload", server.pid)

def on_exit(server):
    note("on_exit", server.pid)

def post_worker_init(worker):
    if os.path.exists(os.path.join(HERE, "fail_post_worker_init")):
        raise ConnectionError("pool: cannot connect")
    worker.log.info("pool opened in %d", worker.pid)
    note("post_worker_init", worker.pid, os.getpid(), worker.ppid, worker.generation,
         callable(worker.wsgi))

def worker_exit(server, worker):
    note("worker_exit", worker.pid, os.getpid(), server.pid)

def child_exit(server, worker):
    note("child_exit", worker.pid, worker.exitcode, os.getpid())
    if os.path.exists(os.path.join(HERE, "fail_child_exit")):
        raise ValueError("child_exit broke")

def pre_request(worker, req):
    note("pre_request", worker.pid, req.method, req.path, req.query, dict(req.headers).get("X-TRACE"))
    if req.path == "/pre-fails":
        raise KeyError("pre_request broke")

def post_request(worker, req, environ, resp):
    note("post_request", worker.pid, req.method, req.path, resp.status_code)
'''


def events(tmp_path: Path) -> list[list[str]]:
    try:
        return [line.split() for line in (tmp_path / "events.txt").read_text().splitlines()]
    except FileNotFoundError:
        return []


def named(tmp_path: Path, hook: str) -> list[list[str]]:
    return [e for e in events(tmp_path) if e[0] == hook]


def get(port: int, path: str, headers: str = "") -> bytes:
    return http_get(port, path, headers)


def test_hooks_of_a_python_config_are_called(master, tmp_path):
    (tmp_path / "conf.py").write_text(HOOKS + "workers = 2\n")
    m = master("wsgiapp:app", "-c", str(tmp_path / "conf.py"), ready=2)
    mpid = str(m.proc.pid)
    assert named(tmp_path, "on_starting") == [["on_starting", mpid, mpid]]
    wait_for(lambda: named(tmp_path, "when_ready"), 10, "when_ready")
    inits = named(tmp_path, "post_worker_init")
    assert len(inits) == 2
    for _, wpid, pid, ppid, gen, has_app in inits:
        assert wpid == pid != mpid and ppid == mpid and gen == "1" and has_app == "True"
    assert "pool opened in" in m.text()
    first = {e[1] for e in inits}
    # the request hooks, around the app
    assert get(m.port, "/a/b?x=1", "X-Trace: t1\r\n").startswith(b"HTTP/1.1 200")
    pre = wait_for(lambda: named(tmp_path, "pre_request"), 10, "pre_request")
    assert pre[0][2:] == ["GET", "/a/b", "x=1", "t1"] and pre[0][1] in first
    post = wait_for(lambda: named(tmp_path, "post_request"), 10, "post_request")
    assert post[0][2:] == ["GET", "/a/b", "200"]
    # a reload: on_reload, new workers initialised, the old ones exit
    m.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: len(named(tmp_path, "post_worker_init")) == 4, 30, "new workers' init")
    assert named(tmp_path, "on_reload") == [["on_reload", mpid]]
    exits = wait_for(lambda: len(named(tmp_path, "child_exit")) == 2
                     and named(tmp_path, "child_exit"), 30, "child_exit x2")
    assert {e[1] for e in exits} == first and {e[2] for e in exits} == {"0"}
    assert {e[3] for e in exits} == {mpid}
    gone_ones = wait_for(lambda: len(named(tmp_path, "worker_exit")) == 2
                         and named(tmp_path, "worker_exit"), 30, "worker_exit x2")
    assert {(e[1], e[2], e[3]) for e in gone_ones} == {(p, p, mpid) for p in first}
    m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(timeout=30) == 0
    assert named(tmp_path, "on_exit") == [["on_exit", mpid]]
    assert len(named(tmp_path, "when_ready")) == 1


def test_hooks_module_named_by_the_setting(master, tmp_path):
    (tmp_path / "myhooks.py").write_text(HOOKS)
    m = master("wsgiapp:app", "-w", "1", "--hooks", "myhooks", ready=1)
    assert len(named(tmp_path, "post_worker_init")) == 1
    assert get(m.port, "/x").startswith(b"HTTP/1.1 200")
    wait_for(lambda: named(tmp_path, "post_request"), 10, "post_request")
    assert named(tmp_path, "on_starting")[0][1] == str(m.proc.pid)


def test_failing_on_starting_stops_the_start(master, tmp_path):
    (tmp_path / "conf.py").write_text(HOOKS)
    (tmp_path / "fail_on_starting").touch()
    m = master("wsgiapp:app", "-w", "1", "-c", str(tmp_path / "conf.py"), ready=None)
    assert m.proc.wait(timeout=30) == 1
    text = m.text()
    assert "Traceback" in text and "RuntimeError: no database" in text
    assert "hook on_starting" in text and "not starting" in text
    assert "listening on" not in text and not named(tmp_path, "post_worker_init")


def test_failing_post_worker_init_never_ready(master, tmp_path):
    (tmp_path / "conf.py").write_text(HOOKS)
    (tmp_path / "fail_post_worker_init").touch()
    m = master("wsgiapp:app", "-w", "1", "-c", str(tmp_path / "conf.py"), ready=None)
    assert m.proc.wait(timeout=60) == 1
    text = m.text()
    assert "ConnectionError: pool: cannot connect" in text and "failed before ready" in text
    assert "worker 1.0: ready" not in text


def test_failing_post_worker_init_refuses_the_reload(master, tmp_path):
    (tmp_path / "conf.py").write_text(HOOKS)
    m = master("wsgiapp:app", "-w", "1", "-c", str(tmp_path / "conf.py"), ready=1)
    (tmp_path / "fail_post_worker_init").touch()
    m.proc.send_signal(signal.SIGHUP)
    m.wait_log(r"reload refused \(generation 2\): worker 2\.0 failed before ready: hook "
               r"post_worker_init \(.*conf\.py\) failed: ConnectionError\('pool: cannot "
               r"connect'\); generation 1 keeps serving")
    assert get(m.port, "/still").startswith(b"HTTP/1.1 200")


def test_other_hook_errors_are_logged_and_serving_goes_on(master, tmp_path):
    (tmp_path / "conf.py").write_text(HOOKS)
    (tmp_path / "fail_child_exit").touch()
    m = master("wsgiapp:app", "-w", "1", "-c", str(tmp_path / "conf.py"), ready=1)
    assert get(m.port, "/pre-fails").startswith(b"HTTP/1.1 200")
    m.wait_log(r"hook pre_request \(.*conf\.py\) failed; serving goes on")
    assert "KeyError: 'pre_request broke'" in m.text()
    wait_for(lambda: named(tmp_path, "post_request"), 10, "post_request after a failed pre")
    m.proc.send_signal(signal.SIGHUP)
    m.wait_log(r"hook child_exit \(.*conf\.py\) failed; serving goes on")
    assert get(m.port, "/after").startswith(b"HTTP/1.1 200")
    assert m.proc.poll() is None
