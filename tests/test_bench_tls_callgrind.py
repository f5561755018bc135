"""bench/tls_callgrind.py (instructions per full TLS handshake under
callgrind, per checkout) runs end to end: one short run of this checkout,
its table printed with a count and the ratio to itself 1.000, a dump kept,
and no process left behind. Only the script's plumbing is pinned down: no
count is asserted."""
from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import pytest

from test_bench_blocking_app import processes_under, run_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "tls_callgrind.py"
pytestmark = [
    pytest.mark.timeout(330),
    pytest.mark.long,
    pytest.mark.skipif(shutil.which("valgrind") is None or
                       shutil.which("callgrind_control") is None or
                       shutil.which("gcc") is None or shutil.which("openssl") is None,
                       reason="valgrind, gcc or the openssl CLI not installed"),
    pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "sockherd").exists(),
                       reason="the bench runs sockherd from the checkout's .venv"),
]


def test_short_run_prints_a_count_and_leaves_nothing(tmp_path):
    # runtime dirs under a short TMPDIR: a unix socket path has at most 107 bytes
    work = Path(tempfile.mkdtemp(prefix="tcg-", dir="/tmp"))
    keep = tmp_path / "dumps"
    try:
        out = run_script(SCRIPT, ["--checkout", str(ROOT), "--seconds", "4", "--key", "ec256",
                                  "--keep", str(keep), "--timeout", "240"], work, 300)
        row = re.search(rf"\| {re.escape(ROOT.name)}#1 \| ([\d,]+) \| (\d+) \| 1\.000 \|", out)
        assert row, out
        assert int(row.group(1).replace(",", "")) > 0 and int(row.group(2)) > 0
        assert list(keep.glob(f"cg-{ROOT.name}_1.*")), "no dump kept"
        assert processes_under(work) == []
    finally:
        shutil.rmtree(work, ignore_errors=True)
