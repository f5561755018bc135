"""--metrics: Prometheus metrics from a real master with real workers, read
the way Prometheus reads them (prometheus_client's own parser), and the
pure parts (the restart count kept from events, the gatherer's deadline)
without any process. Every process is reaped by the `master` fixture;
every wait polls with a deadline."""
from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import re
import signal
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sockherd.master import metrics
from test_reload import free_port
from test_run import children, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

APP = """
import os
VERSION = {version!r}
def app(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/missing":
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"no such page"]
    if path == "/fail":
        start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
        return [b"not now"]
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [("%s %d" % (VERSION, os.getpid())).encode()]
"""


def write_app(path: Path, version: str) -> None:
    (path / "metricsapp.py").write_text(APP.format(version=version))


def request(port: int, path: str) -> tuple[int, str]:
    """One request on a fresh connection (spread over the workers)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def scrape(port: int) -> dict[str, list]:
    """/metrics parsed: sample name (a counter's with its _total, an info's
    with its _info) -> the samples of that name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=15) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def status_json(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/status.json", timeout=15) as r:
        return json.loads(r.read())


def value(fams: dict, name: str, **labels) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    return sum(s.value for s in fams.get(name, ())
               if all(s.labels.get(k) == v for k, v in labels.items()))


def per_worker(fams: dict, name: str, **labels) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in fams.get(name, ()):
        if all(s.labels.get(k) == v for k, v in labels.items()):
            out[s.labels["worker"]] = out.get(s.labels["worker"], 0) + s.value
    return out


def start(master, tmp_path: Path, *args: str) -> tuple[object, int]:
    write_app(tmp_path, "v1")
    mport = free_port()
    m = master("metricsapp:app", "-w", "2", "--threads", "2", "--metrics", f"127.0.0.1:{mport}", *args)
    m.wait_log(rf"metrics on http://127\.0\.0\.1:{mport}/metrics")
    return m, mport


def crash(m, mport: int, worker: str, restarts: int = 1, within: float = 10) -> tuple[int, dict]:
    """Kills `worker` from outside (a restart): (its pid, the first scrape
    that counts `restarts` restarts, once its successor is READY)."""
    victim = int(next(s.labels["pid"] for s in scrape(mport)["sockherd_worker_info"]
                      if s.labels["worker"] == worker))
    os.kill(victim, signal.SIGKILL)
    m.wait_log(r"worker %s: ready, pid (?!%d\b)\d+" % (re.escape(worker), victim))
    fams = wait_for(lambda: (f := scrape(mport))
                    and value(f, "sockherd_worker_restarts_total") == restarts and f,
                    within, f"{restarts} restart(s) counted")
    return victim, fams


def test_requests_and_responses_add_up_per_worker_and_per_status_class(master, tmp_path):
    m, mport = start(master, tmp_path)
    sent = {"/": 30, "/missing": 7, "/fail": 3}
    for path, n in sent.items():
        for _ in range(n):
            status, _ = request(m.port, path)
            assert status == {"/": 200, "/missing": 404, "/fail": 503}[path]
    total = sum(sent.values())
    # the engine counts a request once its response is written: poll
    fams = wait_for(lambda: (f := scrape(mport))
                    and value(f, "sockherd_worker_requests_total") == total and f,
                    10, lambda: f"{total} requests in the metrics")
    workers = per_worker(fams, "sockherd_worker_requests_total", generation="1")
    assert sorted(workers) == ["1.0", "1.1"] and sum(workers.values()) == total
    assert value(fams, "sockherd_worker_responses_total", **{"class": "2xx"}) == 30
    assert value(fams, "sockherd_worker_responses_total", **{"class": "4xx"}) == 7
    assert value(fams, "sockherd_worker_responses_total", **{"class": "5xx"}) == 3
    assert value(fams, "sockherd_worker_responses_total", **{"class": "3xx"}) == 0
    for worker, n in workers.items():      # each worker's classes add up to its requests
        assert value(fams, "sockherd_worker_responses_total", worker=worker) == n
    assert value(fams, "sockherd_scrape_complete") == 1
    assert value(fams, "sockherd_workers", role="serving") == 2
    assert value(fams, "sockherd_workers", role="draining") == 0
    pids = {str(p) for p in children(m.proc.pid)}
    info = fams["sockherd_worker_info"]
    assert {s.labels["pid"] for s in info} == pids
    assert all(s.labels["role"] == "serving" and s.labels["state"] == "ready" for s in info)
    # per thread: each worker's two loop threads, with the labels Prometheus joins on
    loops = fams["sockherd_thread_loops_total"]
    assert sorted((s.labels["worker"], s.labels["thread"]) for s in loops) == \
        [("1.0", "0"), ("1.0", "1"), ("1.1", "0"), ("1.1", "1")]
    assert all(set(s.labels) == {"generation", "worker", "pid", "thread", "tgid"} for s in loops)
    assert {s.labels["pid"] for s in loops} == pids
    # every connection was accepted by some loop thread of some worker
    assert value(fams, "sockherd_thread_accepted_total") >= total
    assert value(fams, "sockherd_worker_accept_pauses_total") == 0
    for reason in ("emfile", "max_connections"):
        assert len([s for s in fams["sockherd_worker_accept_pauses_total"]
                    if s.labels["reason"] == reason]) == 2


def test_reloads_and_restarts_are_counted(master, tmp_path):
    m, mport = start(master, tmp_path)
    fams = scrape(mport)
    assert value(fams, "sockherd_reloads_ok_total") == 0
    assert value(fams, "sockherd_worker_restarts_total") == 0
    old = set(children(m.proc.pid))

    write_app(tmp_path, "v2")
    m.proc.send_signal(signal.SIGHUP)
    m.wait_log(r"reload: generation 2 serving")
    fams = scrape(mport)
    assert value(fams, "sockherd_reloads_ok_total") == 1
    assert value(fams, "sockherd_master_generation") == 2
    assert sorted(per_worker(fams, "sockherd_worker_uptime_seconds", generation="2")) == \
        ["2.0", "2.1"]
    # the old generation drains: listed as draining until it is gone, never a restart
    wait_for(lambda: not old & set(children(m.proc.pid)), 30, "generation 1's exit")
    fams = wait_for(lambda: (f := scrape(mport)) and not per_worker(
        f, "sockherd_worker_uptime_seconds", generation="1") and f, 10, "generation 1 unlisted")
    assert value(fams, "sockherd_worker_restarts_total") == 0

    # a refused reload: counted, and its killed workers are no restarts
    (tmp_path / "metricsapp.py").write_text("raise RuntimeError('broken on purpose')\n")
    m.proc.send_signal(signal.SIGHUP)
    m.wait_log(r"reload refused \(generation 3\)")
    write_app(tmp_path, "v2")
    fams = scrape(mport)
    assert value(fams, "sockherd_reloads_failed_total") == 1
    assert value(fams, "sockherd_reloads_ok_total") == 1

    # a serving worker killed from outside: a restart, and its successor is listed
    victim, fams = crash(m, mport, "2.0")
    assert value(fams, "sockherd_worker_restarts_total", outcome="crashed") == 1
    assert value(fams, "sockherd_workers", role="serving") == 2
    assert str(victim) not in {s.labels["pid"] for s in fams["sockherd_worker_info"]}
    assert value(fams, "sockherd_reloads_ok_total") == 1


def test_accept_pauses_at_max_connections_are_counted(master, tmp_path):
    """A worker at its max_connections stops accepting (the third client
    waits in the backlog, nothing is refused) and the pause is counted."""
    write_app(tmp_path, "v1")
    mport = free_port()
    m = master("metricsapp:app", "-w", "1", "--max-connections", "2",
               "--metrics", f"127.0.0.1:{mport}", ready=1)
    kept = [http.client.HTTPConnection("127.0.0.1", m.port, timeout=10) for _ in range(2)]
    waiting = None
    try:
        for c in kept:                                  # two kept-alive connections: the cap
            c.request("GET", "/")
            assert c.getresponse().read().startswith(b"v1 ")
        waiting = socket.create_connection(("127.0.0.1", m.port), timeout=10)
        waiting.sendall(b"GET /missing HTTP/1.1\r\nHost: x\r\n\r\n")
        fams = wait_for(lambda: (f := scrape(mport)) and value(
            f, "sockherd_worker_accept_pauses_total", reason="max_connections") >= 1 and f,
            10, "a max_connections pause counted")
        assert value(fams, "sockherd_worker_accept_pauses_total", reason="emfile") == 0
        assert value(fams, "sockherd_worker_connections") == 2
        kept.pop().close()                              # one closes: the waiting one is served
        assert waiting.recv(100).startswith(b"HTTP/1.1 404 ")
    finally:
        for c in kept:
            c.close()
        if waiting is not None:
            waiting.close()


def test_a_scrape_answers_in_time_while_a_worker_is_stopped(master, tmp_path):
    """SIGSTOP one worker: the scrape still answers within the deadline, says
    the scrape is incomplete and which worker did not answer, and still
    carries the other worker's figures."""
    m, mport = start(master, tmp_path)
    for _ in range(6):
        assert request(m.port, "/")[0] == 200
    stopped = min(children(m.proc.pid))
    os.kill(stopped, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        fams = scrape(mport)
        took = time.monotonic() - t0
    finally:
        os.kill(stopped, signal.SIGCONT)
    assert took < metrics.SCRAPE_TIMEOUT + 1.0, took
    assert value(fams, "sockherd_scrape_complete") == 0
    assert value(fams, "sockherd_worker_answered", pid=str(stopped)) == 0
    others = [p for p in children(m.proc.pid) if p != stopped]
    assert value(fams, "sockherd_worker_answered", pid=str(others[0])) == 1
    assert per_worker(fams, "sockherd_thread_loops_total", pid=str(stopped)) == {}
    assert per_worker(fams, "sockherd_thread_loops_total", pid=str(others[0]))
    # resumed: the next scrape is whole again
    wait_for(lambda: value(scrape(mport), "sockherd_scrape_complete") == 1, 15,
             "a complete scrape after SIGCONT")


def ready(port: int) -> tuple[int, str]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", "/-/ready")
        r = c.getresponse()
        return r.status, r.read().decode().strip()
    finally:
        c.close()


def test_status_json_ready_and_routes(master, tmp_path):
    m, mport = start(master, tmp_path, "--unready-delay", "3")
    base = f"http://127.0.0.1:{mport}"
    doc = status_json(mport)
    assert doc["complete"] is True
    assert doc["tree"]["master"]["pid"] == m.proc.pid
    assert sorted(w["worker"] for w in doc["tree"]["workers"]) == ["1.0", "1.1"]
    assert all(len(w["threads"]) == 2 for w in doc["tree"]["workers"])
    assert f"master pid {m.proc.pid}" in doc["html"]
    with urllib.request.urlopen(f"{base}/-/status", timeout=15) as r:
        page = r.read().decode()
        assert r.headers["Content-Type"].startswith("text/html")
    assert 'data-generation="1"' in page and page.count('class="worker"') == 2
    c = http.client.HTTPConnection("127.0.0.1", mport, timeout=10)
    c.request("GET", "/nothing-here")
    assert c.getresponse().status == 404
    c.close()
    c = http.client.HTTPConnection("127.0.0.1", mport, timeout=10)
    c.request("POST", "/metrics", body=b"x")
    assert c.getresponse().status == 405
    c.close()
    # a client that connects and says nothing holds no scrape back
    idle = socket.create_connection(("127.0.0.1", mport), timeout=10)
    try:
        assert value(scrape(mport), "sockherd_scrape_complete") == 1
    finally:
        idle.close()
    assert ready(mport) == (200, "ready")
    # TERM with unready_delay: the readiness check fails at once while the
    # workers still serve; then the drain, the server thread is stopped at
    # close, and the master exits 0
    m.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: ready(mport) == (503, "stopping"), 10, "/-/ready saying stopping")
    assert request(m.port, "/")[0] == 200                # still served: the lame duck
    assert m.proc.wait(timeout=30) == 0


def test_a_metrics_address_that_cannot_be_bound_stops_the_start(master, tmp_path):
    write_app(tmp_path, "v1")
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    try:
        m = master("metricsapp:app", "-w", "1", "--metrics", f"127.0.0.1:{port}", ready=None)
        assert m.proc.wait(timeout=30) == 1
    finally:
        taken.close()
    assert f"metrics: cannot listen on 127.0.0.1:{port}: Address already in use" in m.text()
    assert "spawned" not in m.text()                  # before any worker starts
    m = master("metricsapp:app", "-w", "1", "--metrics", "no-port-here", ready=None)
    assert m.proc.wait(timeout=30) == 1
    assert "'no-port-here': expected host:port" in m.text()


@pytest.mark.long                          # 37 s in a loaded run: scheduled first
def test_an_upgrade_serves_the_metrics_again_from_the_new_image(master, tmp_path):
    """The same listening socket across the exec (ipc.reexec metrics_fd):
    /-/ready is never refused meanwhile (the multi-host proof saw a balancer
    take a host out at every other upgrade when it was bound again)."""
    import threading

    from test_run import listener_inode

    m, mport = start(master, tmp_path)
    inode = listener_inode(mport)
    refused, answered, stop = [], [], threading.Event()

    def probe():
        while not stop.is_set():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{mport}/-/ready",
                                            timeout=10) as r:
                    answered.append(r.status)
            except urllib.error.HTTPError as exc:
                answered.append(exc.code)
            except (ConnectionRefusedError, urllib.error.URLError) as exc:
                refused.append(repr(exc))
            stop.wait(0.01)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        m.proc.send_signal(signal.SIGUSR2)
        m.wait_log(r"reload: generation 2 serving")
        m.wait_log(rf"metrics on http://127\.0\.0\.1:{mport}/metrics", count=2)
    finally:
        stop.set()
        prober.join(30)
    assert refused == [] and len(answered) > 5, refused[:3]
    assert listener_inode(mport) == inode
    fams = scrape(mport)
    assert value(fams, "sockherd_master_generation") == 2
    assert sorted(per_worker(fams, "sockherd_worker_uptime_seconds", generation="2")) == \
        ["2.0", "2.1"]
    assert status_json(mport)["tree"]["master"]["pid"] == m.proc.pid      # the same master


def test_a_takeover_gets_the_metrics_address_once_the_old_instance_is_gone(master, tmp_path):
    """The new instance starts while the old one still serves the metrics
    address: it waits for it instead of refusing to start."""
    write_app(tmp_path, "v1")
    handoff, mport = str(tmp_path / "handoff.sock"), free_port()
    common = ("--handoff-socket", handoff, "--metrics", f"127.0.0.1:{mport}", "-w", "1")
    first = master("metricsapp:app", *common, ready=1)
    first.wait_log(r"hand-off socket .*: a new instance may take the listeners over")
    assert status_json(mport)["tree"]["master"]["pid"] == first.proc.pid
    second = master("metricsapp:app", *common, "--takeover", handoff, ready=1)
    second.wait_log(rf"metrics: cannot listen on 127\.0\.0\.1:{mport}: Address already in "
                    rf"use; listening once the instance taken over is gone")
    assert first.proc.wait(timeout=30) == 0
    second.wait_log(rf"metrics on http://127\.0\.0\.1:{mport}/metrics")
    doc = status_json(mport)
    assert doc["tree"]["master"]["pid"] == second.proc.pid
    assert [w["pid"] for w in doc["tree"]["workers"]] == children(second.proc.pid)


# ---- pure parts ------------------------------------------------------------------------------
def ev(kind: str, **fields) -> dict:
    return {"event": kind, "time": 0.0, **fields}


def life(r: metrics.Restarts, worker: str, pid: int, *, ready: bool = True) -> None:
    r.on_event(ev("spawned", worker=worker, pid=pid))
    if ready:
        r.on_event(ev("ready", worker=worker, pid=pid))


def exited(r: metrics.Restarts, worker: str, pid: int, outcome: str) -> None:
    r.on_event(ev("exited", worker=worker, pid=pid, status="x", outcome=outcome))


def test_restarts_count_only_unplanned_exits_of_serving_workers():
    r = metrics.Restarts()
    life(r, "1.0", 10)
    life(r, "1.1", 11)
    exited(r, "1.0", 10, "crashed")                     # crashed while serving
    life(r, "1.0", 12)
    exited(r, "1.0", 12, "killed")                      # heartbeat lost
    life(r, "1.0", 13, ready=False)
    exited(r, "1.0", 13, "failed_start")                # never served
    assert r.snapshot() == {"crashed": 1, "killed": 1}
    # a reload: new generation ready, the old one told to drain; one old
    # worker is killed at hard_stop_after: all planned
    life(r, "2.0", 20)
    life(r, "2.1", 21)
    r.on_event(ev("reload_ok", generation=2, seconds=0.1))
    for pid in (11, 14):
        r.on_event(ev("draining", worker="1.1", pid=pid))
    exited(r, "1.1", 11, "killed")
    # a refused reload kills its generation's workers, READY or not
    life(r, "3.0", 30)
    life(r, "3.1", 31, ready=False)
    r.on_event(ev("reload_failed", generation=3, reason="worker 3.1 failed"))
    exited(r, "3.0", 30, "killed")
    exited(r, "3.1", 31, "failed_start")
    # a worker adopted across an upgrade (never spawned by this image) that crashes
    exited(r, "2.5", 99, "crashed")
    assert r.snapshot() == {"crashed": 2, "killed": 1}
    # once stopping, nothing is a restart
    r.on_event(ev("stopping", fast=True))
    exited(r, "2.0", 20, "killed")
    exited(r, "2.1", 21, "crashed")
    assert r.snapshot() == {"crashed": 2, "killed": 1}


class _Sup:
    """run_in_loop only: a loop that never runs what it is given (a master
    stuck in a long step), or runs it in a thread of its own."""

    def __init__(self, runs: bool):
        self.runs = runs

    def run_in_loop(self, fn) -> None:
        if self.runs:
            concurrent.futures.ThreadPoolExecutor(1).submit(fn).result(timeout=5)


def test_a_master_that_does_not_run_the_call_gets_an_answer_at_the_deadline():
    g = metrics.Gatherer(_Sup(runs=False), timeout=0.3)
    t0 = time.monotonic()
    assert g.get() == (None, False)
    assert time.monotonic() - t0 < 2.0
    # the collector still exports what the master keeps from events
    fams = {f.name: f for f in metrics.families(None, False, {"crashed": 2})}
    assert fams["sockherd_scrape_complete"].samples[0].value == 0
    assert {s.labels["outcome"]: s.value for s in fams["sockherd_worker_restarts"].samples} \
        == {"crashed": 2, "killed": 0}


def test_workers_that_do_not_answer_leave_the_masters_own_view(monkeypatch):
    snap = {"master": {"pid": 1}, "workers": [{"worker": "1.0", "pid": 5}]}
    monkeypatch.setattr(metrics.inspect, "snapshot", lambda sup: snap)
    monkeypatch.setattr(metrics.inspect, "tree", lambda sup, done: None)   # never done
    g = metrics.Gatherer(_Sup(runs=True), timeout=0.3)
    tree, complete = g.get()
    assert not complete
    assert tree["workers"] == [{"worker": "1.0", "pid": 5, "stats": None, "threads": None}]
