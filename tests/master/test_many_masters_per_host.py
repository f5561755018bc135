"""Many masters on one host with default settings (issue 36 §1). Before:
a second app (`sockherd run other:app -b :8005` beside a running master)
exited 1, "ipc:///run/sockherd/control is served by another running
master", and `sockherd ctl` after a master was killed waited 5 s for "no
answer". Now each master's control endpoint is in a directory of its own
in the default place, named after proc_name or its bind addresses;
`sockherd ctl` finds the masters there: the only one, the one of `-b
ADDRESS`, a list when several run (`ctl list`), and "no master running"
at once, the dead master's socket removed.

Real masters, started with no runtime_dir (the default place is
XDG_RUNTIME_DIR/sockherd, here under tmp_path), on unix-socket binds of
their own (two port-0 binds would be one name)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from test_run import Master, children, reap

pytestmark = pytest.mark.timeout(120)

APP = """
import os

def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"%d" % os.getppid()]
"""


@pytest.fixture
def host(tmp_path: Path):
    """start(bind, *args): a master with default control settings; every
    one is reaped with its workers at the end."""
    (tmp_path / "app.py").write_text(APP)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOCKHERD_")}
    # short: the control socket's path (and the binds') must fit a sun_path
    short = Path(tempfile.mkdtemp(prefix="mm", dir="/tmp"))
    env["XDG_RUNTIME_DIR"] = str(short / "xdg")
    (short / "xdg").mkdir()
    started: list[Master] = []

    def start(bind: str, *args: str, ready: bool = True) -> Master:
        log = tmp_path / f"master{len(started)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "sockherd.master", "run", "app:app",
                                     "-w", "1", "-b", bind, "--chdir", str(tmp_path), *args],
                                    stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, env=env)
        m = Master(proc, log)
        started.append(m)
        if ready:
            m.wait_log(r"worker \d+\.\d+: ready")
        return m

    start.env = env
    start.place = short / "xdg" / "sockherd"
    start.short = short
    yield start
    for m in started:
        reap(m.proc)
    shutil.rmtree(short, ignore_errors=True)


def ctl(host, *words: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sockherd.master", "ctl", *words],
                          capture_output=True, text=True, timeout=60, env=host.env)


def test_two_apps_run_side_by_side_and_ctl_reaches_each(host, tmp_path):
    a_bind, b_bind = f"unix:{host.short}/a.sock", f"unix:{host.short}/b.sock"
    a = host(a_bind)
    b = host(b_bind, "-n", "billing", "-p", str(host.short / "billing.pid"))
    assert a.proc.poll() is None and b.proc.poll() is None
    dirs = sorted(p.name for p in host.place.iterdir())
    assert "billing" in dirs and len(dirs) == 2, dirs
    listed = ctl(host, "list")
    assert listed.returncode == 0, listed.stderr
    assert f"pid {a.proc.pid} " in listed.stdout and f"pid {b.proc.pid} " in listed.stdout
    # several: listed, none picked
    several = ctl(host, "status")
    assert several.returncode == 2, several
    assert "several masters run" in several.stderr and "-b ADDRESS" in several.stderr
    for m, bind in ((a, a_bind), (b, b_bind)):
        got = ctl(host, "-b", bind, "status", "--json")
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout)["pid"] == m.proc.pid
        # or by its pid, or its pidfile's
        for which in [str(m.proc.pid)] + ([str(host.short / "billing.pid")] if m is b else []):
            got = ctl(host, "--pid", which, "status", "--json")
            assert got.returncode == 0, got.stderr
            assert json.loads(got.stdout)["pid"] == m.proc.pid
    nobody = ctl(host, "--pid", "1", "status")
    assert nobody.returncode == 3 and "no master running has pid 1" in nobody.stderr, nobody
    # proc_name names the titles too
    with open(f"/proc/{b.proc.pid}/cmdline", "rb") as f:
        assert f.read().startswith(b"sockherd: master [billing]")
    (worker,) = children(b.proc.pid)
    with open(f"/proc/{worker}/cmdline", "rb") as f:
        assert b"[billing]" in f.read()

    # a master killed (its socket left behind): "no master running" at once
    kids = children(a.proc.pid)
    reap(a.proc, kids)
    began = time.monotonic()
    gone = ctl(host, "-b", a_bind, "status")
    assert gone.returncode == 3, gone
    assert "no master running" in gone.stderr and time.monotonic() - began < 3
    # ... its dead socket removed, and the one left is the one asked
    assert sorted(p.name for p in host.place.iterdir()) == ["billing"]
    only = ctl(host, "status", "--json")
    assert only.returncode == 0 and json.loads(only.stdout)["pid"] == b.proc.pid


def test_no_master_running_is_said_at_once(host):
    began = time.monotonic()
    got = ctl(host, "status")
    assert got.returncode == 3, got
    assert "no master running" in got.stderr and time.monotonic() - began < 3


def test_a_second_master_of_the_same_binds_is_refused(host, tmp_path):
    bind = f"unix:{host.short}/same.sock"
    host(bind)
    second = host(bind, ready=False)
    assert second.proc.wait(timeout=60) == 1
    assert "is served by another running master" in second.text()


def test_a_master_with_its_own_runtime_dir_is_found_when_named(host, tmp_path):
    """Issue 36 §1: `ctl status` could not find a master started with
    --runtime-dir. Outside the default places it is found (in
    /proc/net/unix, no connection) when named by -b or --pid, listed by
    `ctl list`, and a flagless ctl that finds none in the default places
    says where it runs (never picks it: which one is the operator's)."""
    bind = f"unix:{host.short}/own.sock"
    own = host.short / "own-run"
    m = host(bind, "--runtime-dir", str(own))
    for words in (("-b", bind), ("--pid", str(m.proc.pid))):
        got = ctl(host, *words, "status", "--json")
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout)["pid"] == m.proc.pid
    listed = ctl(host, "list")
    assert listed.returncode == 0 and f"pid {m.proc.pid} " in listed.stdout, listed
    assert f"ipc://{own}/control" in listed.stdout
    flagless = ctl(host, "status")
    assert flagless.returncode == 3, flagless
    assert "no master running" in flagless.stderr
    assert "running with a --runtime-dir of their own: " in flagless.stderr
    assert f"ipc://{own}/control" in flagless.stderr, flagless.stderr
