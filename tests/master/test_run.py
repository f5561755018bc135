"""`sockherd run` as a real master with real workers on loopback. Every
process (master and workers) is killed and reaped by the fixture whatever
happens; every wait polls with a deadline."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

APPS = {
    "echoapp.py": """
class Echo:
    def on_data(self, conn, data):
        conn.write(data)
""",
    "slowapp.py": """
import time
class Slow:
    def on_data(self, conn, data):
        if data.startswith(b"slow"):
            conn.write(b"started;")
            time.sleep(1.5)                  # a handler that blocks
        conn.write(b"done:" + data)
""",
    "crashapp.py": """
import os, threading
threading.Timer(0.3, os._exit, (3,)).start()   # serves a moment, then dies
class Echo:
    def on_data(self, conn, data):
        conn.write(data)
""",
    "whoapp.py": """
import os, time
class Who:
    def on_data(self, conn, data):
        if data == b"who":
            conn.write(b"%d" % conn.th.tid)      # which loop thread serves us
        elif data == b"block":
            time.sleep(2.0)                      # a handler that blocks its thread
            conn.write(b"unblocked")
        else:
            conn.write(b"%d:" % conn.th.tid + data)
""",
    "lineapp.py": """
class Lines:
    def on_connect(self, conn):
        self.buf = b""
        conn.write(b"hello\\n")
    def on_data(self, conn, data):
        self.buf += data
        while b"\\n" in self.buf:
            line, self.buf = self.buf.split(b"\\n", 1)
            if line == b"QUIT":
                conn.write(b"bye\\n")
                conn.close()
                return
            conn.write(b"%d\\n" % len(line))
""",
    "pidapp.py": """
import os, time
class Pid:
    def on_data(self, conn, data):
        if data == b"sleep":
            time.sleep(4)                        # this worker's only thread is busy
        conn.write(b"%d/%d" % (os.getpid(), conn.th.tid))
""",
    "wsgiapp.py": """
import os
def app(environ, start_response):
    body = ("%s %s from %d" % (environ["REQUEST_METHOD"], environ["PATH_INFO"], os.getpid())).encode()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [body]
""",
    "badapp.py": "raise RuntimeError('missing SECRET_KEY')\n",
    "hangapp.py": "import time\ntime.sleep(60)\n",
}


def wait_for(fn, timeout: float, what):
    """fn()'s first true value, polled until the deadline; `what` (a str, or
    a callable giving one at the timeout) says what was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        assert time.monotonic() < deadline, \
            f"timed out waiting for {what() if callable(what) else what}"
        time.sleep(0.02)


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie waiting for its new parent."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):   # gone between open and read
        return True


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


class Master:
    def __init__(self, proc: subprocess.Popen, log: Path):
        self.proc = proc
        self.log = log
        self.port = 0

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_log(self, pattern: str, timeout: float = 30, count: int = 1) -> list[str]:
        return wait_for(lambda: (m := re.findall(pattern, self.text())) and len(m) >= count and m,
                        timeout, lambda: f"log line {pattern!r} x{count}\n{self.text()}")

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)


class Masters:
    """Starts masters on a directory of their own (the test apps written
    there, each master's log beside them) and reaps every one at the end.
    Their runtime directory (control endpoint) is one for all, as a
    takeover needs, unless `own_runtime_dirs` (masters that run side by
    side, each serving its own control endpoint)."""

    def __init__(self, tmp_path: Path, own_runtime_dirs: bool = False):
        for name, text in APPS.items():
            (tmp_path / name).write_text(text)
        self.tmp_path = tmp_path
        self.own_runtime_dirs = own_runtime_dirs
        self.started: list[Master] = []

    def start(self, *args: str, ready: int | None = 2, nofile: int | tuple | None = None,
              bind: str | None = "127.0.0.1:0", chdir: Path | None = None) -> Master:
        """bind None: no -b (the settings file names the addresses)."""
        tmp_path = self.tmp_path
        chdir = chdir or tmp_path
        log = tmp_path / f"master{len(self.started)}.log"
        run = tmp_path / (f"run{len(self.started)}" if self.own_runtime_dirs else "run")

        def limits():
            if nofile:
                import resource
                resource.setrlimit(resource.RLIMIT_NOFILE, nofile if isinstance(nofile, tuple)
                                   else (nofile, nofile))

        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "sockherd.master", "run", *args,
                                     "--chdir", str(chdir), *(["-b", bind] if bind else [])],
                                    stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
                                    preexec_fn=limits if nofile else None,
                                    # its own control endpoint (tests run in parallel);
                                    # masters of one test share it, as a takeover does
                                    env={**os.environ,
                                         "SOCKHERD_RUNTIME_DIR": str(run)})
        m = Master(proc, log)
        self.started.append(m)
        if ready:
            if bind and bind.startswith("127."):
                m.port = int(m.wait_log(r"listening on 127\.0\.0\.1:(\d+)")[0])
            m.wait_log(r"worker \d+\.\d+: ready", count=ready)
        return m

    def reap_all(self) -> None:
        for m in self.started:
            reap(m.proc)


@pytest.fixture
def master(tmp_path: Path):
    masters = Masters(tmp_path)
    yield masters.start
    masters.reap_all()


@pytest.fixture(scope="module")
def module_master(tmp_path_factory):
    """master's starter for the masters a module's tests share: only tests
    that read from a master (requests whose answers they check) may share
    one, and each must hold whatever order the tests run in (names of its
    own for what it leaves behind)."""
    masters = Masters(tmp_path_factory.mktemp("shared"), own_runtime_dirs=True)
    yield masters.start
    masters.reap_all()


def reap(proc: subprocess.Popen, kids: list[int] | None = None) -> None:
    """Kills a master (if still running) and reaps it, then kills its workers
    (those alive now, and `kids`: the ones it had earlier)."""
    kids = set(kids or ()) | set(children(proc.pid))
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)
    for pid in kids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def listener_inode(port: int) -> int:
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and int(cols[1].split(":")[1], 16) == port:
                return int(cols[9])
    raise AssertionError(f"no listener on port {port}")


def epolls_watching(pid: int, inode: int) -> list[int]:
    """The epoll fds of pid whose interest list holds the file `inode`
    (/proc/PID/fdinfo: one `tfd: N events: .. ino:HEX` line per watched fd)."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:[eventpoll]":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                text = f.read()
        except OSError:
            continue
        if re.search(rf"^tfd:.*\bino:{inode:x}\b", text, re.M):
            found.append(int(fd))
    return found


def cpu_and_switches(pid: int) -> tuple[float, int]:
    """CPU seconds and context switches of every thread of pid so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    cpu, switches = 0.0, 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                status = f.read()
        except OSError:
            continue
        cpu += (int(fields[11]) + int(fields[12])) / ticks
        switches += sum(int(n) for n in re.findall(r"ctxt_switches:\s+(\d+)", status))
    return cpu, switches


def refused(m: Master) -> bool:
    try:
        m.connect().close()
    except ConnectionRefusedError:
        return True
    return False


def echo(m: Master, payload: bytes) -> bytes:
    with m.connect() as c:
        c.sendall(payload)
        return c.recv(1000)


def test_serves_with_two_workers_of_four_threads_in_two_groups(master):
    m = master("echoapp:Echo", "--interface", "stream", "-w", "2", "--threads", "4",
               "--thread-groups", "2")
    clients = [m.connect() for _ in range(40)]
    for i, c in enumerate(clients):
        c.sendall(b"n%d" % i)
    for i, c in enumerate(clients):
        assert c.recv(100) == b"n%d" % i
        c.close()
    workers = children(m.proc.pid)
    assert len(workers) == 2
    lino = listener_inode(m.port)
    for pid in workers:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert f.read().startswith(b"sockherd: worker 1.")
        # the kernel's truth: the listener sits in each loop thread's epoll
        # (4; the worker's control context has an epoll of its own without it);
        # polled: a thread applies its poller's updates at its next turn (once
        # in a full run a thread's epoll did not hold it yet after the burst)
        wait_for(lambda: len(epolls_watching(pid, lino)) == 4, 10,
                 lambda: f"the listener in 4 epolls of {pid}: {epolls_watching(pid, lino)}")
    with open(f"/proc/{m.proc.pid}/cmdline", "rb") as f:
        assert f.read().startswith(b"sockherd: master [echoapp:Echo]")


def test_line_protocol_app_with_two_workers_of_four_threads(master):
    m = master("lineapp:Lines", "--interface", "stream", "-w", "2", "--threads", "4",
               "--thread-groups", "2")
    clients = [m.connect() for _ in range(30)]
    try:
        for c in clients:
            assert c.recv(6) == b"hello\n"
        for i, c in enumerate(clients):
            c.sendall(b"x" * i + b"\nab")                # a line and a half
        for i, c in enumerate(clients):
            c.sendall(b"c\nQUIT\n")
        for i, c in enumerate(clients):
            out = b""
            while chunk := c.recv(100):                   # until the server closes
                out += chunk
            assert out == b"%d\n3\nbye\n" % i
    finally:
        for c in clients:
            c.close()


def test_killed_worker_is_respawned_while_the_other_serves(master):
    import threading

    m = master("echoapp:Echo", "--interface", "stream", "-w", "2")
    victim = children(m.proc.pid)[0]
    # load from 4 client threads during the kill: only connections the dead
    # worker held may fail; new ones keep being served throughout
    stop, ok, failed = threading.Event(), [0], [0]

    def client():
        while not stop.is_set():
            try:
                assert echo(m, b"load") == b"load"
                ok[0] += 1
            except (OSError, AssertionError):
                failed[0] += 1

    load = [threading.Thread(target=client) for _ in range(4)]
    for t in load:
        t.start()
    wait_for(lambda: ok[0] > 50, 10, "load running")
    os.kill(victim, signal.SIGKILL)
    before = ok[0]
    wait_for(lambda: ok[0] > before + 200, 20, "served on after the kill")
    stop.set()
    for t in load:
        t.join(10)
    assert failed[0] <= 4, f"{failed[0]} requests failed (only in-flight ones on the victim may)"
    for _ in range(20):                                  # the other one keeps serving
        assert echo(m, b"ping") == b"ping"
    m.wait_log(rf"exited with signal SIGKILL \(crashed\), pid {victim}")
    m.wait_log(r"worker \d+\.\d+: ready", count=3)
    assert victim not in children(m.proc.pid) and len(children(m.proc.pid)) == 2
    assert echo(m, b"again") == b"again"


def test_term_finishes_in_flight_work_refuses_new_connections_and_exits_0(master):
    m = master("slowapp:Slow", "--interface", "stream", "-w", "2", "--idle-grace", "0.3")
    c = m.connect()
    c.sendall(b"slow request")
    assert c.recv(8) == b"started;"                      # the handler is inside now
    lino = listener_inode(m.port)
    workers = children(m.proc.pid)
    assert all(epolls_watching(pid, lino) for pid in workers)
    m.proc.send_signal(signal.SIGTERM)
    m.wait_log("graceful stop")
    # refused, not accepted then reset: the master's copies are closed and
    # each worker deletes its own at once, though its only thread is busy
    wait_for(lambda: refused(m), 10, "new connections refused")
    # and DEL'ed from every epoll before the close (seed 004): no epoll of
    # a draining worker still lists the listener's file
    wait_for(lambda: not any(epolls_watching(pid, lino) for pid in workers if not gone(pid)),
             10, "the listener gone from every draining worker's epolls")
    assert c.recv(100) == b"done:slow request"           # the in-flight request completes
    assert m.proc.wait(timeout=30) == 0
    assert "every worker is gone: exiting" in m.text()
    c.close()


def test_app_failing_at_first_start_exits_1_with_the_reason(master):
    m = master("badapp:app", "--interface", "stream", "-w", "2", ready=None)
    assert m.proc.wait(timeout=60) == 1
    text = m.text()
    assert "RuntimeError: missing SECRET_KEY" in text
    assert "no worker became ready" in text


def test_bad_setting_exits_2_before_binding(master):
    m = master("echoapp:Echo", "-w", "-1", ready=None)
    assert m.proc.wait(timeout=30) == 2
    assert "bad setting: command line: -w = '-1'" in m.text()
    assert "listening on" not in m.text()


def test_killed_master_takes_its_workers_along(master):
    m = master("echoapp:Echo", "--interface", "stream", "-w", "2")
    workers = children(m.proc.pid)
    m.proc.kill()
    m.proc.wait(timeout=10)
    t0 = time.monotonic()
    wait_for(lambda: all(gone(p) for p in workers), 10, "workers to exit after the master died")
    assert time.monotonic() - t0 < 2.5


def test_bare_run_serves_the_embedded_status_page(master):
    import http.client

    m = master("-w", "2", "--threads", "3", "--thread-groups", "2")   # no app
    conn = http.client.HTTPConnection("127.0.0.1", m.port, timeout=10)
    conn.request("GET", "/")
    resp = conn.getresponse()
    body = resp.read().decode()
    conn.close()
    assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/html")
    assert f"master pid {m.proc.pid}" in body
    assert re.search(r"worker 1\.[01], pid \d+", body)
    assert "thread group 1" in body and "thread group 2" in body
    assert len(re.findall(r'<tr class="thread" data-tid="\d+"', body)) == 6
    assert "accepted" in body and "poll_io" in body
    conn = http.client.HTTPConnection("127.0.0.1", m.port, timeout=10)
    conn.request("HEAD", "/")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read() == b""
    conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", m.port, timeout=10)
    conn.request("POST", "/", body=b"x")
    assert conn.getresponse().status == 405
    conn.close()
    with m.connect() as c:
        c.sendall(b"garbage\r\n\r\n")
        assert c.recv(100).startswith(b"HTTP/1.1 400 Bad Request")


def test_worker_not_ready_in_time_is_killed_and_reported(master):
    m = master("hangapp:app", "--interface", "stream", "-w", "1", "--ready-timeout", "1",
               ready=None)
    assert m.proc.wait(timeout=60) == 1
    text = m.text()
    assert "worker 1.0: not ready after 1s" in text
    assert re.search(r"exited with signal SIGKILL \(failed_start\)", text)
    assert "no worker became ready" in text


def test_slow_handler_connections_move_to_an_idle_thread(master):
    """A handler blocking 2 s on one connection: the other connections of its
    thread are taken over by idle threads of the group within takeover_after
    (plus the watchdog's slack), and the takeovers are counted."""
    m = master("whoapp:Who", "--interface", "stream", "-w", "1", "--threads", "3",
               "--takeover-after", "0.3", ready=1)
    by_thread: dict[int, list[socket.socket]] = {}
    conns = []
    for _ in range(60):
        c = m.connect()
        conns.append(c)
        c.sendall(b"who")
        by_thread.setdefault(int(c.recv(10)), []).append(c)
        if any(len(v) >= 4 for v in by_thread.values()):
            break
    tid, group = next((t, v) for t, v in by_thread.items() if len(v) >= 4)
    slow, others = group[0], group[1:]
    try:
        slow.sendall(b"block")
        time.sleep(0.05)                  # let the handler start (not a wait for a result)
        t0 = time.monotonic()
        for c in others:
            c.sendall(b"ping")
        for c in others:
            reply = c.recv(100)
            served_by, _, payload = reply.partition(b":")
            assert payload == b"ping"
            assert int(served_by) != tid                  # another thread answered
        elapsed = time.monotonic() - t0
        assert elapsed < 1.2, f"others waited {elapsed:.2f}s behind the blocked handler"
        assert slow.recv(100) == b"unblocked"
        m.wait_log(rf"took \d+ connection\(s\) from thread {tid}")
    finally:
        for c in conns:
            c.close()
    m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(timeout=30) == 0
    moved = sum(int(n) for n in re.findall(r"totals: .*fd_takeover=(\d+)", m.text()))
    assert moved >= len(others)


def test_ttin_adds_a_worker_and_ttou_drains_one(master):
    m = master("slowapp:Slow", "--interface", "stream", "-w", "1", "--idle-grace", "0.2",
               ready=1)
    m.proc.send_signal(signal.SIGTTIN)
    m.wait_log(r"TTIN: 2 workers")
    m.wait_log(r"worker 1\.1: ready")
    assert len(children(m.proc.pid)) == 2
    newest = int(m.wait_log(r"worker 1\.1: ready, pid (\d+)")[0])
    # the worker TTOU drains finishes what it has in flight: find a
    # connection it serves (the two share one accept queue)
    m.proc.send_signal(signal.SIGTTOU)
    m.wait_log(r"TTOU: 1 workers; draining worker slot 1")
    m.wait_log(rf"worker 1\.1: exited with status 0 \(drained\), pid {newest}")
    wait_for(lambda: children(m.proc.pid) and newest not in children(m.proc.pid), 10,
             "the drained worker reaped")
    assert len(children(m.proc.pid)) == 1
    for _ in range(5):
        assert echo(m, b"still") == b"done:still"
    m.proc.send_signal(signal.SIGTTOU)                   # never below one worker
    m.wait_log(r"TTOU ignored: one worker left")
    assert "spawned, pid" in m.text() and len(re.findall(r"spawned, pid", m.text())) == 2
    m.proc.send_signal(signal.SIGTTIN)                   # the retired slot is reused
    m.wait_log(r"worker 1\.1: ready", count=2)
    assert len(children(m.proc.pid)) == 2


def test_ttou_lets_the_drained_worker_finish_its_request(master):
    m = master("slowapp:Slow", "--interface", "stream", "-w", "2", "--idle-grace", "0.2")
    # a slow request on each worker (they share one accept queue: keep
    # connecting until both workers are busy with one)
    pids = children(m.proc.pid)
    held = []
    for _ in range(20):
        c = m.connect()
        c.sendall(b"slow")
        assert c.recv(8) == b"started;"
        held.append(c)
        busy = {p for p in pids if _has_tcp_peer(p)}
        if busy == set(pids):
            break
    m.proc.send_signal(signal.SIGTTOU)
    m.wait_log(r"draining worker slot 1")
    for c in held:
        assert c.recv(100) == b"done:slow"                # nothing cut short
        c.close()
    m.wait_log(r"worker 1\.1: exited with status 0 \(drained\)")
    assert echo(m, b"x") == b"done:x"


def _has_tcp_peer(pid: int) -> bool:
    """Whether pid holds an established TCP connection (a socket besides its
    listener and socketpair): counted from /proc/pid/fd and /proc/net/tcp."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if cols[3] == "01" and cols[9] in inodes:          # ESTABLISHED
                return True
    return False


def test_worker_missing_heartbeats_is_killed_and_replaced(master):
    """A hung worker (stopped: it cannot answer) is killed once it stays
    silent past heartbeat_timeout, and its slot is respawned."""
    m = master("echoapp:Echo", "--interface", "stream", "-w", "2",
               "--heartbeat-interval", "0.2", "--heartbeat-timeout", "1.0")
    hung = children(m.proc.pid)[0]
    os.kill(hung, signal.SIGSTOP)
    m.wait_log(r"worker 1\.\d: no heartbeat for \d+s: killed", timeout=10)
    m.wait_log(rf"exited with signal SIGKILL \(killed\), pid {hung}")
    m.wait_log(r"worker \d+\.\d+: ready", count=3)
    kids = children(m.proc.pid)
    assert hung not in kids and len(kids) == 2
    assert echo(m, b"alive") == b"alive"
    # the healthy one was never touched
    assert len(re.findall(r"no heartbeat", m.text())) == 1


def test_a_draining_idle_worker_uses_no_cpu(master):
    """TERM with idle connections kept open (long grace): the workers drain,
    waiting for the grace with no busy loop: CPU and wake-ups stay flat."""
    m = master("echoapp:Echo", "--interface", "stream", "-w", "2", "--threads", "4",
               "--idle-grace", "60", "--hard-stop-after", "120")
    held = []
    try:
        for _ in range(8):
            c = m.connect()
            held.append(c)
            c.sendall(b"x")
            assert c.recv(10) == b"x"
        # the workers holding them (idle threads polling one listener with
        # EPOLLEXCLUSIVE: a light load may all land on one worker; a worker
        # with none drains at once and exits)
        workers = [p for p in children(m.proc.pid) if _has_tcp_peer(p)]
        assert workers
        m.proc.send_signal(signal.SIGTERM)
        m.wait_log("graceful stop")
        wait_for(lambda: m.text().count("draining") >= 3, 10, "both workers draining")
        time.sleep(0.3)                       # let the drain's first steps settle
        before = [cpu_and_switches(p) for p in workers]
        time.sleep(2.0)                       # the measuring window
        after = [cpu_and_switches(p) for p in workers]
        for (c0, s0), (c1, s1) in zip(before, after):
            assert c1 - c0 <= 0.03, f"a draining idle worker burned {c1 - c0:.2f}s CPU in 2s"
            assert s1 - s0 <= 4, f"a draining idle worker woke {s1 - s0} times in 2s"
        assert all(not gone(p) for p in workers)    # still draining: the grace holds
    finally:
        for c in held:
            c.close()
    assert m.proc.wait(timeout=30) == 0


def test_emfile_flood_does_not_spin_and_the_worker_recovers(master):
    """With a low fd limit and a connection flood past it, the worker pauses
    accepting (one log line), does not spin, and serves again afterwards."""
    m = master("echoapp:Echo", "--interface", "stream", "-w", "1", "--threads", "2", ready=1,
               nofile=96)
    worker = children(m.proc.pid)[0]
    flood = []
    try:
        for _ in range(150):                   # the backlog takes them all
            flood.append(socket.create_connection(("127.0.0.1", m.port), timeout=10))
        m.wait_log(r"accept on fd \d+: Too many open files; not accepting for", timeout=10)
        c0, _ = cpu_and_switches(worker)
        time.sleep(2.0)                        # the measuring window
        c1, _ = cpu_and_switches(worker)
        assert c1 - c0 < 0.4, f"the worker burned {c1 - c0:.2f}s CPU in 2s at EMFILE"
    finally:
        for c in flood:
            c.close()
    wait_for(lambda: _echo_ok(m), 20, "served again after the flood")
    assert len(re.findall(r"Too many open files", m.text())) == 1      # logged once


def _echo_ok(m: Master) -> bool:
    try:
        return echo(m, b"back") == b"back"
    except OSError:
        return False


def test_unix_socket_with_mode_and_owner(master, tmp_path):
    import grp
    import pwd
    import stat

    path = tmp_path / "app.sock"
    user = pwd.getpwnam("nobody")
    group = grp.getgrgid(user.pw_gid).gr_name
    m = master("echoapp:Echo", "--interface", "stream", "-w", "1", "--unix-mode", "0600",
               "--unix-owner", f"nobody:{group}", bind=f"unix:{path}", ready=None)
    m.wait_log(r"worker \d+\.\d+: ready")
    st = path.stat()
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert (st.st_uid, st.st_gid) == (user.pw_uid, user.pw_gid)
    with socket.socket(socket.AF_UNIX) as c:
        c.settimeout(10)
        c.connect(str(path))
        c.sendall(b"over unix")
        assert c.recv(100) == b"over unix"
    m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(timeout=30) == 0
    assert not path.exists()                  # the master removes its own file


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_workers_run_as_user_without_capabilities(master, tmp_path):
    import pwd

    nobody = pwd.getpwnam("nobody")
    # an app directory nobody may enter (pytest's own tmp tree is root-only)
    shared = Path(tempfile.mkdtemp(prefix="sockherd-user-"))
    try:
        shared.chmod(0o755)
        (shared / "echoapp.py").write_text(APPS["echoapp.py"])
        m = master("echoapp:Echo", "--interface", "stream", "-w", "2", "--user", "nobody",
                   chdir=shared)
    finally:
        shutil.rmtree(shared)              # imported already (or failed): not needed
    for pid in children(m.proc.pid):
        st = _status(pid)
        assert st["Uid"].split() == [str(nobody.pw_uid)] * 4
        assert st["Gid"].split() == [str(nobody.pw_gid)] * 4
        assert int(st["CapPrm"], 16) == int(st["CapEff"], 16) == 0
        assert int(st["CapBnd"], 16) == 0 and int(st["CapAmb"], 16) == 0
        assert st["NoNewPrivs"] == "1"
    assert _status(m.proc.pid)["Uid"].split()[0] == "0"          # the master keeps its own
    assert echo(m, b"as nobody") == b"as nobody"
    workers = children(m.proc.pid)
    m.proc.kill()                     # PR_SET_PDEATHSIG was set again after the switch
    m.proc.wait(timeout=10)
    wait_for(lambda: all(gone(p) for p in workers), 5, "workers to follow the master")


@pytest.mark.parametrize("args,message", [
    (("--user", "no-such-user-here"), "bad setting: user = 'no-such-user-here': no such user"),
    (("--group", "no-such-group-here"),
     "bad setting: group = 'no-such-group-here': no such group"),
])
def test_unknown_user_or_group_is_a_bad_setting(master, args, message):
    m = master("echoapp:Echo", "--interface", "stream", *args, ready=None)
    assert m.proc.wait(timeout=30) == 2
    assert message in m.text()


ACTIVATE = shutil.which("systemd-socket-activate")


@pytest.mark.skipif(ACTIVATE is None, reason="systemd-socket-activate not installed")
def test_systemd_activated_socket_is_served(tmp_path):
    """Under systemd-socket-activate: the master takes the passed listener
    (LISTEN_FDS) instead of binding the default address, and the connection
    that triggered the start, queued meanwhile, is served."""
    (tmp_path / "echoapp.py").write_text(APPS["echoapp.py"])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "activated.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([ACTIVATE, "-l", f"127.0.0.1:{port}", sys.executable, "-m",
                                 "sockherd.master", "run", "echoapp:Echo", "--interface",
                                 "stream", "-w", "2", "--chdir", str(tmp_path),
                                 # its own control endpoint: a master on the default
                                 # one refuses to start beside another
                                 "--runtime-dir", str(tmp_path / "run")],
                                stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        text = lambda: log.read_text(errors="replace")        # noqa: E731
        wait_for(lambda: "Listening on" in text() or "listening" in text(), 10, "activator up")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:   # starts it
            c.sendall(b"first")
            assert c.recv(100) == b"first"
        wait_for(lambda: len(re.findall(r"worker \d+\.\d+: ready", text())) >= 2, 30, "ready")
        assert re.search(rf"listening on 127\.0\.0\.1:{port} \(from systemd\)", text())
        assert "127.0.0.1:8000" not in text()                 # the default was not bound
        for pid in children(proc.pid):                       # not leaked to workers
            assert b"LISTEN_FDS" not in Path(f"/proc/{pid}/environ").read_bytes()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        reap(proc)


def test_kept_alive_connections_spread_over_workers_and_threads(master):
    """Connections opened one at a time (a light load) and kept open: they
    spread over both workers and all their threads instead of all landing on
    the first registered poller (EPOLLEXCLUSIVE wakes the first idle one)."""
    m = master("pidapp:Pid", "--interface", "stream", "-w", "2", "--threads", "2")
    held, per_worker, per_thread = [], {}, {}
    try:
        for _ in range(40):
            c = m.connect()
            held.append(c)
            c.sendall(b"?")
            who = c.recv(100)
            pid = who.split(b"/")[0]
            per_worker[pid] = per_worker.get(pid, 0) + 1
            per_thread[who] = per_thread.get(who, 0) + 1
    finally:
        for c in held:
            c.close()
    assert len(per_worker) == 2 and min(per_worker.values()) >= 10, per_worker
    # Round-robin over the IDLE pollers only: on a loaded box a thread not yet
    # back in epoll_wait misses its turn (CI once saw 15/3/12/10), so each
    # thread is asked for a share, not an equal one. Without the requeue all
    # land on the first registered poller: one or two threads, which fails.
    assert len(per_thread) == 4 and min(per_thread.values()) >= 2, per_thread


def test_wsgi_is_the_default_interface(master):
    """`sockherd run module:app` serves a PEP 3333 app over HTTP/1.1 with
    keep-alive, on both workers."""
    import http.client

    m = master("wsgiapp:app", "-w", "2")
    pids = set()
    for _ in range(10):
        conn = http.client.HTTPConnection("127.0.0.1", m.port, timeout=10)
        for path in ("/a", "/b"):
            conn.request("GET", path)
            r = conn.getresponse()
            body = r.read().decode()
            assert r.status == 200 and body.startswith(f"GET {path} from ")
            pids.add(int(body.rsplit(" ", 1)[1]))
        conn.close()
    assert pids == set(children(m.proc.pid))            # spread over both workers
    m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(timeout=30) == 0


def test_term_to_the_whole_process_group_still_drains(tmp_path):
    """systemd's default KillMode=control-group and timeout(1) send TERM to
    every process at once: the workers drain like the master asks them to,
    so the request in flight completes and the master exits 0."""
    (tmp_path / "slowapp.py").write_text(APPS["slowapp.py"])
    log = tmp_path / "group.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sockherd.master", "run", "slowapp:Slow",
                                 "--interface", "stream", "-w", "2", "--idle-grace", "0.3",
                                 "--chdir", str(tmp_path), "-b", "127.0.0.1:0",
                                 "--runtime-dir", str(tmp_path / "run")],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    m = Master(proc, log)
    kids: list[int] = []
    try:
        m.port = int(m.wait_log(r"listening on 127\.0\.0\.1:(\d+)")[0])
        m.wait_log(r"worker \d+\.\d+: ready", count=2)
        kids = children(proc.pid)
        c = m.connect()
        c.sendall(b"slow request")
        assert c.recv(8) == b"started;"
        os.killpg(proc.pid, signal.SIGTERM)               # master and workers at once
        assert c.recv(100) == b"done:slow request"        # not cut
        c.close()
        assert proc.wait(timeout=30) == 0
        assert "(crashed)" not in m.text() and "respawn" not in m.text()
    finally:
        reap(proc, kids)


def test_a_burst_of_connections_is_shared_between_workers(master):
    """50 connections opened at once (wrk's start, a pool's warm-up): the
    worker that wakes first no longer takes them all (it took 50 of 50)."""
    m = master("pidapp:Pid", "--interface", "stream", "-w", "2")
    for _ in range(3):
        socks = []
        for _ in range(50):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", m.port))
            except BlockingIOError:
                pass
            socks.append(s)
        per: dict[bytes, int] = {}
        try:
            for s in socks:
                s.setblocking(True)
                s.settimeout(10)
                s.sendall(b"?")
                pid = s.recv(100).split(b"/")[0]
                per[pid] = per.get(pid, 0) + 1
        finally:
            for s in socks:
                s.close()
        assert len(per) == 2 and min(per.values()) >= 15, per
        # the next burst once both workers have seen their closes (their
        # counts are what the balance goes by)
        wait_for(lambda: not any(_has_tcp_peer(w) for w in children(m.proc.pid)), 10,
                 "the closes processed")


def test_a_worker_ahead_still_takes_connections_nobody_else_takes(master):
    """The balance never strands a connection: with the other worker busy
    (its one thread in a slow handler, not polling), the worker ahead of it,
    which stopped polling, notices the accept queue filling (TCP_INFO) and
    serves every connection."""
    m = master("pidapp:Pid", "--interface", "stream", "-w", "2")
    held, by_pid = [], {}
    try:
        while len(by_pid) < 2:                     # a connection on each worker
            c = m.connect()
            held.append(c)
            c.sendall(b"?")
            by_pid.setdefault(c.recv(100).split(b"/")[0], c)
            assert len(held) < 50
        busy = next(iter(by_pid.values()))
        busy.sendall(b"sleep")                     # that worker is busy for 4 s
        t_busy = time.monotonic()
        for _ in range(12):
            t0 = time.monotonic()
            c = m.connect()
            held.append(c)
            c.sendall(b"?")
            assert c.recv(100), "not served"
            waited = time.monotonic() - t0
            assert waited < 1.0, f"a connection waited {waited:.2f}s (the other worker is busy)"
        assert time.monotonic() - t_busy < 4.0, "the test outlived the busy handler"
    finally:
        for c in held:
            c.close()


def http_get(port: int, target: str = "/", headers: str = "", timeout: float = 20) -> bytes:
    """One HTTP/1.1 GET on a new connection (Connection: close), its whole
    answer (headers: more header lines, each ending in CRLF)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as c:
        c.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n"
                  .encode())
        data = b""
        while chunk := c.recv(65536):
            data += chunk
    return data
