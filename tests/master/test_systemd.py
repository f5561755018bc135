"""systemd integration with real masters: Type=notify against a fake
NOTIFY_SOCKET (an AF_UNIX datagram socket the test binds, with SO_PASSCRED
so that every datagram carries its sender's pid, as systemd sees it), and
socket activation under the real systemd-socket-activate, with `bind`
entries that name the activated socket (systemd:NAME) or its address.
Every process is reaped by a fixture; every wait polls with a deadline."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from sockherd.master.addresses import Address, AddressError, parse
from sockherd.master.listeners import Listener, claim_activated
from sockherd.ipc.listeners import describe
from test_reload import answers, free_port, get, write_app
from test_run import APPS, Master, children, master, reap, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

ACTIVATE = shutil.which("systemd-socket-activate")
needs_activate = pytest.mark.skipif(ACTIVATE is None,
                                    reason="systemd-socket-activate not installed")
CREDS = struct.Struct("3i")                          # struct ucred: pid, uid, gid


def monotonic_usec() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class FakeSystemd:
    """The receiving end of NOTIFY_SOCKET. Each datagram is kept as
    (sender pid, its KEY=VALUE lines, the master's log when it arrived)."""

    def __init__(self, address: str, where: Path | None = None):
        self.address = address                         # as NOTIFY_SOCKET says it
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.got: list[tuple[int, list[str], str]] = []
        self.log: Path | None = where

    def _recv(self, timeout: float) -> bool:
        self.sock.settimeout(max(0.01, timeout))
        try:
            data, anc, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(CREDS.size))
        except TimeoutError:
            return False
        log = self.log.read_text(errors="replace") if self.log and self.log.exists() else ""
        pid = next((CREDS.unpack(d[:CREDS.size])[0] for level, kind, d in anc
                    if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS), -1)
        self.got.append((pid, data.decode().splitlines(), log))
        return True

    def wait(self, line: str, count: int = 1, timeout: float = 30) -> tuple[int, list[str], str]:
        """The count-th datagram holding `line` (received so far or now)."""
        deadline = time.monotonic() + timeout
        while True:
            hits = [g for g in self.got if line in g[1]]
            if len(hits) >= count:
                return hits[count - 1]
            left = deadline - time.monotonic()
            assert left > 0, f"no {line!r} x{count} from the master; got {self.lines()}"
            self._recv(left)

    def drain(self, quiet: float = 0.3) -> None:
        """Reads what is still queued (until `quiet` seconds bring nothing)."""
        while self._recv(quiet):
            pass

    def lines(self) -> list[str]:
        return [line for _, lines, _ in self.got for line in lines]

    def close(self) -> None:
        self.sock.close()
        if not self.address.startswith("@"):
            try:
                os.unlink(self.address)
            except FileNotFoundError:
                pass


@pytest.fixture
def fake_systemd(tmp_path, monkeypatch):
    """fake_systemd(abstract=False): a FakeSystemd whose address is put in
    NOTIFY_SOCKET for the masters this test starts."""
    made: list[FakeSystemd] = []

    def make(abstract: bool = False) -> FakeSystemd:
        address = (f"@sockherd-test-{uuid.uuid4().hex}" if abstract
                   else str(tmp_path / "notify.sock"))
        fake = FakeSystemd(address, tmp_path / "master0.log")
        made.append(fake)
        monkeypatch.setenv("NOTIFY_SOCKET", address)
        return fake

    yield make
    for fake in made:
        fake.close()


def value(lines: list[str], key: str) -> str:
    found = [line.split("=", 1)[1] for line in lines if line.startswith(key + "=")]
    assert found, f"no {key}= in {lines}"
    return found[0]


def environ(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


# ---- Type=notify ------------------------------------------------------------------------------

# the first worker to import the app takes 1.5 s more than the other: a
# READY=1 said after the first READY worker would come that much too early
SLOWFIRST = """
import os, time
try:
    os.close(os.open("first.mark", os.O_CREAT | os.O_EXCL))
    time.sleep(1.5)
except FileExistsError:
    pass
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"hello"]
"""


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_ready_only_once_every_worker_is_ready(master, fake_systemd, tmp_path, abstract):
    """READY=1 (with MAINPID = the master's pid, sent by the master itself)
    arrives after both workers logged READY, never before: the log as it was
    when the datagram arrived holds both lines; what came before it is
    STATUS= only. Works with a path and with an abstract NOTIFY_SOCKET."""
    fake = fake_systemd(abstract)
    (tmp_path / "slowfirst.py").write_text(SLOWFIRST)
    m = master("slowfirst:app", "-w", "2", "--control", "off", ready=None)
    pid, lines, log = fake.wait("READY=1")
    assert len(re.findall(r"worker 1\.\d: ready", log)) == 2, log
    assert pid == m.proc.pid and value(lines, "MAINPID") == str(m.proc.pid)
    assert "2 workers" in value(lines, "STATUS")
    before = fake.got[:fake.got.index((pid, lines, log))]
    assert before and all(line.startswith("STATUS=") for _, ls, _ in before for line in ls), \
        before
    assert "STATUS=starting: 1 of 2 workers ready" in fake.lines()
    # ... and the port answers by then
    m.port = int(re.findall(r"listening on 127\.0\.0\.1:(\d+)", m.text())[0])
    assert get(m.port) == "hello"


def test_reload_says_reloading_then_ready(master, fake_systemd):
    """SIGHUP: RELOADING=1 with MONOTONIC_USEC on CLOCK_MONOTONIC between
    the signal and its arrival, then READY=1 once the new generation serves."""
    fake = fake_systemd()
    m = master("wsgiapp:app", "-w", "2", "--control", "off")
    fake.wait("READY=1")
    before = monotonic_usec()
    m.proc.send_signal(signal.SIGHUP)
    _, lines, _ = fake.wait("RELOADING=1")
    after = monotonic_usec()
    assert before <= int(value(lines, "MONOTONIC_USEC")) <= after
    assert "generation 2 starting" in value(lines, "STATUS")
    pid, lines, log = fake.wait("READY=1", count=2)
    assert "reload: generation 2 serving" in log
    assert pid == m.proc.pid and value(lines, "MAINPID") == str(m.proc.pid)
    assert value(lines, "STATUS").startswith("serving: generation 2, 2 workers")
    # the order as systemd sees it
    seq = [line for line in fake.lines() if line in ("READY=1", "RELOADING=1")]
    assert seq == ["READY=1", "RELOADING=1", "READY=1"]


def test_a_failed_reload_says_why_then_ready_and_the_old_generation_serves(
        master, fake_systemd, tmp_path):
    fake = fake_systemd()
    write_app(tmp_path, "v1")
    config = tmp_path / "sockherd.toml"
    config.write_text("threads = 1\n")
    m = master("verapp:app", "-w", "2", "-c", str(config), "--control", "off")
    fake.wait("READY=1")
    config.write_text('workers = "x"\n')
    m.proc.send_signal(signal.SIGHUP)
    _, lines, log = fake.wait("READY=1", count=2)
    assert "reload refused (generation 2)" in log
    status = value(lines, "STATUS")
    assert status.startswith("reload failed (generation 2): bad setting") and "workers" in status
    assert "generation 1 serves on (2 workers)" in status
    # STATUS= before READY=1, and the reload was announced (notify-reload needs
    # its RELOADING=1 ... READY=1 pair even when the settings are refused)
    assert lines.index(f"STATUS={status}") < lines.index("READY=1")
    seq = [line for line in fake.lines() if line in ("READY=1", "RELOADING=1")]
    assert seq == ["READY=1", "RELOADING=1", "READY=1"]
    assert get(m.port).startswith("v1 ")
    # fixed, the next reload notifies as usual
    config.write_text("threads = 1\n")
    write_app(tmp_path, "v2")
    m.proc.send_signal(signal.SIGHUP)
    _, lines, _ = fake.wait("READY=1", count=3)
    # the refused attempt kept its number (issue 19 §10)
    assert value(lines, "STATUS").startswith("serving: generation 3")
    answers(m.port, "v2")


def test_upgrade_notifies_from_the_same_pid_and_workers_never_see_notify_socket(
        master, fake_systemd, tmp_path):
    """SIGUSR2 re-executes the master: the new image still has NOTIFY_SOCKET
    (its /proc environ), says RELOADING=1 then READY=1 with the same MAINPID,
    from the same pid; no worker, before or after, has NOTIFY_SOCKET. TERM
    then says STOPPING=1, and nothing but STATUS= follows it."""
    fake = fake_systemd()
    write_app(tmp_path, "v1")
    m = master("verapp:app", "-w", "2", "--control", "off")
    fake.wait("READY=1")
    old = children(m.proc.pid)
    assert len(old) == 2
    for pid in old:
        assert not [v for v in environ(pid) if v.startswith(b"NOTIFY_SOCKET=")]
    write_app(tmp_path, "v2")
    m.proc.send_signal(signal.SIGUSR2)
    _, lines, log = fake.wait("READY=1", count=2)
    assert "upgrade: adopted" in log and "reload: generation 2 serving" in log
    assert value(lines, "STATUS").startswith("serving: generation 2")
    assert f"NOTIFY_SOCKET={fake.address}".encode() in environ(m.proc.pid)
    new = [p for p in children(m.proc.pid) if p not in old]
    assert new
    for pid in new:
        assert not [v for v in environ(pid) if v.startswith(b"NOTIFY_SOCKET=")]
    answers(m.port, "v2")
    m.proc.send_signal(signal.SIGTERM)
    _, lines, _ = fake.wait("STOPPING=1")
    assert m.proc.wait(timeout=30) == 0
    fake.drain()
    assert {pid for pid, _, _ in fake.got} == {m.proc.pid}
    assert {line for line in fake.lines() if line.startswith("MAINPID=")} == \
        {f"MAINPID={m.proc.pid}"}
    seq = [line for line in fake.lines() if line.split("=")[0] in
           ("READY", "RELOADING", "STOPPING")]
    assert seq == ["READY=1", "RELOADING=1", "READY=1", "STOPPING=1"]
    after = fake.lines()[fake.lines().index("STOPPING=1") + 1:]
    assert all(line.startswith("STATUS=") for line in after), after


def test_a_notify_socket_nobody_reads_is_logged_once_and_changes_nothing(
        master, tmp_path, monkeypatch):
    """NOTIFY_SOCKET naming no socket: every send fails; that is logged once,
    and the master starts, reloads and stops as without it."""
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody.sock"))
    write_app(tmp_path, "v1")
    m = master("verapp:app", "-w", "1", "--control", "off", ready=1)
    write_app(tmp_path, "v2")
    m.proc.send_signal(signal.SIGHUP)
    m.wait_log(r"reload: generation 2 serving")
    answers(m.port, "v2")
    m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(timeout=30) == 0
    said = re.findall(r"systemd notify: cannot notify systemd at .*nobody\.sock", m.text())
    assert len(said) == 1, m.text()


def test_an_unusable_notify_socket_is_said_and_ignored(master, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", "relative/notify.sock")
    m = master("wsgiapp:app", "-w", "1", "--control", "off", ready=1)
    m.wait_log(r"systemd notify: NOTIFY_SOCKET='relative/notify.sock': neither an absolute "
               r"path nor an '@' abstract name")
    assert get(m.port).startswith("GET / from ")


# ---- bind entries matched against activated sockets (no process) -----------------------------

def test_systemd_name_addresses():
    assert parse("systemd:web") == Address("systemd", name="web")
    assert str(parse("systemd:app.socket")) == "systemd:app.socket"
    for bad, why in [("systemd:", "1 to 255"), ("systemd:" + "x" * 256, "1 to 255"),
                     ("systemd:a:b", "without ':'"), ("systemd:caf\u00e9", "printable ASCII"),
                     ("systemd:a\tb", "printable ASCII")]:
        with pytest.raises(AddressError, match=re.escape(why)):
            parse(bad)


@pytest.fixture
def fake_activated(tmp_path):
    """Listening sockets posing as systemd's: (name, socket) -> Listener."""
    socks: list[socket.socket] = []

    def make(name: str, family=socket.AF_INET, where=("127.0.0.1", 0), v6only=True):
        sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        socks.append(sock)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, int(v6only))
        sock.bind(where)
        sock.listen(8)
        return Listener(parse(f"fd://{sock.fileno()}"), sock, describe(sock, name))

    yield make
    for sock in socks:
        sock.close()


def test_claim_activated_by_name_fd_and_address(fake_activated, tmp_path):
    web = fake_activated("web")
    api = fake_activated("api")
    unix = fake_activated("sock", socket.AF_UNIX, str(tmp_path / "a.sock"))
    port = web.sock.getsockname()[1]
    got = [web, api, unix]
    assert claim_activated("systemd:web", got) is web
    assert claim_activated("systemd:api", got) is api
    assert claim_activated("systemd:nope", got) is None
    assert claim_activated(f"fd://{api.sock.fileno()}", got) is api
    assert claim_activated(f"127.0.0.1:{port}", got) is web
    assert claim_activated(f"localhost:{port}", got) is web
    assert claim_activated(f"unix:{tmp_path}/a.sock", got) is unix
    assert claim_activated(f"unix:{tmp_path}/./a.sock", got) is unix
    assert claim_activated(f"unix:{tmp_path}/b.sock", got) is None
    assert claim_activated(f"127.0.0.2:{port}", got) is None
    assert claim_activated("127.0.0.1:0", got) is None         # port 0: always a new socket
    assert claim_activated("not an address", got) is None


def test_claim_activated_ipv4_wildcard_matches_a_dual_stack_socket(fake_activated):
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        dual = fake_activated("dual", socket.AF_INET6, ("::", 0), v6only=False)
    except OSError as exc:
        pytest.skip(f"no IPv6 here: {exc}")
    port = dual.sock.getsockname()[1]
    assert claim_activated(f"0.0.0.0:{port}", [dual]) is dual
    assert claim_activated(f":{port}", [dual]) is dual
    assert claim_activated(f"[::]:{port}", [dual]) is dual
    assert claim_activated(f"127.0.0.1:{port}", [dual]) is None
    only6 = fake_activated("only6", socket.AF_INET6, ("::", 0), v6only=True)
    assert claim_activated(f"0.0.0.0:{only6.sock.getsockname()[1]}", [only6]) is None


# ---- socket activation under systemd-socket-activate ---------------------------------------------

@pytest.fixture
def activated_master(tmp_path):
    """activated_master(listen=[(host, port)], names="web", args...): the
    master run by systemd-socket-activate (which waits for a first
    connection, then execs it in place with LISTEN_FDS and a clean
    environment: -E passes NOTIFY_SOCKET on, and the suite's reload
    probation (conftest.py: none unless a test asks; 10 s on each of the
    reloads and upgrades here took 20 s of each test))."""
    (tmp_path / "wsgiapp.py").write_text(APPS["wsgiapp.py"])
    started: list[Master] = []

    def start(*args: str, listen: list[int], names: str = "web", notify: str = "") -> Master:
        log = tmp_path / f"master{len(started)}.log"
        cmd = [ACTIVATE, *[f"-l127.0.0.1:{p}" for p in listen], f"--fdname={names}",
               *([f"-ENOTIFY_SOCKET={notify}"] if notify else []),
               *[f"-E{k}={os.environ[k]}" for k in ("SOCKHERD_RELOAD_PROBATION",)
                 if k in os.environ],
               sys.executable, "-m", "sockherd.master", "run", "wsgiapp:app",
               "--chdir", str(tmp_path), "--control", "off", *args]
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
        m = Master(proc, log)
        started.append(m)
        m.port = listen[0]
        m.wait_log(r"Listening on 127\.0\.0\.1:%d" % listen[-1], timeout=10)
        return m

    yield start
    for m in started:
        reap(m.proc)


@needs_activate
@pytest.mark.long                          # 35-43 s each in a loaded run: scheduled first
@pytest.mark.parametrize("bind", ["", "systemd:web", "address"])
def test_activated_socket_serves_by_name_or_address(activated_master, fake_systemd, bind):
    """The activated socket serves: with no bind setting, with a bind naming
    it (systemd:web) and with a bind of its very address, which is then not
    bound a second time (that would fail: EADDRINUSE) and stays the one
    listener across a reload and an upgrade. READY=1 comes from the
    activated master's pid (systemd-socket-activate execs it in place)."""
    fake = fake_systemd()
    port = free_port()
    args = [] if not bind else ["-b", f"127.0.0.1:{port}" if bind == "address" else bind]
    m = activated_master("-w", "2", *args, listen=[port], notify=fake.address)
    fake.log = m.log
    assert get(port).startswith("GET / from ")          # this connection starts it
    pid, lines, _ = fake.wait("READY=1")
    assert pid == m.proc.pid and value(lines, "MAINPID") == str(m.proc.pid)
    text = m.text()
    assert re.findall(r"listening on (\S+)", text) == [f"127.0.0.1:{port}"], text
    assert f"listening on 127.0.0.1:{port} (from systemd)" in text
    assert ("served by the socket systemd passed as 'web'" in text) == bool(bind), text
    assert "127.0.0.1:8000" not in text                     # the default: not bound either
    m.proc.send_signal(signal.SIGHUP)                    # the settings again: still matched
    fake.wait("READY=1", count=2)
    m.wait_log(r"reload: generation 2 serving")
    assert "reload refused" not in m.text()
    assert get(port).startswith("GET / from ")
    # an upgrade: the new image knows the socket by its name still
    m.proc.send_signal(signal.SIGUSR2)
    pid, lines, _ = fake.wait("READY=1", count=3)
    assert pid == m.proc.pid and value(lines, "MAINPID") == str(m.proc.pid)
    m.wait_log(r"reload: generation 3 serving")
    assert "reload refused" not in m.text()
    assert get(port).startswith("GET / from ")
    m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(timeout=30) == 0


@needs_activate
def test_activated_sockets_named_and_unnamed_and_bound_together(activated_master, tmp_path):
    """Two activated sockets (web, admin): a bind naming admin plus an
    address of its own: the named one serves, the unnamed one serves as
    well, and the extra address is bound."""
    web, admin, extra = free_port(), free_port(), free_port()
    m = activated_master("-w", "1", "-b", "systemd:admin", "-b", f"127.0.0.1:{extra}",
                         listen=[web, admin], names="web:admin")
    assert get(web).startswith("GET / from ")
    m.wait_log(r"worker 1\.0: ready")
    for port in (admin, extra):
        assert get(port).startswith("GET / from ")
    text = m.text()
    assert f"listening on 127.0.0.1:{web} (from systemd)" in text
    assert f"listening on 127.0.0.1:{admin} (from systemd)" in text
    assert re.search(rf"listening on 127\.0\.0\.1:{extra}$", text, re.M)
    assert len(re.findall(r"listening on ", text)) == 3


@needs_activate
def test_a_bind_naming_no_activated_socket_is_a_startup_error(activated_master):
    port = free_port()
    m = activated_master("-w", "1", "-b", "systemd:nope", listen=[port])
    with socket.create_connection(("127.0.0.1", port), timeout=10):
        assert m.proc.wait(timeout=30) == 1              # the connection that started it
    text = m.text()
    assert "bind systemd:nope: systemd passed the socket(s) 'web' only" in text
    assert "bind systemd:nope: systemd passed no socket named 'nope'" in text
    assert "worker" not in text


def test_a_systemd_bind_without_activation_is_a_startup_error(master):
    m = master("wsgiapp:app", "-w", "1", "--control", "off", bind="systemd:web", ready=None)
    assert m.proc.wait(timeout=30) == 1
    assert "systemd passed no socket (LISTEN_FDS is not set for this process)" in m.text()
    assert "worker" not in m.text()
