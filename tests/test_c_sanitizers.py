"""C stress tests of the fd core (tests/c), built with the sanitizers and run.

Each scenario of tests/c/stress_fd (churn, takeover, listener; one and two
thread groups) runs a few seconds with real pthreads, epoll and sockets,
under ThreadSanitizer and under AddressSanitizer + UBSan. A test fails if the
program exits non-zero (its own checks print "FAIL: ..." and abort; its
watchdog aborts on a stuck thread) or if a sanitizer reported anything.

The C program is compiled here, once per sanitizer and per xdist worker,
into a temporary directory, from fdcore/*.c and tests/c/*.c as they are now.

Knobs (environment):
  FDC_STRESS_SECONDS  main-phase duration of each scenario (default 3)
  FDC_STRESS_ITERS    per-thread iteration bound (default: unbounded)
  FDC_STRESS_SEED     seed (default: random, printed on failure)
  FDC_STRESS_GDB=1    on a watchdog abort, print every thread's stack (gdb)
Other options of the program (threads, watchdog, quiescent-point period, ...)
are listed at the top of tests/c/stress_fd.c.
A long stress of one scenario, outside pytest:
  gcc -std=gnu11 -O1 -g -pthread -fsanitize=thread -I fdcore \
      fdcore/fd.c fdcore/updlist.c fdcore/poller.c tests/c/*.c -o /tmp/stress_fd
  FDC_STRESS_SECONDS=600 /tmp/stress_fd takeover -g 2
"""
import os
import platform
import random
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FDCORE = ROOT / "fdcore"
CDIR = ROOT / "tests" / "c"

SECONDS = float(os.environ.get("FDC_STRESS_SECONDS") or 3)
# build + the run + the final checks, with room for a loaded 2-core machine
RUN_TIMEOUT = 120 + 3 * SECONDS

SANITIZERS = {
    "tsan": (
        ["-fsanitize=thread"],
        {"TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1"},
    ),
    "asan": (
        ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"],
        {
            "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1",
            "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
        },
    ),
}
REPORTS = (
    "WARNING: ThreadSanitizer",
    "ERROR: AddressSanitizer",
    "runtime error:",
    "ERROR: LeakSanitizer",
)
# (mode, groups, extra options). "takeover -x 3" adds co-owned fds and send
# re-arming to the takeover paths: the paths of two core bugs this stress
# reproduced (co-owner takeover stranding an entering owner outside
# thread_mask; inherited ACTIVE_W polled by nobody), fixed in e2ee5a5.
SCENARIOS = [
    (mode, groups, extra)
    for mode, extra in (("churn", ()), ("takeover", ()), ("takeover", ("-x", "3")), ("listener", ()))
    for groups in (1, 2)
]
IDS = [f"{m}{'-x' if x else ''}-g{g}" for m, g, x in SCENARIOS]


def _sources():
    # _fdcore.c is cffi's generated wrapper (Python.h), not part of the core
    core = sorted(p for p in FDCORE.glob("*.c") if not p.name.startswith("_"))
    return [str(p) for p in core + sorted(CDIR.glob("*.c"))]


@pytest.fixture(scope="session")
def stress_binary(tmp_path_factory):
    """Returns a builder: sanitizer name -> path of the compiled program."""
    built = {}

    def build(san):
        if san not in built:
            gcc = shutil.which("gcc")
            if gcc is None:
                pytest.fail("gcc not found: the C sanitizer tests need it (make setup installs it)")
            out = tmp_path_factory.mktemp(f"stress-{san}") / "stress_fd"
            flags, _ = SANITIZERS[san]
            cmd = [gcc, "-std=gnu11", "-O1", "-g", "-pthread", "-Wall", *flags,
                   "-I", str(FDCORE), *_sources(), "-o", str(out)]
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
            assert res.returncode == 0, f"build failed:\n{' '.join(cmd)}\n{res.stderr}"
            built[san] = out
        return built[san]

    return build


def _run(argv, env):
    res = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env)
    if "unexpected memory mapping" in res.stderr:
        # TSAN cannot live with some ASLR layouts: run without randomisation
        argv = ["setarch", platform.machine(), "-R", *argv]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env)
    return argv, res


def _stress(binary, san, mode, groups, extra=()):
    """Runs one scenario: (description, CompletedProcess, sanitizer reports)."""
    seed = int(os.environ.get("FDC_STRESS_SEED") or random.randrange(1, 2**32))
    env = dict(os.environ)
    env.update(SANITIZERS[san][1])
    env["FDC_STRESS_SEED"] = str(seed)
    argv = [str(binary), mode, "-t", "4", "-g", str(groups), "-s", str(SECONDS),
            "-r", str(seed), "-d", "20", *extra]
    argv, res = _run(argv, env)
    where = f"{' '.join(argv)} (seed {seed}) exited {res.returncode}"
    return where, res, [r for r in REPORTS if r in res.stderr]


@pytest.mark.sanitizer
@pytest.mark.timeout(RUN_TIMEOUT + 300)
@pytest.mark.parametrize("san", sorted(SANITIZERS))
@pytest.mark.parametrize("mode,groups,extra", SCENARIOS, ids=IDS)
def test_stress_under_sanitizer(stress_binary, san, mode, groups, extra):
    where, res, found = _stress(stress_binary(san), san, mode, groups, extra)
    assert res.returncode == 0 and not found, (
        f"{where}, sanitizer reports {found}\n--- stdout\n{res.stdout[-4000:]}"
        f"\n--- stderr\n{res.stderr[-20000:]}"
    )
    assert f"SUMMARY mode={mode}" in res.stdout, f"{where}: no summary\n{res.stdout}\n{res.stderr}"
