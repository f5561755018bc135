"""bench/blocking_app.py (issue 21's blocking table, head-of-line and hello
check) runs end to end against sockherd alone: `--quick` with every part,
this checkout given twice as two checkouts (the before/after alternation and
its ratios), and leaves no process behind. Only the script's plumbing is
pinned down: no figure is asserted, the machine is shared."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "blocking_app.py"
pytestmark = [
    pytest.mark.timeout(150),
    pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk not installed "
                       "(sh bench/setup_peers.sh)"),
    pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "sockherd").exists(),
                       reason="the bench runs sockherd from the checkout's .venv"),
]


def processes_under(path: Path) -> list[str]:
    """command lines of live processes that mention path (the servers' runtime
    dirs and logs all live under it)"""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(path) in cmd:
            out.append(f"{pid}: {cmd}")
    return out



def run_script(script: Path, args: list[str], work: Path, timeout: float) -> str:
    """Runs a bench script with TMPDIR=work (its servers' runtime dirs go
    there) and returns its stdout; it must exit 0. Past the timeout it is
    TERMed (it then reaps its servers), killed if that takes too long."""
    p = subprocess.Popen([sys.executable, str(script), *args], cwd=ROOT,
                         env=dict(os.environ, TMPDIR=str(work)), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        try:
            p.communicate(timeout=25)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
        raise
    assert p.returncode == 0, f"{out}\n{err}"
    return out

def test_quick_run_of_every_part_against_two_checkouts(tmp_path):
    rows_file = tmp_path / "rows.json"
    # the servers' runtime dirs go under TMPDIR: short, since a unix socket path
    # has at most 107 bytes (pytest's tmp_path under xdist is deeper than that)
    work = Path(tempfile.mkdtemp(prefix="bbt-", dir="/tmp"))
    try:
        run_and_check(work, rows_file)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_and_check(work: Path, rows_file: Path) -> None:
    out = run_script(SCRIPT, ["--quick", "--only", "sockherd", "--parts", "table,hol,hello",
                              "--checkout", str(ROOT), "--checkout", str(ROOT),
                              "--json", str(rows_file)], work, 120)
    for heading in ("#### table:", "#### head-of-line:", "#### hello:"):
        assert heading in out
    rows = json.loads(rows_file.read_text())
    names = {"sockherd@" + ROOT.name + "#1", "sockherd@" + ROOT.name + "#2"}
    table = [r for r in rows if r["part"] == "table" and r["server"] != "probe"]
    assert {r["server"] for r in table} == names
    assert all(r["requests"] > 0 and r["errors"] == 0 and r["cpu_s"] > 0 for r in table)
    # the sleep bound: a no-server probe per rotation, and the app's own sleeps
    # timed in every row (a 5 ms sleep takes 5 ms or more)
    probes = [r for r in rows if r["part"] == "table" and r["server"] == "probe"]
    assert len(probes) == 1 and probes[0]["sleep_s"] >= 0.005
    assert all(r["sleep_s"] and r["sleep_s"] >= 0.005 for r in table)
    assert "The sleep probe" in out and "vs sleep bound" in out
    hol = [r for r in rows if r["part"] == "hol"]
    assert sorted((r["server"], r["phase"]) for r in hol) == sorted(
        (n, ph) for n in names for ph in ("keep-alive", "new conn"))
    # the slow loops were inside the app while /fast was timed
    assert all(r["n"] >= 1 and r["errors"] == 0 and r["slow_seen"] == 5 for r in hol)
    hello = [r for r in rows if r["part"] == "hello"]
    assert sorted((r["server"], r["threads"]) for r in hello) == sorted(
        (n, t) for n in names for t in (1, 2))
    assert all(r["requests"] > 0 and r["errors"] == 0 for r in hello)
    assert f"req/s / sockherd@{ROOT.name}#1" in out
    assert processes_under(work) == []
