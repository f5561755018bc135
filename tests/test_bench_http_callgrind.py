"""bench/http_callgrind.py (instructions per WSGI hello request under
callgrind, per checkout) runs end to end: one short run of this checkout at
-t 1 (each request sent to an idle worker), its table printed, the ratio to
itself 1.000, a dump kept, and no process left behind. Only the script's
plumbing is pinned down: no count is asserted."""
from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import pytest

from test_bench_blocking_app import processes_under, run_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "http_callgrind.py"
pytestmark = [
    pytest.mark.timeout(330),
    pytest.mark.long,
    pytest.mark.skipif(shutil.which("valgrind") is None or
                       shutil.which("callgrind_control") is None,
                       reason="valgrind not installed"),
    pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "sockherd").exists(),
                       reason="the bench runs sockherd from the checkout's .venv"),
]


def test_short_run_prints_a_count_and_leaves_nothing(tmp_path):
    # runtime dirs under a short TMPDIR: a unix socket path has at most 107 bytes
    work = Path(tempfile.mkdtemp(prefix="hcg-", dir="/tmp"))
    keep = tmp_path / "dumps"
    try:
        out = run_script(SCRIPT, ["--checkout", str(ROOT), "--threads", "1", "--conns", "2",
                                  "--requests", "20", "--warmup", "4", "--keep", str(keep),
                                  "--timeout", "240"], work, 300)
        row = re.search(rf"\| -t 1 \| {re.escape(ROOT.name)} \| ([\d,]+) \| - \| 1\.000 \|", out)
        assert row, out
        assert int(row.group(1).replace(",", "")) > 0
        assert list(keep.glob(f"cg-{ROOT.name}-t1-r1.*")), "no dump kept"
        assert processes_under(work) == []
    finally:
        shutil.rmtree(work, ignore_errors=True)
