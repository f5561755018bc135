"""deploy/systemd: sockherd@.service, sockherd@.socket and example.toml.

* `systemd-analyze verify` on the instance `sockherd@example` of both
  templates, copied into tmp_path with /opt/sockherd/bin/sockherd replaced by
  this venv's sockherd: verify refuses a unit whose Exec*= binary does not
  exist, so the shipped path would fail here while proving nothing about the
  unit. A clean verify must print nothing at all (an unknown key or a bad
  value is only a warning on stderr with exit 0), and a control run with an
  unknown key injected shows that verify did read our files.
* `systemd-analyze security --offline=yes`: the hardening's exposure score.
* The options the units rely on, and their consistency with each other and
  with example.toml (decoded by sockherd's own settings code).
* The unit's own ExecStart= and ExecReload= command lines (specifiers
  expanded, the config path pointed at a copy of example.toml) run the way
  systemd runs them: the socket passed by systemd-socket-activate under the
  socket unit's FileDescriptorName, NOTIFY_SOCKET, KillSignal= to stop. A
  real `systemctl start` needs systemd as PID 1, which this sandbox has not.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
SERVICE, SOCKET = "sockherd@.service", "sockherd@.socket"
EXAMPLE = UNITS / "example.toml"
APP_DIR = ROOT / "deploy" / "container"                 # hello.py
SHIPPED_BIN = "/opt/sockherd/bin/sockherd"
VENV_BIN = str(Path(sys.executable).parent / "sockherd")
INSTANCE = "example"

ANALYZE = shutil.which("systemd-analyze")
ACTIVATE = shutil.which("systemd-socket-activate")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed "
                                   "(Debian package systemd)")
pytestmark = pytest.mark.timeout(60)


# ---- reading units -----------------------------------------------------------------------------

def parse_unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """{section: [(key, value), ...]} in file order: systemd keys repeat
    (an empty value resets a list), so no configparser."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    pending = ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"{path.name}: {line!r} outside any section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not KEY=VALUE: {line!r}"
        current.append((key.strip(), value.strip()))
    return sections


def one(unit: dict, section: str, key: str) -> str:
    values = [v for k, v in unit.get(section, []) if k == key]
    assert len(values) == 1, f"[{section}] {key}=: expected once, found {values}"
    return values[0]


def many(unit: dict, section: str, key: str) -> list[str]:
    """A list-valued key: the words of every assignment since the last reset."""
    out: list[str] = []
    for k, v in unit.get(section, []):
        if k == key:
            out = [] if not v else out + v.split()
    return out


def seconds(value: str) -> float:
    """A systemd time span ("45", "45s", "1min 30s")."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "ms": 0.001}
    total = 0.0
    for number, unit in re.findall(r"([\d.]+)\s*([a-z]*)", value):
        total += float(number) * units[unit]
    return total


def expand(text: str, runtime: Path) -> str:
    """The specifiers the units use, as the system manager expands them."""
    return text.replace("%i", INSTANCE).replace("%t", str(runtime)).replace("%%", "%")


@pytest.fixture(scope="module")
def service():
    return parse_unit(UNITS / SERVICE)


@pytest.fixture(scope="module")
def sock():
    return parse_unit(UNITS / SOCKET)


@pytest.fixture(scope="module")
def example() -> dict:
    with open(EXAMPLE, "rb") as f:
        return tomllib.load(f)


@pytest.fixture
def unit_dir(tmp_path) -> Path:
    """Both templates with the venv's sockherd in place of the shipped path."""
    out = tmp_path / "units"
    out.mkdir()
    for name in (SERVICE, SOCKET):
        text = (UNITS / name).read_text()
        (out / name).write_text(text.replace(SHIPPED_BIN, VENV_BIN))
    assert os.access(VENV_BIN, os.X_OK), VENV_BIN
    return out


def verify(where: Path) -> subprocess.CompletedProcess:
    return subprocess.run([ANALYZE, "verify", "--man=no", f"sockherd@{INSTANCE}.service",
                           f"sockherd@{INSTANCE}.socket"], cwd=where, capture_output=True,
                          text=True, timeout=30)


# ---- systemd-analyze ---------------------------------------------------------------------------

@needs_analyze
def test_units_verify_clean(unit_dir):
    """No error and not a single warning for the instance of both templates."""
    run = verify(unit_dir)
    assert run.returncode == 0, run.stderr
    assert run.stderr.strip() == "" and run.stdout.strip() == "", run.stderr + run.stdout


@needs_analyze
def test_verify_reads_these_files(unit_dir):
    """Control: verify does parse our copies (an injected unknown key is
    reported) and checks the Exec binaries (the shipped path, absent here,
    fails) -- so the clean run above means something."""
    path = unit_dir / SERVICE
    good = path.read_text()
    path.write_text(good.replace("KillMode=mixed", "KillMode=mixed\nKilMode=typo", 1))
    run = verify(unit_dir)
    assert "Unknown key 'KilMode'" in run.stderr, run.stderr
    path.write_text(good.replace(VENV_BIN, "/nonexistent/sockherd"))
    run = verify(unit_dir)
    assert run.returncode != 0 and "/nonexistent/sockherd" in run.stderr, run.stderr


@needs_analyze
def test_hardening_exposure_score(unit_dir):
    """`systemd-analyze security --offline`: "OK" and low (1.7 with systemd
    252; 10 is an unconfined service). A dropped hardening line shows here."""
    run = subprocess.run([ANALYZE, "security", "--offline=yes", "--no-pager",
                          f"sockherd@{INSTANCE}.service"], cwd=unit_dir, capture_output=True,
                         text=True, timeout=30)
    found = re.search(r"Overall exposure level for \S+: ([\d.]+) (\w+)", run.stdout)
    assert found, run.stdout + run.stderr
    assert float(found.group(1)) <= 2.5 and found.group(2) == "OK", found.group(0)


# ---- the options and their consistency -------------------------------------------------------

def test_service_type_notify_and_stop(service):
    assert one(service, "Service", "Type") == "notify"
    assert one(service, "Service", "NotifyAccess") == "main"
    # a stop's TERM goes to the master only: it times the workers' drain itself
    assert one(service, "Service", "KillMode") == "mixed"
    assert one(service, "Service", "KillSignal") in ("SIGTERM", "TERM")
    assert one(service, "Service", "OOMPolicy") == "continue"
    assert one(service, "Service", "RestartPreventExitStatus") == "2"    # bad setting


def test_stop_timeout_above_unready_delay_plus_hard_stop_after(service, example):
    stop = seconds(one(service, "Service", "TimeoutStopSec"))
    need = example["unready_delay"] + example["hard_stop_after"]
    assert example["unready_delay"] > 0            # the example shows the lame duck
    assert stop > need + 5, (f"TimeoutStopSec={stop:g} must exceed unready_delay + "
                             f"hard_stop_after = {need:g} with room for the exit")


def test_start_reload_and_control_paths_agree(service, example):
    """ExecStart and ExecReload name the same runtime directory, which is the RuntimeDirectory systemd creates; ExecReload is
    the synchronous `ctl reload` whose timeout lies between the master's
    ready_timeout and systemd's reload timeout (TimeoutStartSec)."""
    start = shlex.split(one(service, "Service", "ExecStart"))
    reload = shlex.split(one(service, "Service", "ExecReload"))
    assert start[0] == reload[0] == SHIPPED_BIN
    assert start[1] == "run" and reload[1] == "ctl" and reload[-1] == "reload"

    def flag(argv, name):
        assert argv.count(name) == 1, argv
        return argv[argv.index(name) + 1]

    assert flag(start, "-c") == "/etc/sockherd/%i.toml"
    # the master judges the settings file on a reload, not ctl (which would
    # stop at a broken file before asking)
    assert "-c" not in reload
    for argv in (start, reload):
        assert flag(argv, "--runtime-dir") == "%t/sockherd/" + one(
            service, "Service", "RuntimeDirectory").removeprefix("sockherd/")
    assert one(service, "Service", "RuntimeDirectory") == "sockherd/%i"
    assert one(service, "Unit", "AssertPathExists") == "/etc/sockherd/%i.toml"
    ctl_timeout = float(flag(reload, "--timeout"))
    assert example["ready_timeout"] < ctl_timeout < seconds(
        one(service, "Service", "TimeoutStartSec"))
    # each worker may hold max_connections sockets (the default, 10000)
    assert int(one(service, "Service", "LimitNOFILE")) > example.get("max_connections", 10000)


def test_service_user_and_hardening(service):
    keys = dict(service["Service"])
    assert keys.get("DynamicUser") == "yes" or keys.get("User", "root") not in ("root", "0")
    want = {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
            "PrivateTmp": "yes", "PrivateDevices": "yes", "ProtectKernelTunables": "yes",
            "ProtectKernelModules": "yes", "ProtectControlGroups": "yes",
            "RestrictNamespaces": "yes", "RestrictSUIDSGID": "yes", "LockPersonality": "yes",
            "RestrictRealtime": "yes", "SystemCallArchitectures": "native"}
    for key, value in want.items():
        assert keys.get(key) == value, f"{key}={keys.get(key)}, want {value}"
    # sockherd needs unix sockets (control, worker socketpairs, notify) and IP
    assert set(many(service, "Service", "RestrictAddressFamilies")) >= {
        "AF_UNIX", "AF_INET", "AF_INET6"}
    assert many(service, "Service", "CapabilityBoundingSet") == []
    # python-prctl's capset and prctl, sendfile, epoll: all in @system-service
    assert many(service, "Service", "SystemCallFilter") == ["@system-service"]


def test_socket_matches_service_and_example(service, sock, example):
    """Every `systemd:NAME` in example.toml's bind is a FileDescriptorName of
    the socket unit, which the service requires and orders itself after."""
    names = set(many(sock, "Socket", "FileDescriptorName"))
    wanted = {b.removeprefix("systemd:") for b in example["bind"] if b.startswith("systemd:")}
    assert wanted and wanted <= names, (wanted, names)
    assert many(sock, "Socket", "ListenStream"), "no ListenStream="
    assert dict(sock["Socket"]).get("Accept", "no") == "no"     # sockherd accepts itself
    assert "Service" not in dict(sock["Socket"])   # default: sockherd@%i.service, same instance
    assert "sockherd@%i.socket" in many(service, "Unit", "Requires")
    assert "sockherd@%i.socket" in many(service, "Unit", "After")
    assert one(sock, "Install", "WantedBy") == "sockets.target"
    assert one(service, "Install", "WantedBy") == "multi-user.target"


def test_example_settings_decode():
    """example.toml through sockherd's own settings code (keys, types, values)."""
    from sockherd.master import settings as S

    got = S.resolve({}, config=str(EXAMPLE))
    assert got.bind == ["systemd:web"] and got.app == "hello:app"
    assert got.metrics


# ---- the command lines, run as systemd runs them ---------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port: int, path: str = "/", timeout: float = 5.0) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as c:
        c.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := c.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


class Notify:
    """NOTIFY_SOCKET's receiving end: the datagrams the master sends systemd."""

    def __init__(self, path: Path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.lines: list[str] = []

    def wait(self, line: str, count: int = 1, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while self.lines.count(line) < count:
            left = deadline - time.monotonic()
            assert left > 0, f"no {line!r} x{count} from the master: {self.lines}"
            self.sock.settimeout(left)
            try:
                self.lines += self.sock.recv(4096).decode().splitlines()
            except TimeoutError:
                pass


@pytest.mark.skipif(ACTIVATE is None, reason="systemd-socket-activate not installed")
def test_unit_command_lines_run_as_systemd_runs_them(service, sock, tmp_path):
    """ExecStart= under systemd-socket-activate (LISTEN_FDS with the socket
    unit's FileDescriptorName, a clean environment, NOTIFY_SOCKET): READY=1
    once it serves; ExecReload= exits 0 after a good reload and non-zero with
    the reason for a bad settings file, the old generation serving on;
    KillSignal= stops it with exit 0 well within TimeoutStopSec."""
    runtime = tmp_path / "run"
    rundir = runtime / "sockherd" / INSTANCE             # RuntimeDirectory=, mode 0700
    rundir.mkdir(parents=True, mode=0o700)
    config = tmp_path / f"{INSTANCE}.toml"
    config.write_text(EXAMPLE.read_text())

    def argv(key: str) -> list[str]:
        line = expand(one(service, "Service", key), runtime)
        line = line.replace(f"/etc/sockherd/{INSTANCE}.toml", str(config))
        words = shlex.split(line)
        assert words[0] == SHIPPED_BIN
        return [VENV_BIN, *words[1:]]

    notify = Notify(tmp_path / "notify.sock")
    port, metrics = free_port(), free_port()
    name = one(sock, "Socket", "FileDescriptorName")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
           "NOTIFY_SOCKET": notify.path,
           # the test's own: a free metrics port, the example app from the
           # repository, one worker and a short lame duck to keep it quick
           "SOCKHERD_METRICS": f"127.0.0.1:{metrics}", "SOCKHERD_CHDIR": str(APP_DIR),
           "SOCKHERD_WORKERS": "1", "SOCKHERD_THREADS": "1",
           "SOCKHERD_UNREADY_DELAY": "0.3", "SOCKHERD_RELOAD_PROBATION": "1"}
    log = tmp_path / "master.log"
    cmd = [ACTIVATE, f"-l127.0.0.1:{port}", f"--fdname={name}",
           *[f"-E{k}={v}" for k, v in env.items()], *argv("ExecStart")]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd="/")
    try:
        deadline = time.monotonic() + 10
        while b"Listening on" not in log.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        status, body = http_get(port)                     # this connection starts it
        assert status == 200 and body.startswith(b"hello from "), body
        notify.wait("READY=1")
        assert f"MAINPID={proc.pid}" in notify.lines     # activate execs in place
        assert http_get(metrics, "/-/ready")[0] == 200

        reload_env = {**env, "NOTIFY_SOCKET": ""}         # ExecReload: the same unit env
        ok = subprocess.run(argv("ExecReload"), env=reload_env, capture_output=True, text=True,
                            timeout=60)
        assert ok.returncode == 0, ok.stderr
        assert "generation 2 serving" in ok.stdout, ok.stdout
        notify.wait("READY=1", count=2)                   # at the commit
        notify.wait("READY=1", count=3)                   # the probation passed

        text = EXAMPLE.read_text()
        assert "\nworkers = 2\n" in text
        config.write_text(text.replace("\nworkers = 2\n", '\nworkers = "many"\n'))
        bad = subprocess.run(argv("ExecReload"), env=reload_env, capture_output=True,
                             text=True, timeout=60)
        assert bad.returncode == 1, (bad.returncode, bad.stdout, bad.stderr)
        assert "reload refused" in bad.stderr and "workers" in bad.stderr, bad.stderr
        assert "generation 2 keeps serving" in bad.stderr, bad.stderr
        assert http_get(port)[0] == 200                   # generation 2 serves on

        started = time.monotonic()
        proc.send_signal(getattr(signal, one(service, "Service", "KillSignal")))
        assert proc.wait(timeout=30) == 0, log.read_text()
        assert time.monotonic() - started < seconds(one(service, "Service", "TimeoutStopSec"))
        notify.wait("STOPPING=1")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        notify.sock.close()
