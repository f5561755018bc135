"""Socket activation: against the real systemd-socket-activate, and the edge cases of
sd_listen_fds(3) on a plain environment mapping."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sockherd.ipc import systemd
from sockherd.ipc.errors import ActivationError

from ipc_waiting import wait_until

HERE = Path(__file__).resolve().parent
ACTIVATE = shutil.which("systemd-socket-activate")


def connect(path: str, timeout: float = 10) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(path)
    return sock


def read_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


@pytest.fixture
def short_dir():
    # AF_UNIX paths are limited to 108 bytes; pytest's tmp_path can be longer.
    path = tempfile.mkdtemp(prefix="sh-")
    yield Path(path)
    shutil.rmtree(path)


@pytest.fixture
def activate(short_dir):
    """Start systemd-socket-activate with the given arguments; reaped whatever happens."""
    procs = []

    def start(args):
        proc = subprocess.Popen([ACTIVATE, *args, sys.executable, str(HERE / "ipc_activated_child.py")],
                                cwd=short_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


@pytest.mark.skipif(ACTIVATE is None, reason="systemd-socket-activate missing (Debian package systemd)")
@pytest.mark.parametrize("fdnames", [True, False])
def test_real_socket_activation(activate, short_dir, fdnames):
    web, admin = str(short_dir / "web.sock"), str(short_dir / "admin.sock")
    args = ["-l", web, "-l", admin, "-E", "SOCKHERD_TEST_MARK=activated"]
    if fdnames:
        args.append("--fdname=web:admin")
    proc = activate(args)
    wait_until(lambda: os.path.exists(admin) or proc.poll() is not None, 30, "the listening sockets")
    assert proc.poll() is None, proc.communicate()
    # Our connection makes systemd-socket-activate exec the child with the listeners.
    with connect(web) as conn:
        report = json.loads(read_line(conn))
    with connect(admin) as conn:
        answer = read_line(conn)
    assert proc.wait(timeout=30) == 0, proc.communicate()
    assert report["pid"] == proc.pid                   # exec'd in place: LISTEN_PID matched
    assert report["before"]["LISTEN_FDS"] == "2"
    assert report["before"]["LISTEN_PID"] == str(proc.pid)
    assert report["after"] == {"LISTEN_PID": None, "LISTEN_FDS": None, "LISTEN_FDNAMES": None}
    assert report["fds"] == [3, 4]
    assert report["inheritable"] == [False, False]
    assert report["addresses"] == [web, admin]
    assert report["mark"] == "activated"
    names = ["web", "admin"] if fdnames else ["unknown", "unknown"]
    assert report["names"] == names
    assert answer == names[1].encode() + b"\n"


# -- sd_listen_fds(3) edge cases, on a mapping: none of them touches an fd ------------------

def env(**values):
    return {key: str(value) for key, value in values.items()}


@pytest.mark.parametrize("environ", [
    {},                                                          # not activated
    env(LISTEN_FDS=2),                                           # no LISTEN_PID
    env(LISTEN_PID=1, LISTEN_FDS=2),                             # someone else's (pid 1)
    env(LISTEN_PID=os.getpid() + 1, LISTEN_FDS=2, LISTEN_FDNAMES="a:b"),
    env(LISTEN_PID=os.getpid()),                                 # no LISTEN_FDS
])
def test_not_for_us_means_no_fds(environ):
    environ["OTHER"] = "kept"
    assert systemd.listen_fds(environ=environ) == []
    assert environ == {"OTHER": "kept"}


@pytest.mark.parametrize("values, message", [
    (dict(LISTEN_PID="abc", LISTEN_FDS="1"), "LISTEN_PID='abc' is not a decimal number"),
    (dict(LISTEN_PID="0", LISTEN_FDS="1"), "LISTEN_PID='0' is not a valid pid"),
    (dict(LISTEN_FDS="-1"), "LISTEN_FDS='-1' is not a decimal number"),
    (dict(LISTEN_FDS="0"), "LISTEN_FDS='0' must be at least 1"),
    (dict(LISTEN_FDS="2", LISTEN_FDNAMES="web"), "LISTEN_FDNAMES has 1 names for LISTEN_FDS=2"),
    (dict(LISTEN_FDS="2", LISTEN_FDNAMES="a:b:c"), "LISTEN_FDNAMES has 3 names for LISTEN_FDS=2"),
    (dict(LISTEN_FDS="2", LISTEN_FDNAMES=""), "LISTEN_FDNAMES has 0 names for LISTEN_FDS=2"),
    (dict(LISTEN_FDS="2", LISTEN_FDNAMES="a::b"), "LISTEN_FDNAMES has 3 names for LISTEN_FDS=2"),
    # int() refuses 4300 digits or more: still the variable's fault, said as such.
    (dict(LISTEN_PID="1" * 5000, LISTEN_FDS="1"),
     "LISTEN_PID='1111111111.*' is not a decimal number"),
    (dict(LISTEN_FDS="1" * 5000), "LISTEN_FDS='1111111111.*' is not a decimal number"),
])
def test_invalid_activation_is_an_error_and_still_unsets(values, message):
    environ = {"LISTEN_PID": str(os.getpid()), **values}
    with pytest.raises(ActivationError, match=message):
        systemd.listen_fds(environ=environ)
    assert environ == {}


def test_unset_environment_false_keeps_variables():
    environ = env(LISTEN_PID=1, LISTEN_FDS=1)
    systemd.listen_fds(unset_environment=False, environ=environ)
    assert environ == env(LISTEN_PID=1, LISTEN_FDS=1)


def run_child(code: str, **kwargs) -> subprocess.CompletedProcess:
    """Cases that touch fds 3.. run in a child, never on pytest's own fds."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, **kwargs)


def test_promised_fd_not_open_is_an_error():
    out = run_child(
        "import os\n"
        "from sockherd.ipc import systemd\n"
        "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1')\n"
        "try:\n"
        "    systemd.listen_fds()\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc, 'LISTEN_FDS' in os.environ)\n")
    assert out.stdout.strip() == "ActivationError LISTEN_FDS=1 but fd 3 is unusable (Bad file descriptor) False", out.stderr


def test_activated_fd_that_is_not_a_listener_is_refused_and_closed():
    out = run_child(
        "import os\n"
        "from sockherd.ipc import systemd\n"
        "os.dup2(os.pipe()[0], 3)\n"
        "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1', LISTEN_FDNAMES='x')\n"
        "fds = systemd.listen_fds()\n"
        "try:\n"
        "    systemd.adopt(fds)\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
        "try:\n"
        "    os.fstat(3)\n"
        "except OSError:\n"
        "    print('closed')\n")
    assert out.stdout.splitlines() == [
        "ActivationError activated fd 3 ('x') is not a socket (Socket operation on non-socket)",
        "closed"], out.stderr
