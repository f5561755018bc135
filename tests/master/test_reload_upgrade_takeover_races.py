"""Review of reload (HUP), upgrade (USR2), takeover and per-worker
replacement with real masters: signals at awkward moments, listener
reconciliation, fds across the operations. Each finding was a strict
xfail test first (its reason names the code as it was at 9c98584); eleven
are fixed and their tests guard them now, two are still xfail (open).
The cases checked and found right are plain guard tests. Every process is reaped by the `master` fixture; every
wait polls with a deadline."""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from test_run import children, gone, listener_inode, master, wait_for  # noqa: F401 (fixture)
from test_reload import Clients, free_port, get, open_fds, refused, write_app

pytestmark = pytest.mark.timeout(150)

# an app whose import takes 2 s while the file `slow` exists in its directory:
# the workers started then stay STARTING long enough for a signal to land
SLOW = "import time\nif os.path.exists(os.path.join(os.path.dirname(__file__), 'slow')): " \
       "time.sleep(2.0)"


def write_slow_app(path: Path, version: str) -> None:
    write_app(path, version, SLOW)


def alive(m) -> bool:
    return m.proc.poll() is None


def batch(m, *signals: int) -> None:
    """Delivers `signals` to the master in ONE wake-up of its loop: the
    master is stopped, the signals are queued (pending), then it is
    continued, and its C handler writes every one to the wake-up fd before
    the Python loop reads them (the handler frames stack: the highest
    signal number's handler runs first)."""
    m.proc.send_signal(signal.SIGSTOP)
    wait_for(lambda: _state(m.proc.pid) == "T", 10, "the master stopped")
    for s in signals:
        # to the main thread (tgkill): a process-directed signal may land on
        # another thread of the master (ZeroMQ's) and be handled out of order
        assert _libc.tgkill(m.proc.pid, m.proc.pid, int(s)) == 0
    m.proc.send_signal(signal.SIGCONT)


_libc = ctypes.CDLL(None, use_errno=True)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def stop_and_wait(m, timeout: float = 30) -> int:
    m.proc.send_signal(signal.SIGTERM)
    return m.proc.wait(timeout=timeout)


# ---- USR2 while a worker is still STARTING ---------------------------------------------------

def test_usr2_while_a_ttin_worker_is_starting_keeps_the_master(master, tmp_path):
    write_slow_app(tmp_path, "v1")
    m = master("verapp:app", "-w", "1", ready=1)
    (tmp_path / "slow").write_text("")
    m.proc.send_signal(signal.SIGTTIN)
    m.wait_log(r"worker 1\.1: spawned")
    m.proc.send_signal(signal.SIGUSR2)
    # refused while a worker starts (its READY would reach an image that
    # adopted it as serving): the master serves on, and a later USR2 works
    m.wait_log(r"upgrade refused: 1 worker\(s\) still starting")
    m.wait_log(r"worker 1\.1: ready", timeout=30)
    m.proc.send_signal(signal.SIGUSR2)
    m.wait_log(r"reload: generation 2 serving", timeout=30)
    time.sleep(0.5)
    assert alive(m), m.text()[-3000:]
    assert "Traceback" not in m.text()
    serves(m.port, "v1")


def test_usr2_during_the_first_start_keeps_the_master(master, tmp_path):
    write_slow_app(tmp_path, "v1")
    (tmp_path / "slow").write_text("")
    m = master("verapp:app", "-w", "1", ready=None)
    m.wait_log(r"worker 1\.0: spawned")
    m.port = int(m.wait_log(r"listening on 127\.0\.0\.1:(\d+)")[0])
    m.proc.send_signal(signal.SIGUSR2)
    # refused (as a HUP is before the first READY), or carried through: either
    # way the master must still serve afterwards
    wait_for(lambda: not alive(m) or "generation 2 serving" in m.text()
             or "upgrade refused" in m.text(), 30, lambda: m.text())
    time.sleep(3.0)
    assert alive(m), m.text()[-3000:]
    assert "Traceback" not in m.text()
    (tmp_path / "slow").unlink()
    get(m.port)


# ---- signals in one batch with USR2 ----------------------------------------------------------

def test_term_during_the_upgrades_preparation_is_not_lost(master, tmp_path):
    write_app(tmp_path, "v1")
    config = tmp_path / "sockherd.toml"
    config.write_text("")
    m = master("verapp:app", "-w", "1", "-c", str(config), ready=1)
    # the settings file becomes a FIFO: USR2's reload_settings() blocks on it
    # until we write, so the TERM below lands exactly in that window
    config.unlink()
    os.mkfifo(config)
    m.proc.send_signal(signal.SIGUSR2)
    wait_for(lambda: _wchan(m.proc.pid) == "wait_for_partner", 10, "the master opening the FIFO")
    m.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)                        # its C handler has run (the byte is written)
    with open(config, "w"):                # the master waits for a writer: no block
        config.unlink()
        config.write_text("")              # the new image reads a plain file again
    m.wait_log(r"upgrade: re-executing")
    try:
        code = m.proc.wait(timeout=30)
    except Exception:
        pytest.fail("the master did not stop after the TERM:\n" + m.text()[-3000:])
    assert code == 0


def _wchan(pid: int) -> str:
    """The main thread's wait channel ("" once the process is gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/wchan") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def serves(port: int, version: str, timeout: float = 20) -> None:
    """answers(), with a short timeout per request and retries: a request
    stranded at a commit (test_a_connection_at_the_commit_is_answered) is
    rescued by the next arrival, and the guards must not fail on that one."""
    def attempt():
        try:
            return _get(port, 2).startswith(version + " ")
        except (TimeoutError, ConnectionError):
            return False
    wait_for(attempt, timeout, f"{version} answers")


def _get(port: int, timeout: float) -> str:
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        return get(port, c)
    finally:
        c.close()


def test_int_right_after_usr2_stops_the_master(master, tmp_path):
    """Guard: INT sent while the new image starts (blocked across the
    exec) is delivered to it and stops it."""
    write_app(tmp_path, "v1")
    m = master("verapp:app", "-w", "2")
    kids = set(children(m.proc.pid))
    m.proc.send_signal(signal.SIGUSR2)
    m.wait_log(r"upgrade: re-executing")
    m.proc.send_signal(signal.SIGINT)
    m.proc.wait(timeout=30)
    wait_for(lambda: all(gone(p) for p in kids), 30, "the workers' end")


# ---- upgrade whose re-exec state the new image refuses -----------------------------------------

def _refusing_python(tmp_path: Path) -> Path:
    """An interpreter wrapper that spoils the state's version, as a newer
    sockherd with another STATE_VERSION would refuse it."""
    wrapper = tmp_path / "newpython"
    wrapper.write_text(
        "#!/bin/sh\n"
        "SOCKHERD_REEXEC_STATE=$(printf '%s' \"$SOCKHERD_REEXEC_STATE\" | "
        "sed 's/\"version\":1,/\"version\":99,/')\n"
        "export SOCKHERD_REEXEC_STATE\n"
        f"exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


def test_a_refused_reexec_state_does_not_take_the_service_down(master, tmp_path):
    write_app(tmp_path, "v1")
    config = tmp_path / "sockherd.toml"
    config.write_text("")
    port = free_port()
    m = master("verapp:app", "-w", "1", "-c", str(config), bind=f"127.0.0.1:{port}", ready=1)
    m.port = port
    fds_before, inode = open_fds(m.proc.pid), listener_inode(port)
    config.write_text(f'python = "{_refusing_python(tmp_path)}"\n')
    clients = Clients(port, fresh=1, kept=1)
    try:
        wait_for(lambda: clients.ok > 10, 10, "traffic")
        m.proc.send_signal(signal.SIGUSR2)
        m.wait_log(r"the previous image's state is refused .*: starting fresh on the 1 "
                   r"listening socket\(s\) it left")
        wait_for(lambda: not alive(m) or len(m.wait_log(r"ready, pid")) >= 2, 30,
                 lambda: m.text())
        assert alive(m), m.text()[-3000:]
        # the old worker drains on its own (its socketpair closed) and is reaped
        wait_for(lambda: len(children(m.proc.pid)) == 1, 30, "the old worker's exit")
        before = clients.ok
        wait_for(lambda: clients.ok > before + 10, 10, "traffic after the upgrade")
    finally:
        clients.stop()
    assert clients.failures == [], clients.failures[:5]
    assert listener_inode(port) == inode, "the address was bound again"
    assert open_fds(m.proc.pid) == fds_before, "fds of the old image left open"


def test_an_upgrade_to_a_sockherd_that_refuses_the_state_is_refused_before_the_exec(
        master, tmp_path):
    """The preflight hands the state to the new interpreter (stdin): one
    that would refuse it is never exec'd into, this image serves on."""
    write_app(tmp_path, "v1")
    config = tmp_path / "sockherd.toml"
    config.write_text("")
    m = master("verapp:app", "-w", "1", "-c", str(config), ready=1)
    wrapper = tmp_path / "newerpython"
    wrapper.write_text(
        "#!/bin/sh\n"
        "if [ \"$2\" = sockherd.master.upgrade ]; then\n"
        "  sed 's/\"version\":1,/\"version\":99,/' | exec " + sys.executable + " \"$@\"\n"
        "  exit\n"
        "fi\n"
        f"exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    config.write_text(f'python = "{wrapper}"\n')
    clients = Clients(m.port, fresh=1, kept=1)
    try:
        wait_for(lambda: clients.ok > 10, 10, "traffic")
        m.proc.send_signal(signal.SIGUSR2)
        m.wait_log(r"upgrade failed: \S+newerpython refuses this master's re-exec state: "
                   r".*state version 99, expected 1; this master carries on")
        before = clients.ok
        wait_for(lambda: clients.ok > before + 10, 10, "traffic after the refusal")
    finally:
        clients.stop()
    assert clients.failures == [], clients.failures[:5]
    assert "re-executing" not in m.text()


def test_an_upgrade_to_a_python_without_sockherd_is_refused(master, tmp_path):
    write_app(tmp_path, "v1")
    config = tmp_path / "sockherd.toml"
    config.write_text("")
    m = master("verapp:app", "-w", "1", "-c", str(config), ready=1)
    broken = tmp_path / "brokenpython"
    broken.write_text("#!/bin/sh\necho 'No module named sockherd' >&2\nexit 1\n")
    broken.chmod(0o755)
    config.write_text(f'python = "{broken}"\n')
    m.proc.send_signal(signal.SIGUSR2)
    wait_for(lambda: not alive(m) or "upgrade failed" in m.text() or "upgrade refused"
             in m.text(), 20, lambda: m.text())
    assert alive(m), m.text()[-2000:]
    get(m.port)


# ---- unix socket listeners across upgrade / takeover ---------------------------------------------

def get_unix(path: str, timeout: float = 10) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), data
    return body.decode()


def test_unix_listener_file_kept_over_reloads_and_removed_at_stop(master, tmp_path):
    """Guard: the socket file is the same inode across reloads (also when
    written unix:///path), served, and removed by a plain master's TERM."""
    write_app(tmp_path, "v1")
    path = str(tmp_path / "app.sock")
    config = tmp_path / "sockherd.toml"
    config.write_text(f'bind = ["unix:{path}"]\n')
    m = master("verapp:app", "-w", "1", "-c", str(config), bind=None, ready=1)
    inode = os.stat(path).st_ino
    assert get_unix(path).startswith("v1 ")
    config.write_text(f'bind = ["unix://{path}"]\n')
    write_app(tmp_path, "v2")
    m.proc.send_signal(signal.SIGHUP)
    m.wait_log(r"reload: generation 2 serving")
    def v2():
        try:
            return get_unix(path, 2).startswith("v2 ")
        except TimeoutError:                 # stranded at the commit: retried
            return False
    wait_for(v2, 20, "v2 answers")
    assert os.stat(path).st_ino == inode
    assert stop_and_wait(m) == 0
    assert not os.path.exists(path)


@pytest.mark.parametrize("how", ["upgrade", "takeover"])
def test_unix_listener_file_removed_at_stop_after_upgrade_or_takeover(master, tmp_path, how):
    write_app(tmp_path, "v1")
    path = str(tmp_path / "app.sock")
    handoff = str(tmp_path / "handoff.sock")
    m = master("verapp:app", "-w", "1", "--handoff-socket", handoff, bind=f"unix:{path}",
               ready=1)
    if how == "upgrade":
        m.proc.send_signal(signal.SIGUSR2)
        m.wait_log(r"reload: generation 2 serving")
        last = m
    else:
        last = master("verapp:app", "-w", "1", "--takeover", handoff, bind=f"unix:{path}",
                      ready=1)
        assert m.proc.wait(timeout=30) == 0
    assert get_unix(path).startswith("v1 ")
    assert stop_and_wait(last) == 0
    assert not os.path.exists(path)


# ---- listener address reconciliation -----------------------------------------------------------

@pytest.mark.parametrize("first, second", [
    (":{port}", "0.0.0.0:{port}"),
    ("127.0.0.1:{port}", "127.0.0.1:{port}"),
    # was a finding: matched by the configured text only, the same socket
    # was re-bound (EADDRINUSE) and every reload refused
    ("localhost:{port}", "127.0.0.1:{port}"),
])
def test_same_address_written_differently_keeps_the_socket(master, tmp_path, first, second):
    """Spellings of one address keep the very socket across a reload."""
    write_app(tmp_path, "v1")
    port = free_port()
    config = tmp_path / "sockherd.toml"
    config.write_text(f'bind = ["{first.format(port=port)}"]\n')
    m = master("verapp:app", "-w", "1", "-c", str(config), bind=None, ready=1)
    inode = listener_inode(port)
    config.write_text(f'bind = ["{second.format(port=port)}"]\n')
    write_app(tmp_path, "v2")
    m.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "generation 2 serving" in m.text() or "reload refused" in m.text(), 30,
             lambda: m.text())
    assert "reload refused" not in m.text(), m.text()[-1500:]
    serves(port, "v2")
    assert listener_inode(port) == inode


# ---- max_requests / max_worker_lifetime replacement against other operations ---------------------

def _spawned_pid(m, gen_idx: str) -> int:
    return int(m.wait_log(rf"worker {gen_idx}: spawned, pid (\d+)")[-1])


def _kept_on(port: int, pid: int):
    """A keep-alive connection served by worker `pid` (connections spread
    over the workers: a few tries)."""
    import http.client

    def attempt():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        if get(port, c).split()[1] == str(pid):
            return c
        c.close()
        return None
    return wait_for(attempt, 20, f"a connection on worker {pid}")


def _reach_max_requests(m, conn=None) -> None:
    """Requests until the worker reached max_requests and the master said
    it is starting the replacement (or 30 requests, whichever first)."""
    for _ in range(30):
        get(m.port, conn)
        if "starting its replacement" in m.text():
            return


def _replacement_pid(m) -> int:
    """The pid of worker 1.0's replacement (its second `spawned` line)."""
    _reach_max_requests(m)
    return int(m.wait_log(r"worker 1\.0: spawned, pid (\d+)", count=2)[1])


def test_ttou_during_a_max_requests_replacement_is_not_undone(master, tmp_path):
    write_slow_app(tmp_path, "v1")
    m = master("verapp:app", "-w", "2", "--max-requests", "20")
    pid = _spawned_pid(m, r"1\.1")
    (tmp_path / "slow").write_text("")          # the replacement takes 2 s to start
    conn = _kept_on(m.port, pid)
    try:
        _reach_max_requests(m, conn)
    finally:
        conn.close()
    m.wait_log(r"worker 1\.1: max_requests \(\d+ requests\): starting its replacement")
    m.proc.send_signal(signal.SIGTTOU)
    m.wait_log(r"TTOU: 1 workers; draining worker slot 1")
    wait_for(lambda: pid not in children(m.proc.pid), 30, "the drained worker's exit")
    # the replacement either never serves or is drained in turn: one worker
    # (its exit awaited: a bare 3 s sleep lost the race to a slow start under load)
    replacement = int(m.wait_log(r"worker 1\.1: spawned, pid (\d+)", count=2)[1])
    m.wait_log(rf"worker 1\.1: exited with .*, pid {replacement}\b", timeout=60)
    assert len(children(m.proc.pid)) == 1, m.text()[-3000:]


def test_term_after_a_reload_that_overtook_a_replacement_waits_for_it(master, tmp_path):
    write_slow_app(tmp_path, "v1")
    m = master("verapp:app", "-w", "1", "--max-requests", "20", ready=1)
    (tmp_path / "slow").write_text("")
    replacement = 0
    try:
        replacement = _replacement_pid(m)
        wait_for(lambda: "nanosleep" in _wchan(replacement), 10, "the replacement's slow import")
        (tmp_path / "slow").unlink()          # generation 2 starts fast and commits first
        m.proc.send_signal(signal.SIGHUP)
        m.wait_log(r"reload: generation 2 serving")
        assert f"ready, pid {replacement}" not in m.text()
        # the worker it replaces drains and is reaped first (CI caught the
        # replacement lost from supervision in this order: it was found
        # only through that worker)
        m.wait_log(r"worker 1\.0: exited with status 0 \(drained\)")
        m.proc.send_signal(signal.SIGTERM)
        m.proc.wait(timeout=30)
        # the master said every worker is gone: the replacement must be among them
        assert f"pid {replacement}" in m.text().split("worker 1.0: replaced")[0].split(
            "graceful stop")[1], m.text()[-3000:]
    finally:
        if replacement:
            try:
                os.kill(replacement, signal.SIGKILL)
            except ProcessLookupError:
                pass


# ---- takeover -----------------------------------------------------------------------------------

def test_a_failed_takeover_leaves_the_old_instance_taking_over(master, tmp_path):
    write_app(tmp_path, "v1")
    handoff = str(tmp_path / "handoff.sock")
    first = master("verapp:app", "-w", "1", "--handoff-socket", handoff, ready=1)
    first.wait_log(r"hand-off socket .*: a new instance may take the listeners over")
    bad = master("badapp:nope", "-w", "1", "--handoff-socket", handoff, "--takeover", handoff,
                 ready=None)
    assert bad.proc.wait(timeout=30) == 1
    assert get(first.port).startswith("v1 ")
    write_app(tmp_path, "v2")
    second = master("verapp:app", "-w", "1", "--handoff-socket", handoff, "--takeover", handoff,
                    ready=None)
    wait_for(lambda: second.proc.poll() is not None or "takeover: serving" in second.text(),
             30, lambda: second.text())
    assert second.proc.poll() is None, second.text()[-2000:]
    assert first.proc.wait(timeout=30) == 0
    serves(first.port, "v2")


def test_old_instance_removes_its_unix_file_after_a_failed_takeover(master, tmp_path):
    write_app(tmp_path, "v1")
    path = str(tmp_path / "app.sock")
    handoff = str(tmp_path / "handoff.sock")
    first = master("verapp:app", "-w", "1", "--handoff-socket", handoff, bind=f"unix:{path}",
                   ready=1)
    bad = master("badapp:nope", "-w", "1", "--takeover", handoff, bind=f"unix:{path}",
                 ready=None)
    assert bad.proc.wait(timeout=30) == 1
    first.wait_log(r"hand-off: 1 listener\(s\) given")
    assert get_unix(path).startswith("v1 ")
    assert stop_and_wait(first) == 0
    assert not os.path.exists(path)


def test_chained_takeovers_without_a_failed_request(master, tmp_path):
    """Guard: A -> B -> C over the same hand-off path, under load: each
    predecessor exits 0, the socket stays the same, no request fails; the
    hand-off path is served by the last one."""
    write_app(tmp_path, "v1")
    handoff = str(tmp_path / "handoff.sock")
    a = master("verapp:app", "-w", "1", "--handoff-socket", handoff, ready=1)
    inode = listener_inode(a.port)
    clients = Clients(a.port, fresh=1, kept=1)
    try:
        prev = a
        for v in ("v2", "v3"):
            write_app(tmp_path, v)
            nxt = master("verapp:app", "-w", "1", "--handoff-socket", handoff,
                         "--takeover", handoff, ready=1)
            assert nxt.port == a.port
            nxt.wait_log(r"takeover: serving; told pid %d" % prev.proc.pid)
            assert prev.proc.wait(timeout=30) == 0
            wait_for(lambda: v in clients.versions[-5:], 10, f"{v} answers")
            prev = nxt
    finally:
        clients.stop()
    assert clients.failures == [], clients.failures[:5]
    assert listener_inode(a.port) == inode
    assert os.path.exists(handoff)
    assert stop_and_wait(prev) == 0
    assert not os.path.exists(handoff)


def test_stalled_handoff_sessions_expire_without_an_fd_leak(master, tmp_path):
    """Guard: a client that connects to the hand-off socket (and one that asks
    and never confirms) are dropped at their deadlines (2 s to the request,
    10 s to the confirmation); the master's fds come back to what they were,
    and a real takeover works after. (Two sessions at a time: issue 19,
    finding 4, test_handoff_socket_bounded.py.)"""
    from sockherd.ipc.channel import Channel
    from sockherd.ipc.messages import HandoffRequest

    write_app(tmp_path, "v1")
    handoff = str(tmp_path / "handoff.sock")
    a = master("verapp:app", "-w", "1", "--handoff-socket", handoff, ready=1)
    a.wait_log(r"hand-off socket")
    before = open_fds(a.proc.pid)
    asker = Channel.connect(handoff, 5)
    asker.send(HandoffRequest(os.getpid()), timeout=5)
    got = asker.recv(timeout=5)
    got.close_fds()
    silent = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(1)]
    for s in silent:
        s.connect(handoff)
    try:
        wait_for(lambda: len(open_fds(a.proc.pid)) == len(before) + 2, 5, "the sessions open")
        # every session ends at its deadline; the fds are the same again
        wait_for(lambda: open_fds(a.proc.pid) == before, 20,
                 lambda: f"{open_fds(a.proc.pid)} != {before}")
    finally:
        for s in silent:
            s.close()
        asker.close()
    assert get(a.port).startswith("v1 ")
    b = master("verapp:app", "-w", "1", "--takeover", handoff, ready=1)
    assert a.proc.wait(timeout=30) == 0
    assert b.port == a.port


# ---- reload: signals at awkward moments (guards unless marked) ----------------------------------

def test_term_during_a_pending_reload_exits_0_and_reaps_everything(master, tmp_path):
    write_app(tmp_path, "v1")
    m = master("verapp:app", "-w", "2")
    kids = set(children(m.proc.pid))
    write_slow_app(tmp_path, "v2")
    (tmp_path / "slow").write_text("")
    m.proc.send_signal(signal.SIGHUP)
    m.wait_log(r"worker 2\.1: spawned")
    kids |= set(children(m.proc.pid))
    assert len(kids) == 4
    m.proc.send_signal(signal.SIGTERM)
    m.wait_log(r"reload refused \(generation 2\): the master is stopping")
    assert m.proc.wait(timeout=30) == 0
    assert all(gone(p) for p in kids)
    assert "generation 2 serving" not in m.text()


def test_hup_right_after_a_refused_reload_works(master, tmp_path):
    """A HUP in the same wake-up as the exit that refuses a reload (its
    workers are still being killed): the next reload starts and serves."""
    write_app(tmp_path, "v1")
    m = master("verapp:app", "-w", "2")
    write_app(tmp_path, "v2", "import time; time.sleep(0.5); os._exit(7)")
    m.proc.send_signal(signal.SIGHUP)
    pids = [int(p) for p in m.wait_log(r"worker 2\.\d: spawned, pid (\d+)", count=2)]
    wait_for(lambda: all("nanosleep" in _wchan(p) or gone(p) for p in pids), 10,
             "v2 importing")
    write_app(tmp_path, "v3")
    m.wait_log(r"reload refused \(generation 2\)")
    m.proc.send_signal(signal.SIGHUP)
    m.wait_log(r"reload: generation 3 serving")      # a number of its own (issue 19 §10)
    serves(m.port, "v3")
    wait_for(lambda: len(children(m.proc.pid)) == 2, 30, "two workers left")


def test_refused_reload_keeps_a_listener_it_would_have_removed_and_closes_one_it_added(
        master, tmp_path):
    write_app(tmp_path, "v1")
    pa, pb, pc = free_port(), free_port(), free_port()
    config = tmp_path / "sockherd.toml"
    config.write_text(f'bind = ["127.0.0.1:{pa}", "127.0.0.1:{pb}"]\n')
    m = master("verapp:app", "-w", "1", "-c", str(config), bind=None, ready=1)
    inode_b = listener_inode(pb)
    # b dropped, c added, but the new app fails: b must serve on, c must go
    config.write_text(f'bind = ["127.0.0.1:{pa}", "127.0.0.1:{pc}"]\n')
    write_app(tmp_path, "v2", "raise RuntimeError('no')")
    m.proc.send_signal(signal.SIGHUP)
    m.wait_log(r"reload refused \(generation 2\)")
    assert get(pb).startswith("v1 ") and listener_inode(pb) == inode_b
    wait_for(lambda: refused(pc), 10, "the added listener closed again")
    # and c can be added by the next reload
    write_app(tmp_path, "v3")
    m.proc.send_signal(signal.SIGHUP)
    m.wait_log(r"reload: generation 3 serving")      # a number of its own (issue 19 §10)
    serves(pc, "v3")
    wait_for(lambda: refused(pb), 20, "the removed listener's close")


def test_usr2_while_a_reload_is_pending_is_refused_then_works(master, tmp_path):
    write_slow_app(tmp_path, "v1")
    m = master("verapp:app", "-w", "1", ready=1)
    (tmp_path / "slow").write_text("")
    write_slow_app(tmp_path, "v2")
    m.proc.send_signal(signal.SIGHUP)
    m.wait_log(r"reload: starting generation 2")
    m.proc.send_signal(signal.SIGUSR2)
    m.wait_log(r"upgrade refused: generation 2 is still starting")
    m.wait_log(r"reload: generation 2 serving")
    (tmp_path / "slow").unlink()
    write_app(tmp_path, "v3")
    m.proc.send_signal(signal.SIGUSR2)
    m.wait_log(r"reload: generation 3 serving")
    serves(m.port, "v3")
    wait_for(lambda: len(children(m.proc.pid)) == 1, 30, "one worker left")


def test_hup_ttin_ttou_in_one_wakeup_settles(master, tmp_path):
    """Guard: HUP, TTIN and TTOU read in one wake-up (the kernel runs the
    handlers of simultaneously pending signals highest number first, so
    TTOU, TTIN, then HUP): generation 2 serves, the old workers are gone,
    TERM exits 0."""
    write_app(tmp_path, "v1")
    m = master("verapp:app", "-w", "2")
    old = set(children(m.proc.pid))
    write_app(tmp_path, "v2")
    batch(m, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU)
    m.wait_log(r"reload: generation 2 serving")
    serves(m.port, "v2")
    wait_for(lambda: not old & set(children(m.proc.pid)), 30, "the old generation's exit")
    time.sleep(0.5)
    assert len(children(m.proc.pid)) in (1, 2, 3)
    assert alive(m)
    assert stop_and_wait(m) == 0


def test_term_during_a_max_requests_replacement_exits_0(master, tmp_path):
    write_slow_app(tmp_path, "v1")
    m = master("verapp:app", "-w", "1", "--max-requests", "20", ready=1)
    (tmp_path / "slow").write_text("")
    replacement = _replacement_pid(m)
    kids = set(children(m.proc.pid))
    m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(timeout=30) == 0
    assert all(gone(p) for p in kids | {replacement})
    m.wait_log(rf"exited with .* pid {replacement}")


def test_reload_while_a_replacement_starts_then_it_serves_last(master, tmp_path):
    """Guard: the replacement READY before the reload commits takes the
    slot, then the commit drains it with the rest of generation 1."""
    write_slow_app(tmp_path, "v1")
    m = master("verapp:app", "-w", "1", "--max-requests", "20", ready=1)
    (tmp_path / "slow").write_text("")
    replacement = _replacement_pid(m)
    write_slow_app(tmp_path, "v2")
    time.sleep(0.3)                        # generation 2 becomes ready a bit later
    m.proc.send_signal(signal.SIGHUP)
    m.wait_log(r"reload: generation 2 serving")
    wait_for(lambda: gone(replacement), 30, "the replacement drained")
    (tmp_path / "slow").unlink()
    serves(m.port, "v2")
    wait_for(lambda: len(children(m.proc.pid)) == 1, 30, "one worker left")
    assert stop_and_wait(m) == 0


def test_max_worker_lifetime_still_applies_after_an_upgrade_whose_reload_is_refused(
        master, tmp_path):
    write_app(tmp_path, "v1")
    blocker = socket.create_server(("127.0.0.1", 0))
    port = free_port()
    config = tmp_path / "sockherd.toml"
    config.write_text(f'bind = ["127.0.0.1:{port}"]\nmax_worker_lifetime = 4.0\n')
    try:
        m = master("verapp:app", "-w", "1", "-c", str(config), bind=None, ready=1)
        m.port = port
        config.write_text(f'bind = ["127.0.0.1:{port}", '
                          f'"127.0.0.1:{blocker.getsockname()[1]}"]\n'
                          f'max_worker_lifetime = 1.5\n')
        m.wait_log(r"max_worker_lifetime \(4s\): starting its replacement")
        m.wait_log(r"replaced by pid")
        m.proc.send_signal(signal.SIGUSR2)
        m.wait_log(r"reload refused \(generation 2\): bind")
        n = m.text().count("starting its replacement")
        wait_for(lambda: m.text().count("starting its replacement") > n, 15,
                 lambda: m.text()[-2000:])
    finally:
        blocker.close()


# ---- a connection arriving as the old generation drains ------------------------------------------

# Reloads until one leaves a connection unanswered: with the bug back (no
# dup of the deleted listeners kept at the drain, e1a8b0b's fix undone) it
# was the 1st to 4th reload in 5 of 5 runs at load 23-27 (2 cores); 12 is
# three times the latest seen. 30 took 43 s of one xdist worker, and its
# hogs slow the other one meanwhile.
COMMIT_RELOADS = 12


@pytest.mark.timeout(120)
@pytest.mark.long                       # reloads beside CPU hogs: scheduled first
def test_a_connection_at_the_commit_is_answered(master, tmp_path):
    import http.client
    import subprocess

    write_app(tmp_path, "v0")
    m = master("verapp:app", "-w", "2")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 1)]       # widens the window; killed below
    hung = []
    try:
        for i in range(1, COMMIT_RELOADS + 1):
            write_app(tmp_path, f"v{i}")
            m.proc.send_signal(signal.SIGHUP)
            # tight poll of the log: the request lands right as the Drain is sent
            deadline = time.monotonic() + 30
            while m.text().count("serving (ready") < i:
                assert time.monotonic() < deadline, m.text()[-2000:]
                time.sleep(0.001)
            c = http.client.HTTPConnection("127.0.0.1", m.port, timeout=3)
            try:
                c.request("GET", "/")
                c.getresponse().read()
            except TimeoutError:
                hung.append(i)
                break
            finally:
                c.close()
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert hung == [], f"unanswered for 3 s after reload(s) {hung}"
