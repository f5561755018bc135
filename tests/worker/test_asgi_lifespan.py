"""ASGI lifespan on a real master and workers (issue 22 §2, lifespan): startup
runs before the worker is READY and before anything is served; a failed
startup stops a first start with the app's message and exit status 1, and
refuses a reload while the serving generation serves on; shutdown runs on
TERM once the drain's last connection closed, within the drain deadline;
`lifespan off` never calls the lifespan scope; an app without lifespan
support under `auto` is served without it. With --threads N > 1 (issue 35 point
10) an app that takes part in lifespan is refused before READY, before its
startup code ran (what startup makes would be bound to one loop of N: one
asyncio.Lock shared by 8 requests gave 3 RuntimeErrors, 4 hangs, 1
success); one that does not take part, or `lifespan off`, is served.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "master"))
from test_reload import Clients  # noqa: E402
from test_run import children, master, wait_for  # noqa: E402,F401 - master: the fixture

pytestmark = pytest.mark.timeout(120)

COMMON = """
import asyncio, os
HERE = os.path.dirname(os.path.abspath(__file__))

def mark(name):
    with open(os.path.join(HERE, name), "a") as f:
        f.write("%d\\n" % os.getpid())

async def http(scope, receive, send):
    body = ("state=%s" % scope.get("state", {}).get("token")).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
"""

APPS = {
    # startup waits for the test's "go" file; shutdown may be told to hang
    "life.py": COMMON + """
async def app(scope, receive, send):
    if scope["type"] == "http":
        return await http(scope, receive, send)
    mark("lifespan-called")
    assert (await receive())["type"] == "lifespan.startup"
    mark("startup-began")
    while not os.path.exists(os.path.join(HERE, "go")):
        await asyncio.sleep(0.02)
    scope["state"]["token"] = "tok-%d" % os.getpid()
    mark("started")
    await send({"type": "lifespan.startup.complete"})
    assert (await receive())["type"] == "lifespan.shutdown"
    mark("shutdown-began")
    while os.path.exists(os.path.join(HERE, "hang")):
        await asyncio.sleep(0.02)
    mark("stopped")
    await send({"type": "lifespan.shutdown.complete"})
""",
    "failmsg.py": COMMON + """
async def app(scope, receive, send):
    if scope["type"] == "http":
        return await http(scope, receive, send)
    await receive()
    await send({"type": "lifespan.startup.failed",
                "message": "database unreachable at db:5432"})
""",
    "failraise.py": COMMON + """
async def app(scope, receive, send):
    if scope["type"] == "http":
        return await http(scope, receive, send)
    await receive()
    raise RuntimeError("cache warm-up failed")
""",
    # no lifespan support: refuses every scope but http at once
    "nolife.py": COMMON + """
async def app(scope, receive, send):
    if scope["type"] != "http":
        mark("lifespan-called")
    assert scope["type"] == "http", "no lifespan here"
    await http(scope, receive, send)
""",
    "asgi2app.py": COMMON + """
class App:
    def __init__(self, scope):
        self.scope = scope
    async def __call__(self, receive, send):
        if self.scope["type"] == "http":
            return await http(self.scope, receive, send)
        await receive()
        mark("started")
        await send({"type": "lifespan.startup.complete"})
        await receive()
        await send({"type": "lifespan.shutdown.complete"})
""",
    # a WSGI app, or an ASGI app whose startup fails: the "mode" file says
    "switch.py": COMMON + """
MODE = open(os.path.join(HERE, "mode")).read().strip()
if MODE == "wsgi":
    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"v1 %d" % os.getpid()]
else:
    async def app(scope, receive, send):
        if scope["type"] == "http":
            return await http(scope, receive, send)
        await receive()
        mark("startup-failing")
        await send({"type": "lifespan.startup.failed",
                    "message": "database unreachable at db:5432"})
""",
}

REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture
def apps(tmp_path):
    for name, text in APPS.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def port_of(m) -> int:
    m.port = int(m.wait_log(r"listening on 127\.0\.0\.1:(\d+)")[0])
    return m.port


def response(m) -> bytes:
    with m.connect() as c:
        c.sendall(REQUEST)
        return c.recv(1000)


def main_thread_cpu(pid: int) -> float:
    """CPU seconds of pid's main thread (the one that waits in select())."""
    with open(f"/proc/{pid}/task/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def never(fn, seconds: float, what: str) -> None:
    """fn() stays false for `seconds` (polled)."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        assert not fn(), what
        time.sleep(0.02)


# (--threads 4 was a variant here: an app with a lifespan startup is refused with
# more than one loop thread now, issue 35 point 10, tested below)
@pytest.mark.parametrize("threads", [()])
def test_startup_completes_before_ready_and_nothing_is_served_before(master, apps, threads):
    m = master("life:app", "-w", "1", *threads, ready=None)
    port_of(m)
    wait_for(lambda: (apps / "startup-began").exists(), 30, "the lifespan startup to begin")
    # a client during startup: the kernel queues it, nobody serves it yet
    with m.connect() as early:
        early.sendall(REQUEST)
        early.settimeout(1.0)
        with pytest.raises(TimeoutError):
            early.recv(100)
        assert not re.search(r"worker 1\.0: ready", m.text())
        (apps / "go").write_text("")
        m.wait_log(r"worker 1\.0: ready")
        assert (apps / "started").exists()
        text = m.text()
        assert text.index("lifespan: startup complete") < text.index("worker 1.0: ready")
        # served now, the early client first
        early.settimeout(10)
        assert early.recv(100).startswith(b"HTTP/1.1 ")
    assert "interface: asgi (a coroutine function)" in text


def test_startup_state_reaches_each_request_scope(master, apps):
    (apps / "go").write_text("")
    m = master("life:app", "-w", "1", ready=1)
    pid = children(m.proc.pid)[0]
    assert response(m).endswith(b"state=tok-%d" % pid)


@pytest.mark.parametrize("spec, args, why", [
    ("failmsg:app", (), "lifespan startup failed: database unreachable at db:5432"),
    ("failraise:app", (), "lifespan startup failed: the app raised RuntimeError: "
                          "cache warm-up failed"),
    ("nolife:app", ("--lifespan", "on"), "lifespan startup failed: the app raised "
                                         "AssertionError: no lifespan here"),
])
def test_a_failed_startup_stops_the_first_start_with_the_apps_message(master, apps, spec, args,
                                                                      why):
    m = master(spec, "-w", "2", *args, ready=None)
    assert m.proc.wait(timeout=60) == 1
    text = m.text()
    assert re.search(r"\[master \d+\] ERROR worker 1\.\d: failed before ready: " + re.escape(why),
                     text), text
    assert "no worker became ready" in text
    assert not re.search(r"worker 1\.\d: ready", text)
    if spec == "failraise:app":             # the app's traceback, for its author
        assert "Traceback" in text and 'failraise.py", line' in text


def test_a_failed_startup_refuses_the_reload_and_the_old_generation_serves_on(master, apps):
    (apps / "mode").write_text("wsgi")
    m = master("switch:app", "-w", "2")
    serving = set(children(m.proc.pid))
    clients = Clients(m.port, fresh=1, kept=1)
    try:
        (apps / "mode").write_text("asgi")
        m.proc.send_signal(signal.SIGHUP)
        m.wait_log(r"reload refused \(generation 2\): worker 2\.\d failed before ready: "
                   r"lifespan startup failed: database unreachable at db:5432")
        m.wait_log(r"generation 1 keeps serving")
        assert (apps / "startup-failing").exists()
        wait_for(lambda: set(children(m.proc.pid)) == serving, 20, "the refused workers' end")
        before = clients.ok
        wait_for(lambda: clients.ok > before + 10, 10, "traffic after the refusal")
    finally:
        clients.stop()
    assert clients.failures == [], clients.failures[:5]
    assert set(clients.versions) == {"v1"}
    assert m.proc.poll() is None


def test_shutdown_runs_on_term_once_the_last_connection_closed(master, apps):
    (apps / "go").write_text("")
    m = master("life:app", "-w", "1", "--idle-grace", "3", ready=1)
    with m.connect() as idle:           # kept open: the drain closes it after idle_grace
        m.proc.send_signal(signal.SIGTERM)
        m.wait_log(r"\[worker \d+\] INFO draining")
        never(lambda: (apps / "shutdown-began").exists(), 1.5,
              "lifespan shutdown began while a connection was still open")
        idle.settimeout(15)
        assert idle.recv(100) == b""
    wait_for(lambda: (apps / "stopped").exists(), 15, "the lifespan shutdown")
    assert m.proc.wait(timeout=30) == 0
    text = m.text()
    assert text.index("drained: no connection left; lifespan shutdown") < \
        text.index("lifespan: shutdown complete")
    assert re.search(r"worker 1\.0: exited with status 0 \(drained\)", text)


def test_a_shutdown_that_hangs_ends_at_the_drain_deadline(master, apps):
    (apps / "go").write_text("")
    (apps / "hang").write_text("")
    m = master("life:app", "-w", "1", "--hard-stop-after", "3", ready=1)
    worker = children(m.proc.pid)[0]
    m.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: (apps / "shutdown-began").exists(), 15, "the lifespan shutdown")
    # the worker waits for the app without spinning (its drained eventfd
    # stays readable: it kept select() busy, a core for the whole wait)
    cpu0 = main_thread_cpu(worker)
    never(lambda: "drain deadline reached" in m.text(), 1.0, "the deadline came early")
    cpu = main_thread_cpu(worker) - cpu0
    assert cpu < 0.1, f"the worker's main thread used {cpu:.2f}s of CPU in 1s of waiting"
    m.wait_log(r"drain deadline reached during the lifespan shutdown: exiting without it")
    assert m.proc.wait(timeout=30) == 0
    assert not (apps / "stopped").exists()


def test_lifespan_off_never_calls_the_lifespan_scope(master, apps):
    # no "go" file: a startup would never complete, READY would never come
    m = master("life:app", "-w", "1", "--lifespan", "off", ready=1)
    assert response(m).startswith(b"HTTP/1.1 ")
    m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(timeout=30) == 0
    assert not (apps / "lifespan-called").exists()
    assert not re.search(r"\] \w+ lifespan", m.text())       # no log line of the protocol


def test_an_app_without_lifespan_support_is_served_under_auto(master, apps):
    m = master("nolife:app", "-w", "1", ready=1)
    assert (apps / "lifespan-called").exists()
    m.wait_log(r"INFO lifespan: not supported by the app \(it raised AssertionError: no "
               r"lifespan here before asking for lifespan.startup\): serving without it")
    assert response(m).startswith(b"HTTP/1.1 ")
    m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(timeout=30) == 0
    assert "lifespan shutdown" not in m.text()


def test_an_asgi2_app_is_wrapped_and_gets_its_lifespan(master, apps):
    m = master("asgi2app:App", "-w", "1", ready=1)
    assert (apps / "started").exists()
    m.wait_log(r"interface: asgi \(an ASGI 2 class: .*, wrapped as ASGI 3\)")
    assert response(m).startswith(b"HTTP/1.1 ")


def test_a_lifespan_app_with_several_loop_threads_is_refused_before_ready(master, apps):
    (apps / "go").write_text("")
    m = master("life:app", "-w", "1", "--threads", "4", "--thread-groups", "2", ready=None)
    try:
        assert m.proc.wait(timeout=60) == 1
    except BaseException:
        print(m.text())
        raise
    text = m.text()
    assert re.search(r"\[master \d+\] ERROR worker 1\.0: failed before ready: lifespan "
                     r"startup refused: .*with --threads 4 .*bound to one loop", text), text
    assert "no worker became ready" in text
    assert not re.search(r"worker 1\.\d: ready", text)
    # refused at its first receive(): its startup code never ran
    assert (apps / "lifespan-called").exists() and not (apps / "startup-began").exists()


@pytest.mark.parametrize("spec, args", [("nolife:app", ()), ("life:app", ("--lifespan", "off"))])
def test_several_loop_threads_serve_an_app_without_lifespan(master, apps, spec, args):
    m = master(spec, "-w", "1", "--threads", "2", *args, ready=1)
    port_of(m)
    assert response(m).startswith(b"HTTP/1.1 200")
    assert not (apps / "startup-began").exists()
