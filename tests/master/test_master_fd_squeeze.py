"""Issue 19, finding 3: fd exhaustion aborted the master. With its fd table
full (here: clients of the metrics listener holding connections), the next
`sockherd ctl status` made libzmq's ipc listener assert on EMFILE (exit
134, every worker gone with it), and a killed worker could not be
respawned (`[Errno 24]` at each back-off step, then the slot given up for
good). On a real master started with a low RLIMIT_NOFILE (soft = hard, so
raising the soft limit gives nothing): during the squeeze `ctl status`
answers, a killed worker is respawned, nothing aborts; after it everything
serves as before. Every wait polls with a deadline."""
from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from sockherd.ipc.frames import FD_BATCH
from test_control import ctl, ok_json
from test_metrics import request, write_app
from test_metrics_listener_bounded import CLIENT, _ready
from test_reload import free_port
from test_run import children, gone, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

NOFILE = 80               # the master's whole fd table, soft = hard (its metrics heads alone fill it)
FLOOD_NOFILE = 4096      # the control flood's: a realistic table (its floor 256)
BURST = 32
SQUEEZE = 8.0             # seconds the clients keep the table full


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Squeeze:
    """Connections to the metrics listener, each a dripping request (a
    header line now and then): every one the master accepts holds one of
    its fds, and one it cuts (its request deadline) is opened again."""

    def __init__(self, port: int, n: int):
        self.port, self.n = port, n
        self.socks: list[socket.socket] = []
        self.dripped: set[socket.socket] = set()
        self.rounds = 0

    def _one(self) -> socket.socket:
        s = socket.socket()
        s.bind(CLIENT)
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", self.port))
        return s

    def keep_up(self) -> None:
        """Reopens the cut ones, drips a line on the others (one call in 10)."""
        self.rounds += 1
        drip = self.rounds % 10 == 0
        live = []
        for s in self.socks:
            try:
                if s.recv(4096, socket.MSG_DONTWAIT) == b"":
                    s.close()
                    continue
            except BlockingIOError:
                pass
            except OSError:
                s.close()
                continue
            try:
                if s not in self.dripped:
                    s.send(b"GET /metrics HTTP/1.1\r\n")
                    self.dripped.add(s)
                elif drip:
                    s.send(b"X-Drip: 1\r\n")
            except OSError:
                pass
            live.append(s)
        self.dripped &= set(live)
        self.socks = live + [self._one() for _ in range(self.n - len(live))]

    def close(self) -> None:
        for s in self.socks:
            s.close()
        self.socks = []


def test_ctl_answers_and_a_killed_worker_is_respawned_with_the_fd_table_full(master, tmp_path):
    write_app(tmp_path, "v1")
    mport = free_port()
    m = master("metricsapp:app", "-w", "2", "--metrics", f"127.0.0.1:{mport}", nofile=NOFILE)
    m.wait_log(rf"metrics on http://127\.0\.0\.1:{mport}/metrics")
    pid = m.proc.pid
    wait_for(lambda: _ready(mport)[0] == 200, 10, "/-/ready to answer 200")
    squeeze = Squeeze(mport, 2 * NOFILE)       # more than the table can hold
    try:
        peak = 0
        end = time.monotonic() + 2.0           # the table fills
        while time.monotonic() < end:
            squeeze.keep_up()
            peak = max(peak, _open_fds(pid))
            time.sleep(0.05)
        assert peak >= NOFILE // 2, f"the squeeze did not fill the table ({peak} fds)"

        # ctl answers (before the fix: libzmq's assert, exit 134)
        done = ctl(tmp_path, "status", timeout=30)
        assert m.proc.poll() is None, f"the master died: {m.proc.returncode}\n{m.text()}"
        assert done.returncode == 0, (done.stdout, done.stderr, m.text())

        # a killed worker is respawned while the squeeze goes on
        victim = children(pid)[0]
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: gone(victim), 10, "the killed worker to go")

        def respawned() -> bool:
            squeeze.keep_up()
            return m.text().count(": ready, pid") >= 3 and len(children(pid)) == 2
        wait_for(respawned, SQUEEZE, lambda: f"the respawn\n{m.text()}")
        took = time.monotonic() - killed_at
        end = killed_at + SQUEEZE
        while time.monotonic() < end:
            squeeze.keep_up()
            assert m.proc.poll() is None, f"the master died: {m.proc.returncode}\n{m.text()}"
            time.sleep(0.05)
        print(f"respawn under the squeeze took {took:.2f}s; peak {peak} fds of {NOFILE}")
    finally:
        squeeze.close()

    # after the squeeze, everything serves as before
    assert m.proc.poll() is None, m.text()
    st = ok_json(tmp_path, "status")
    assert st["roles"] == {"serving": 2}, st
    wait_for(lambda: _ready(mport)[0] == 200, 15, "/-/ready to answer 200")
    assert request(m.port, "/")[0] == 200
    assert "gave up" not in m.text()
    assert "Too many open files (src/" not in m.text()


def test_a_spawn_the_masters_own_fds_fail_is_retried_never_given_up(master, tmp_path):
    """The slot's respawn meets a real EMFILE in the master (its soft limit
    lowered from outside to 5: no fd number is free below it, and the
    spare fds it lets go are two numbers, not the four a spawn takes):
    before the fix each try counted against the slot (`[Errno 24]` at
    0.5/1/2/4 s, then `gave up after 5 failures`, the slot gone after the
    shortage too); now it is retried, said once, and the worker is back
    within a retry of the limit coming back."""
    import resource

    m = master("echoapp:Echo", "--interface", "stream", "-w", "2")
    pid = m.proc.pid
    _, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    victim = children(pid)[0]
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (5, hard))
    try:
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: gone(victim), 10, "the killed worker to go")
        m.wait_log(r"worker 1\.\d: cannot start")
        # past the old give-up (0.5 + 1 + 2 + 4 s of back-off)
        end = time.monotonic() + 9
        while time.monotonic() < end:
            assert "gave up" not in m.text() and m.proc.poll() is None, m.text()
            time.sleep(0.1)
        assert len(children(pid)) == 1
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (hard, hard))
    back_at = time.monotonic()
    m.wait_log(r"worker \d+\.\d+: ready", count=3, timeout=15)
    took = time.monotonic() - back_at
    print(f"respawned {took:.2f}s after the shortage ended")
    assert len(children(pid)) == 2
    assert m.text().count("the master is short of resources") == 1, m.text()
    assert "gave up" not in m.text()
    with m.connect() as s:
        s.sendall(b"ping")
        assert s.recv(16) == b"ping"


def test_a_flood_of_control_connections_never_aborts_the_master(master, tmp_path):
    """Connections to the control socket are accepted by libzmq itself,
    whose ipc listener aborts on EMFILE: bare connections to a master with
    4096 fds took it down (exit 134) once they were as many. Now its
    control endpoint is unbound while too few fds are free (a 16th of the
    table), which drops those connections, and is bound again after: the
    master lives, and `ctl status` answers once the flood is over. The
    flood comes in bursts of BURST, each seen by the master before the
    next: what libzmq accepts between two looks of the guard must fit in
    its floor, and a flood faster than a starved master loop can look
    (seen once with three test suites and CPU hogs on two cores) is the
    race control_guard.py describes, not what this test pins down."""
    m = master("echoapp:Echo", "--interface", "stream", "-w", "2", nofile=FLOOD_NOFILE)
    pid = m.proc.pid
    path = str(tmp_path / "run" / "control")
    base = _open_fds(pid)
    flood, refused = [], False
    try:
        while not refused and len(flood) < 2 * FLOOD_NOFILE:
            burst = []
            for _ in range(BURST):
                s = socket.socket(socket.AF_UNIX)
                try:
                    s.connect(path)
                except OSError:             # unbound: refused, or the file gone
                    s.close()
                    refused = True
                    break
                burst.append(s)
            flood += burst
            before = base + len(flood)
            # the master took the burst in (its fds), or dropped them all (unbound)
            wait_for(lambda: m.proc.poll() is not None or _open_fds(pid) >= before
                     or "not accepting control clients" in m.text(), 10,
                     "the master to take the burst")
            assert m.proc.poll() is None, f"the master died: {m.proc.returncode}\n{m.text()}"
            refused = refused or "not accepting control clients" in m.text()
        assert refused, "the flood was never refused"
        assert m.proc.poll() is None, f"the master died: {m.proc.returncode}\n{m.text()}"
    finally:
        for s in flood:
            s.close()
    m.wait_log(r"control: accepting control clients again", timeout=15)
    st = ok_json(tmp_path, "status")
    assert st["roles"] == {"serving": 2}, st
    assert m.proc.poll() is None


def test_the_soft_limit_is_raised_for_the_master_alone(master, tmp_path):
    """The master raises its soft RLIMIT_NOFILE to the hard limit (and says
    so); its workers keep the soft limit it was started with (their fd
    tables are sized by it)."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 256:
        pytest.skip(f"the hard limit ({hard}) leaves nothing to raise")
    m = master("echoapp:Echo", "--interface", "stream", "-w", "2", nofile=(256, hard))
    m.wait_log(rf"INFO fds: soft limit raised from 256 to {hard}")
    assert resource.prlimit(m.proc.pid, resource.RLIMIT_NOFILE) == (hard, hard)
    for worker in children(m.proc.pid):
        assert resource.prlimit(worker, resource.RLIMIT_NOFILE) == (256, hard)


SPAWN_WITH_A_FULL_TABLE = r"""
import os, resource, sys
from sockherd.master.fdbudget import BUDGET
from sockherd.master.spawn import Shortage, spawn

resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
if sys.argv[1] == "spares":
    BUDGET.hold_spare()
filler = []
while True:                              # every number below the limit taken
    try:
        filler.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        break
try:
    w = spawn(1, 0, {}, "", [], send_timeout=5)
except Shortage as exc:
    print("shortage", exc.errno)
else:
    print("spawned")
    w.popen.kill()
    w.popen.wait()
"""


@pytest.mark.parametrize("spares, expect", [("spares", "spawned"), ("none", "shortage 24")])
def test_a_spawn_with_the_table_full_uses_the_spare_fds_else_says_shortage(spares, expect):
    """A spawn that meets EMFILE lets the master's spare fds go and tries
    once more (the worker starts); without them it raises Shortage, the
    master's own want, never counted as the worker's failure."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", SPAWN_WITH_A_FULL_TABLE, spares],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == expect, (done.stdout, done.stderr)


HANDOFF_NOFILE = 1024
HANDOFF_SESSIONS = 1200        # more than the table: the first ones pass fds
HANDOFF_FD_SESSIONS = 3        # ... FD_BATCH each, the others none


def _session_holding_fds(path: str, dup_of: int, n: int) -> socket.socket | None:
    """A hand-off session (one fd of the master's while it lasts) that,
    given n, sends the header of a message announcing n fds (one fd, n
    times) and never its payload: a server that reads it holds those fds
    until the session expires. None once the master takes no more (its
    backlog full)."""
    import array

    from sockherd.ipc.frames import HEADER, KIND_MSG, MAGIC, VERSION

    s = socket.socket(socket.AF_UNIX)
    s.setblocking(False)
    deadline = time.monotonic() + 0.5
    try:
        while True:                    # a full backlog: EAGAIN at once (AF_UNIX)
            try:
                s.connect(path)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        s.setblocking(True)
        if n:
            s.sendmsg([HEADER.pack(MAGIC, VERSION, KIND_MSG, n, 100)],
                      [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [dup_of] * n))])
    except OSError:
        s.close()
        return None
    return s


def test_handoff_sessions_passing_fds_leave_ctl_and_ready_answering(master, tmp_path):
    """Hand-off sessions, some passing fds by SCM_RIGHTS (a session is one
    fd, a read brings what it sent, up to 252), filled a 1024-fd table to
    its last fd (accepted until EMFILE), and the next `ctl status` aborted
    the master. Now the hand-off socket is neither accepted on nor read below
    its floor (a batch above the metrics listener's): ctl and /-/ready
    answer while the sessions hold what they brought."""
    write_app(tmp_path, "v1")
    mport = free_port()
    handoff = str(tmp_path / "handoff.sock")
    m = master("metricsapp:app", "-w", "2", "--metrics", f"127.0.0.1:{mport}",
               "--handoff-socket", handoff, nofile=HANDOFF_NOFILE)
    m.wait_log(rf"metrics on http://127\.0\.0\.1:{mport}/metrics")
    devnull = os.open(os.devnull, os.O_RDONLY)
    sessions = []
    try:
        for i in range(HANDOFF_SESSIONS):
            session = _session_holding_fds(handoff, devnull,
                                           FD_BATCH if i < HANDOFF_FD_SESSIONS else 0)
            if session is None:
                break
            sessions.append(session)
        peak = 0
        end = time.monotonic() + 2.0            # what the master reads, it reads by then
        while time.monotonic() < end and m.proc.poll() is None:
            peak = max(peak, _open_fds(m.proc.pid))
            time.sleep(0.05)
        done = ctl(tmp_path, "status", timeout=30)
        assert m.proc.poll() is None, f"the master died: {m.proc.returncode}\n{m.text()}"
        assert done.returncode == 0, (done.stdout, done.stderr, m.text())
        status, took = _ready(mport)
        assert status == 200 and took < 1.0, (status, took)
        print(f"peak {peak} fds of {HANDOFF_NOFILE}; /-/ready in {took * 1000:.0f} ms")
    finally:
        for s in sessions:
            s.close()
        os.close(devnull)
    assert ok_json(tmp_path, "status")["roles"] == {"serving": 2}
