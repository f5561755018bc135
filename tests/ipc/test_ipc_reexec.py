"""Re-exec state: strict decoding, and survival of a real exec() with exactly the fds it
names."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from sockherd.ipc import reexec
from sockherd.ipc.errors import ReexecStateError
from sockherd.ipc.listeners import ListenerDescriptor, describe

from ipc_fdcount import is_open

HERE = Path(__file__).resolve().parent


def connect_to(family: str, address: str) -> socket.socket:
    if family == "inet":
        host, port = address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=10)
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect("\0" + address[1:] if address.startswith("@") else address)
    return sock


@pytest.mark.parametrize("carrier", ["inline", "memfd"])
def test_state_survives_a_real_exec(carrier):
    pairs = [socket.socketpair() for _ in range(2)]
    master_ends = [a.fileno() for a, _ in pairs]
    proc = subprocess.Popen([sys.executable, str(HERE / "ipc_reexec_old.py"), carrier, *map(str, master_ends)],
                            pass_fds=master_ends, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for a, _ in pairs:
            a.close()                    # the child holds them now
        report = json.loads(proc.stdout.readline())
        memfd = [report["memfd"]] if carrier == "memfd" else []
        assert (report["memfd"] is not None) == (carrier == "memfd")
        assert report["open"] == sorted([0, 1, 2] + report["named"] + memfd)
        assert report["memfd_closed"]
        assert not set(report["decoys"]) & set(report["open"])
        assert report["env_left"] is False
        assert report["inheritable"] == [False] * 4       # private again after take()
        assert report["master_pid_kept"] is True          # exec keeps the pid
        assert report["workers"] == [[1000, 5, 0], [1001, 5, 1]]
        for i, (_, worker_end) in enumerate(pairs):
            worker_end.settimeout(10)
            assert worker_end.recv(100) == f"hello 5.{i}\n".encode()
        for name, family, address in report["listeners"]:
            with connect_to(family, address) as conn:
                assert conn.makefile("rb").readline() == name.encode() + b"\n"
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
        for _, worker_end in pairs:
            worker_end.close()


@pytest.fixture
def listener():
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(f"\0sockherd-test-{uuid.uuid4().hex}")
    sock.listen()
    yield sock
    sock.close()


def state_with(listener_fd, desc, worker_fd=None):
    workers = [] if worker_fd is None else [reexec.InheritedWorker(9, 1, 0, worker_fd)]
    return reexec.ReexecState(version=1, master_pid=os.getpid(), generation=1,
                              listeners=[reexec.InheritedListener(listener_fd, desc)],
                              workers=workers)


def test_prepare_and_abort_exec_flip_only_named_fds(listener):
    other = socket.socket()
    with other:
        state = state_with(listener.fileno(), describe(listener, "web"))
        plan = reexec.prepare_exec(state, environ={"PATH": "/bin"})
        env = plan.env
        assert env["PATH"] == "/bin" and reexec.decode(env[reexec.ENV_VAR]) == state
        assert listener.get_inheritable() and not other.get_inheritable()
        reexec.abort_exec(plan)                        # exec failed: back to private
        assert not listener.get_inheritable()


def test_large_state_goes_through_a_memfd(listener):
    fd = os.dup(listener.fileno())
    state = state_with(fd, describe(listener, "web"))
    plan = reexec.prepare_exec(state, environ={}, inline_limit=10)
    assert plan.env[reexec.ENV_VAR] == f"memfd:{plan.memfd}"
    assert plan.inherited == [fd, plan.memfd] and os.get_inheritable(plan.memfd)
    environ = dict(plan.env)
    taken = reexec.take(environ)                     # as the new image would
    assert taken == state and environ == {}
    assert not is_open(plan.memfd) and not os.get_inheritable(fd)
    os.close(fd)


def test_bad_memfd_reference():
    with pytest.raises(ReexecStateError, match="bad memfd reference 'memfd:x'"):
        reexec.take({reexec.ENV_VAR: "memfd:x"})


def test_take_checks_fds_and_leaves_them_all_on_mismatch(listener):
    """Refused whole, and nothing touched: the fds stay inheritable for the
    master to salvage (master/upgrade.salvaged)."""
    fd = os.dup(listener.fileno())
    a, b = socket.socketpair()
    worker_fd = a.detach()
    for each in (fd, worker_fd):
        os.set_inheritable(each, True)                # as the exec left them
    with b:
        wrong = ListenerDescriptor("web", "unix", "@somewhere-else")
        environ = {reexec.ENV_VAR: reexec.encode(state_with(fd, wrong, worker_fd))}
        with pytest.raises(ReexecStateError, match="is bound to @sockherd-test-"):
            reexec.take(environ)
        assert environ == {}
        assert os.get_inheritable(fd) and os.get_inheritable(worker_fd)
        os.close(fd)
        os.close(worker_fd)


def test_take_refuses_a_worker_fd_that_is_not_a_socketpair(listener):
    fd = os.dup(listener.fileno())
    r, w = os.pipe()
    os.close(w)
    for each in (fd, r):
        os.set_inheritable(each, True)
    environ = {reexec.ENV_VAR: reexec.encode(state_with(fd, describe(listener, "web"), r))}
    with pytest.raises(ReexecStateError, match=rf"worker 1.0 \(pid 9\) fd {r} is not a socket"):
        reexec.take(environ)
    assert os.get_inheritable(fd) and os.get_inheritable(r)
    os.close(fd)
    os.close(r)


def test_take_without_state():
    assert reexec.take({}) is None


@pytest.mark.parametrize("text, message", [
    ("{", "Input data was truncated"),
    ('{"version": 1, "master_pid": "1", "generation": 1}',
     "field `$.master_pid`: "),
    ('{"version": 1, "master_pid": 1, "generation": 1, "extra": 0}',
     "unknown field `extra`"),
    ('{"version": 2, "master_pid": 1, "generation": 1}', "state version 2, expected 1"),
    ('{"version": 1, "master_pid": 1, "generation": 1, "workers": '
     '[{"pid": 1, "generation": 1, "index": 0, "fd": 1}]}', "fd numbers below 3"),
    ('{"version": 1, "master_pid": 1, "generation": 1, "workers": '
     '[{"pid": 1, "generation": 1, "index": 0, "fd": 7}, '
     '{"pid": 2, "generation": 1, "index": 1, "fd": 7}]}', "an fd is named twice"),
])
def test_decode_is_strict(text, message):
    with pytest.raises(ReexecStateError, match=re.escape(message)):
        reexec.decode(text)


def test_take_refuses_an_o_path_listener_fd():
    # What fstat() calls a socket yet is only a reference to its path: ReexecStateError
    # like any other mismatch, not a bare OSError out of socket(fileno=).
    path = tempfile.mkdtemp(prefix="sh-")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.bind(os.path.join(path, "l.sock"))
            sock.listen()
            fd = os.open(sock.getsockname(), os.O_PATH | os.O_CLOEXEC)
            environ = {reexec.ENV_VAR: reexec.encode(state_with(fd, describe(sock, "web")))}
            with pytest.raises(ReexecStateError, match=rf"listener 'web': fd {fd} is an "
                                                       "O_PATH reference to a socket .*, "
                                                       "not an open socket"):
                reexec.take(environ)
            assert is_open(fd)
            os.close(fd)
    finally:
        shutil.rmtree(path)


@pytest.mark.parametrize("value, message", [
    # os.environ holds undecodable bytes as surrogates (surrogateescape).
    ("{\udcff}", r"not UTF-8 text \(byte ff at offset 1\)"),
    ("memfd:²", "bad memfd reference 'memfd:²'"),                  # isdigit(), not 0-9
    ("memfd:" + "9" * 5000, "bad memfd reference 'memfd:99999"),   # int() refuses 4300+ digits
])
def test_take_refuses_a_mangled_variable_with_reexec_state_error(value, message):
    environ = {reexec.ENV_VAR: value}
    with pytest.raises(ReexecStateError, match=message):
        reexec.take(environ)
    assert environ == {}
