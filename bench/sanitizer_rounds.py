"""Rounds of the fd core's C stress (tests/c, stress_fd) under ThreadSanitizer
and AddressSanitizer + UBSan, beside busy loops: every scenario of
tests/test_c_sanitizers.py (SCENARIOS), ROUNDS times each, with a fresh
random seed per run, more threads than cores (-t 6 where a scenario asks for
fewer) and two `yes` processes running the whole time, so the workers are
preempted anywhere in the protocols (the suite runs each scenario once).

    .venv/bin/python bench/sanitizer_rounds.py [ROUNDS] [SECONDS]

ROUNDS (default 2) and SECONDS, each run's main phase (default 2). Prints a
line per run (sanitizer, round, scenario, seed, exit code, time); a failed
run's command and output go to /tmp/sanitizer_rounds/fail_*.txt (the seed
in it replays it). Exits 1 if any run failed."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from test_c_sanitizers import (REPORTS, SANITIZERS, SCENARIOS, STRESS_CFLAGS,  # noqa: E402
                               build_program, stress_sources)

OUT = Path("/tmp/sanitizer_rounds")


def run_one(binary: Path, san: str, sid: str, mode: str, groups: int, extra: list[str],
            secs: str) -> tuple[bool, str]:
    seed = str(random.getrandbits(31))
    if "-t" not in extra:
        extra = [*extra, "-t", "6"]
    # TSAN cannot live with some ASLR layouts (test_c_sanitizers.run_program)
    argv = ["setarch", os.uname().machine, "-R", str(binary), mode, "-g", str(groups), "-s", secs,
            "-r", seed, *extra]
    env = {**os.environ, **SANITIZERS[san][1]}
    start = time.monotonic()
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
        rc, out = res.returncode, res.stdout + res.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = "timeout", f"{exc.stdout}{exc.stderr}"
    reports = [r for r in REPORTS if r in out]
    bad = rc != 0 or bool(reports) or "FAIL" in out
    if bad:
        (OUT / f"fail_{san}_{sid}_{seed}.txt").write_text(" ".join(argv) + "\n" + out)
    line = f"{san} {sid} seed={seed} rc={rc} {time.monotonic() - start:.1f}s"
    return bad, line + (f" REPORTS={reports}" if reports else "") + (" FAILED" if bad else "")


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    secs = sys.argv[2] if len(sys.argv) > 2 else "2"
    OUT.mkdir(exist_ok=True)
    binaries = {san: build_program(OUT / f"stress_{san}", san, stress_sources(),
                                   cflags=STRESS_CFLAGS) for san in ("tsan", "asan")}
    busy = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(2)]
    runs = failed = 0
    try:
        for r in range(rounds):
            for san, binary in binaries.items():
                for sid, mode, groups, extra in SCENARIOS:
                    bad, line = run_one(binary, san, sid, mode, groups, list(extra), secs)
                    runs += 1
                    failed += bad
                    print(f"r{r} {line}", flush=True)
    finally:
        for b in busy:
            b.kill()
            b.wait()
    print(f"sanitizer_rounds: {runs} runs, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
