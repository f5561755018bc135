"""The master sees how many loop threads of a worker are alive (issue 18
§1: "the master's heartbeat/report sees the number of live loop
threads"). Found by the acceptance audit of issue 18: the count was pinned
in-process only (tests/worker/test_loop_thread_death.py reads the
worker's report; test_worker_replaced_when_a_loop_thread_ends.py renders
a made-up answer), never read from a live master. Here a real -w 1 --threads 2
master: one loop thread is kept busy in the app, the other is killed on
purpose; while the worker drains, `ctl show proc` and the metrics say 1 of
2, and once the busy request ends the worker is replaced."""
from __future__ import annotations

import json
import socket
import threading

import pytest

from test_control import ctl
from test_metrics import scrape, value
from test_reload import free_port
from test_run import gone, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

APP = """
import os, time

class Killed(BaseException):
    pass

def die():
    raise Killed("a loop thread killed on purpose")

HERE = os.path.dirname(os.path.abspath(__file__))

def app(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/hold":
        # keeps this loop thread in the app until the test releases it
        open(os.path.join(HERE, "holding"), "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(HERE, "release")) and time.monotonic() < deadline:
            time.sleep(0.02)
    elif path == "/kill":
        loop = environ["sockherd.loop"]
        me = loop._pos[loop.local.th.tid]
        loop._mail[me].append((die, ()))      # runs on this thread after this turn
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"%d" % os.getpid()]
"""


def get(port: int, path: str, out: list | None = None) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as c:
        c.sendall(b"GET %s HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n" % path.encode())
        data = b""
        while chunk := c.recv(4096):
            data += chunk
    if out is not None:
        out.append(data)
    return data


def alive(tmp_path) -> list[tuple]:
    """(worker, pid, threads, threads_alive) of each worker, from `ctl show proc`."""
    done = ctl(tmp_path, "show", "proc", json_out=True)
    assert done.returncode == 0, done.stderr
    return [(w["worker"], w["pid"], (w.get("stats") or {}).get("threads"),
             (w.get("stats") or {}).get("threads_alive"))
            for w in json.loads(done.stdout)["workers"]]


def test_the_master_reports_a_workers_live_loop_threads(master, tmp_path):
    (tmp_path / "holdapp.py").write_text(APP)
    mport = free_port()
    m = master("holdapp:app", "-w", "1", "--threads", "2", "--metrics", f"127.0.0.1:{mport}", ready=1)
    [(name, pid, threads, live)] = alive(tmp_path)
    assert (threads, live) == (2, 2)
    assert value(scrape(mport), "sockherd_worker_loop_threads_alive", worker=name) == 2

    held: list = []
    holder = threading.Thread(target=get, args=(m.port, "/hold", held))
    holder.start()
    try:
        wait_for(lambda: (tmp_path / "holding").exists(), 20, "the held request")
        assert get(m.port, "/kill").endswith(b"%d" % pid)
        m.wait_log(rf"\[worker {pid}\] ERROR 1 of 2 loop threads ended")
        # draining, its busy thread still in the app: the master sees 1 of 2
        assert wait_for(lambda: (name, pid, 2, 1) in alive(tmp_path), 20,
                        lambda: f"1 of 2 alive in show proc: {alive(tmp_path)}")
        assert value(scrape(mport), "sockherd_worker_loop_threads_alive", worker=name) == 1
    finally:
        (tmp_path / "release").touch()
        holder.join(60)
    assert held and held[0].startswith(b"HTTP/1.1 200 OK"), held
    m.wait_log(rf"exited with status 70 \(crashed\), pid {pid}")
    wait_for(lambda: gone(pid), 10, "the worker reaped")
    m.wait_log(r"worker \d+\.\d+: ready", count=2)
    assert wait_for(lambda: [w for w in alive(tmp_path) if w[1] != pid and w[3] == 2], 20,
                    "the replacement's 2 of 2")
