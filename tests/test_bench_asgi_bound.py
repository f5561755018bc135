"""bench/asgi_bound.py (the ceiling on issue 22 §5's FastAPI >= 1.3x uvicorn)
runs end to end against real sockherd and uvicorn servers with --quick: every
table is there, the per-request figures are present and sane, the ceiling it
prints is the one its printed inputs give, and no process is left behind.
No figure is compared with an aim: the machine is shared."""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from test_bench_blocking_app import processes_under, run_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "asgi_bound.py"
PEERS = ROOT / "bench" / ".venv-peers" / "bin" / "python"


def perf_works() -> bool:
    if shutil.which("perf") is None:
        return False
    r = subprocess.run(["perf", "stat", "-e", "raw_syscalls:sys_enter,context-switches",
                        "--", "true"], capture_output=True)
    return r.returncode == 0


pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk not installed "
                       "(sh bench/setup_peers.sh)"),
    pytest.mark.skipif(not PEERS.exists(), reason="bench/.venv-peers missing "
                       "(sh bench/setup_peers.sh)"),
    pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "sockherd").exists(),
                       reason="the bench runs sockherd from the checkout's .venv"),
    pytest.mark.skipif(not perf_works(), reason="perf stat with tracepoints not usable here"),
]


def table_rows(out: str, heading: str) -> list[dict]:
    """The markdown table after the heading that starts with `heading`, as
    dicts keyed by its header cells."""
    part = out.split(heading, 1)[1]
    text = part[part.index("\n|"):].strip().split("\n\n", 1)[0].splitlines()
    head = [c.strip() for c in text[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip().strip("*") for c in ln.strip("|").split("|"))))
            for ln in text[2:]]


def test_quick_run_prints_a_ceiling_its_inputs_give(tmp_path):
    rows_file = tmp_path / "rows.json"
    # runtime dirs under TMPDIR: short (a unix socket path has at most 107 bytes)
    work = Path(tempfile.mkdtemp(prefix="bab-", dir="/tmp"))
    try:
        out = run_script(SCRIPT, ["--quick", "--only", "sockherd,uvicorn", "--row-wait", "0",
                                  "--json", str(rows_file)], work, 200)
        assert processes_under(work) == []
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = {r["server"]: r for r in json.loads(rows_file.read_text())}
    assert set(rows) == {"sockherd", "uvicorn"}
    for r in rows.values():
        assert r["requests"] > 0 and r["rps"] > 0
        assert r["status"] + r["connect"] + r["read"] + r["write"] + r["timeout"] == 0
        # the workers run the app: user CPU of tens of µs per request at least
        assert 5 < r["U"] < 5000 and 0 < r["S"] < 5000 and 0 < r["W"] < 5000
        assert r["K"] >= 0 and math.isclose(r["T"], r["U"] + r["S"] + r["W"] + r["K"])
        assert r["box"] > 0 and r["box_user"] > 0 and r["box_sys"] > 0
        # keep-alive without pipelining: a read and a write per request at least,
        # and wrk writes one request at a time
        assert r["perf_requests"] > 0 and not r["perf_note"]
        assert r["srv_reads"] >= 0.9 and r["srv_writes"] >= 0.9
        assert 0.9 <= r["wrk_writes"] <= 1.1
        assert r["srv_syscalls"] >= r["srv_reads"] + r["srv_writes"] - 0.01
    app = rows["sockherd"]["app"]
    assert app["idle"]["procs"] == 1 and app["busy"]["procs"] == 2
    assert all(5 < app[k]["A"] < 5000 for k in ("idle", "busy"))

    for heading in ("#### Rows", "#### Syscalls and context switches", "#### The app alone",
                    "#### The ceiling"):
        assert heading in out
    (c,) = table_rows(out, "#### The ceiling")
    num = {k: float(v) for k, v in c.items() if re.fullmatch(r"[\d.]+", v)}
    # the printed inputs give the printed figures (to their rounding)
    assert num["uvicorn T"] == pytest.approx(rows["uvicorn"]["T"], abs=0.06)
    assert num["sockherd U"] == pytest.approx(rows["sockherd"]["U"], abs=0.06)
    assert num["app alone A (busy)"] == pytest.approx(app["busy"]["A"], abs=0.06)
    assert num["fixed = T - U (ours)"] == pytest.approx(
        num["sockherd T"] - num["sockherd U"], abs=0.11)
    assert num["zero-cost T0 = fixed + A"] == pytest.approx(
        num["fixed = T - U (ours)"] + num["app alone A (busy)"], abs=0.11)
    assert num["ceiling T(uv)/T0"] == pytest.approx(
        num["uvicorn T"] / num["zero-cost T0 = fixed + A"], abs=0.011)
    assert num["U needed for 1.3x"] == pytest.approx(
        num["uvicorn T"] / 1.3 - num["fixed = T - U (ours)"], abs=0.11)
    assert num["measured sockherd/uvicorn req/s"] == pytest.approx(
        rows["sockherd"]["rps"] / rows["uvicorn"]["rps"], abs=0.006)
    assert f"**{num['ceiling T(uv)/T0']:.2f}x uvicorn**" in out
