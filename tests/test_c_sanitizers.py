"""C stress tests of the fd core (tests/c), built with the sanitizers and run.

Each scenario of tests/c/stress_fd (churn, takeover, listener, coown, shared;
one and two thread groups) runs a few seconds with real pthreads, epoll and sockets,
under ThreadSanitizer and under AddressSanitizer + UBSan. A test fails if the
program exits non-zero (its own checks print "FAIL: ..." and abort; its
watchdog aborts on a stuck thread) or if a sanitizer reported anything.
Besides, tests/c/repro/repro_walk.c (its own program, one deterministic
interleaving of the shared-list walk, issue 6 bug 2) and
tests/c/repro/shared_affinity.c (a group-shared connection's arrivals go to
its inserting thread while it sleeps, issue 21) must pass under both;
tests/c/repro/repro_shared_insert.c (a sibling's update pass during
fdc_insert_shared, driven by wrapping epoll_ctl) passes since fdcore's
FDC_INSERTING fix (it failed before: the finding it reproduces), and
tests/c/repro/shared_takeover.c (a takeover of a group-shared connection:
refused, else an old owner asleep swallowed the next arrival) since
fdc_takeover refuses FDC_EDGE fds. The out-of-memory repros
(replay_kept_nomem.c, replay_kept_shared_nomem.c, ctl_report_nomem.c:
realloc wrapped at link time) pass since a report that cannot be queued is
listed once per fd in its thread's retry ring and retried with a back-off
(poller_owed.c, retry_later); update_pass_close.c since a close during an
update pass no longer trims the entries the pass walks;
listener_requeue_fail.c since a listener's refused registration (a
requeue's ADD after its DEL) is made again by its thread's later passes.

The C programs are compiled here from fdcore/*.c and tests/c/*.c as they
are now (tests/c/repro/ is not part of the stress program), once per
sanitizer and per test run, shared by the xdist workers and by
tests/test_c_mutations.py's controls (tests/shared_builds.py). tests/test_c_mutations.py
builds the same programs against copies of the core with known bugs put
back, and checks that they fail.

Knobs (environment):
  FDC_STRESS_SECONDS  main-phase duration of each scenario (default 3)
  FDC_STRESS_ITERS    per-thread iteration bound (default: unbounded)
  FDC_STRESS_SEED     seed (default: random, printed on failure)
  FDC_STRESS_GDB=1    on a watchdog abort, print every thread's stack (gdb)
Other options of the program (threads, watchdog, quiescent-point period, ...)
are listed at the top of tests/c/stress_fd.c.
A long stress of one scenario, outside pytest:
  gcc -std=gnu11 -O1 -g -pthread -fsanitize=thread -Wl,--wrap=realloc -I fdcore \
      fdcore/*.c tests/c/*.c -o /tmp/stress_fd
  FDC_STRESS_SECONDS=600 /tmp/stress_fd takeover -g 2
  FDC_STRESS_SECONDS=60 /tmp/stress_fd coown -t 6 -x 3 -b 2
"""
import os
import platform
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from shared_builds import digest

ROOT = Path(__file__).resolve().parent.parent
FDCORE = ROOT / "fdcore"
CDIR = ROOT / "tests" / "c"
REPRO_WALK = CDIR / "repro" / "repro_walk.c"
SHARED_AFFINITY = CDIR / "repro" / "shared_affinity.c"
SHARED_TAKEOVER = CDIR / "repro" / "shared_takeover.c"

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
# (id, mode, groups, extra options). "takeover -x 3" adds co-owned fds and
# send re-arming to the takeover paths: the paths of two core bugs this stress
# reproduced (co-owner takeover stranding an entering owner outside
# thread_mask; inherited ACTIVE_W polled by nobody), fixed in e2ee5a5.
# "coown" (issue 6, bug 1): co-owners entering and leaving one fd while a
# third thread deletes it (-x 1), and an fd taken over back and forth by
# threads that enter it, deleted meanwhile (-x 2); 6 threads on 2 cores, and
# every handler checks the fd is still open and the same incarnation.
COOWN = ("-t", "6")
# "shared" (issue 21): group-shared connections (fdc_insert_shared, exclusive
# edge-triggered in every poller, registered once) handled with dispatch.c's
# inside/missed protocol by 6 threads beside 2 busy loops on 2 cores; every
# byte a writer sends is read once, in order, and none waits unannounced (a
# lost report), through recv pauses and responses that hit EAGAIN. "shared-t3":
# 3 threads and no busy loop, so pollers often sleep and take the writable
# edge of a response in its EAGAIN-to-want_send window (the kept edge's
# replay: FDC_KEPT_W). "shared-nomem": 8 threads and 3 busy loops on 2 cores,
# the core's realloc failing 1 in 2 calls (-m 2, common.c's nomem_point):
# kept-edge replays and failed registrations' reports go through the retry
# ring (poller_owed.c, retry_later) all through the run, and none is lost.
# "listener-epfail" and "shared-epfail": the pollers' epoll_ctl ADD and MOD
# fail 1 in 8 (or 4) in the main phase (-e, common.c's __wrap_epoll_ctl),
# shared-epfail with realloc failing 1 in 2 besides (-m 2): fdc_requeue's
# DEL + ADD and every update pass's registration fail beside everything
# else; each failure must reach an owner as FDC_POLL_CTL (owed, or listed
# in the retry ring, at every quiescent point), polled_mask stay what the
# kernel has, and a failed requeue leave nothing registered and its report
# owed (stress_listener.c, check_requeue). A connection's handler deletes
# what it is told of, as a worker closes it; a listener's does nothing (nor
# does a worker): every owner must poll an ACTIVE listener again, or have
# it listed to register again (poller_owed.c, FDC_RETRY_ADD).
SHARED = ("-t", "6", "-b", "2")
SHARED_T3 = ("-t", "3")
SHARED_NOMEM = ("-t", "8", "-b", "3", "-m", "2")
LISTENER_EPFAIL = ("-e", "8", "-b", "2")
SHARED_EPFAIL = ("-t", "8", "-b", "3", "-m", "2", "-e", "4")
SCENARIOS = [
    (f"{name}-g{groups}", mode, groups, extra)
    for name, mode, extra in (
        ("churn", "churn", ()),
        ("takeover", "takeover", ()),
        ("takeover-x", "takeover", ("-x", "3")),
        ("listener", "listener", ()),
        ("listener-epfail", "listener", LISTENER_EPFAIL),
        ("coown-shared", "coown", ("-x", "1", *COOWN)),
        ("coown-handover", "coown", ("-x", "2", *COOWN)),
        ("shared", "shared", SHARED),
        ("shared-t3", "shared", SHARED_T3),
        ("shared-nomem", "shared", SHARED_NOMEM),
        ("shared-epfail", "shared", SHARED_EPFAIL),
    )
    for groups in (1, 2)
]


def core_sources(core=FDCORE):
    # _fdcore.c is cffi's generated wrapper (Python.h), not part of the core
    return sorted(str(p) for p in Path(core).glob("*.c") if not p.name.startswith("_"))


def stress_sources():
    """The stress program's own files: tests/c/*.c, not tests/c/repro/."""
    return sorted(str(p) for p in CDIR.glob("*.c"))


# the stress program fails the core's realloc (-m) and the pollers'
# epoll_ctl (-e) on purpose (common.c)
STRESS_CFLAGS = ("-Wl,--wrap=realloc,--wrap=epoll_ctl",)


def build_program(out, san, sources, core=FDCORE, cflags=()):
    """Compiles the core in `core` with `sources` into `out`, under sanitizer
    `san` (a SANITIZERS key, or None for a plain -O1 build), with `cflags`
    besides (a -D switch of a test program). Returns out."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc not found: the C sanitizer tests need it (make setup installs it)")
    flags = [*(SANITIZERS[san][0] if san else []), *cflags]
    cmd = [gcc, "-std=gnu11", "-O1", "-g", "-pthread", "-Wall", *flags,
           "-I", str(core), *core_sources(core), *sources, "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, f"build failed:\n{' '.join(cmd)}\n{res.stderr}"
    return out


def san_env(san):
    env = dict(os.environ)
    if san:
        env.update(SANITIZERS[san][1])
    return env


def build_shared(shared_build, name, san, sources, core=FDCORE, cflags=()):
    """build_program's artefact, made once per test run (the conftest's
    shared_build): the same program under the same sanitizer and flags, on
    a core of the same bytes, is compiled by the first test that asks."""
    headers = [*sorted(Path(core).glob("*.h")), *sorted(CDIR.glob("*.h")),
               *sorted((CDIR / "repro").glob("*.h"))]
    key = digest([san or "plain", *cflags], [*core_sources(core), *sources, *headers])
    return shared_build(name, key, lambda out: build_program(out, san, sources, core, cflags))


@pytest.fixture(scope="session")
def stress_binary(shared_build):
    """Returns a builder: sanitizer name -> path of the compiled program."""
    return lambda san: build_shared(shared_build, "stress_fd", san, stress_sources(),
                                    cflags=STRESS_CFLAGS)


def run_program(argv, env, timeout=RUN_TIMEOUT):
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if "unexpected memory mapping" in res.stderr:
        # TSAN cannot live with some ASLR layouts: run without randomisation
        argv = ["setarch", platform.machine(), "-R", *argv]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    return argv, res


def stress_argv(binary, mode, groups, seed, seconds, extra=()):
    return [str(binary), mode, "-t", "4", "-g", str(groups), "-s", str(seconds),
            "-r", str(seed), "-d", "20", *extra]


def _stress(binary, san, mode, groups, extra=()):
    """Runs one scenario: (description, CompletedProcess, sanitizer reports)."""
    seed = int(os.environ.get("FDC_STRESS_SEED") or random.randrange(1, 2**32))
    env = san_env(san)
    env["FDC_STRESS_SEED"] = str(seed)
    argv, res = run_program(stress_argv(binary, mode, groups, seed, SECONDS, extra), env)
    where = f"{' '.join(argv)} (seed {seed}) exited {res.returncode}"
    return where, res, [r for r in REPORTS if r in res.stderr]


@pytest.mark.sanitizer
@pytest.mark.timeout(RUN_TIMEOUT + 300)
@pytest.mark.parametrize("san", sorted(SANITIZERS))
@pytest.mark.parametrize("mode,groups,extra", [s[1:] for s in SCENARIOS],
                         ids=[s[0] for s in SCENARIOS])
def test_stress_under_sanitizer(stress_binary, san, mode, groups, extra):
    where, res, found = _stress(stress_binary(san), san, mode, groups, extra)
    assert res.returncode == 0 and not found, (
        f"{where}, sanitizer reports {found}\n--- stdout\n{res.stdout[-4000:]}"
        f"\n--- stderr\n{res.stderr[-20000:]}"
    )
    assert f"SUMMARY mode={mode}" in res.stdout, f"{where}: no summary\n{res.stdout}\n{res.stderr}"


def assert_repro_passes(shared_build, san, source, cflags=()):
    """Builds one program of tests/c/repro/ (its own main) on the current
    core under `san` and runs it: exit 0 with "OK", no sanitizer report.
    Exit 2 (the interleaving could not be driven) proves nothing."""
    binary = build_shared(shared_build, source.stem, san, [str(source)], cflags=cflags)
    argv, res = run_program([str(binary)], san_env(san), timeout=60)
    assert res.returncode != 2, f"not driven:\n{res.stdout}\n{res.stderr[-4000:]}"
    found = [r for r in REPORTS if r in res.stderr]
    assert res.returncode == 0 and not found and res.stdout.startswith("OK"), (
        f"{' '.join(argv)} exited {res.returncode}, sanitizer reports {found}"
        f"\n--- stdout\n{res.stdout}\n--- stderr\n{res.stderr[-20000:]}"
    )


@pytest.mark.sanitizer
@pytest.mark.timeout(300)
@pytest.mark.parametrize("san", sorted(SANITIZERS))
def test_repro_walk_under_sanitizer(shared_build, san):
    """The walker carried past an update by a removed and re-added entry
    walks again (issue 6, bug 2), driven deterministically with pthreads
    and the step hook: exit 0 and "OK" on the current core."""
    assert_repro_passes(shared_build, san, REPRO_WALK)


@pytest.mark.sanitizer
@pytest.mark.timeout(300)
@pytest.mark.parametrize("san", sorted(SANITIZERS))
def test_shared_affinity_under_sanitizer(shared_build, san):
    """fdc_insert_shared registers the inserting thread first: with it and
    a sibling asleep, each arrival wakes the inserter alone (issue 21)."""
    assert_repro_passes(shared_build, san, SHARED_AFFINITY)


REPRO_SHARED_INSERT = CDIR / "repro" / "repro_shared_insert.c"


@pytest.mark.sanitizer
@pytest.mark.timeout(300)
@pytest.mark.parametrize("san", sorted(SANITIZERS))
def test_repro_shared_insert_under_sanitizer(shared_build, san):
    """A sibling's update pass during fdc_insert_shared (driven by wrapping
    epoll_ctl) must leave a consistent, healthy registration."""
    assert_repro_passes(shared_build, san, REPRO_SHARED_INSERT, cflags=("-Wl,--wrap=epoll_ctl",))


@pytest.mark.sanitizer
@pytest.mark.timeout(300)
@pytest.mark.parametrize("san", sorted(SANITIZERS))
def test_shared_takeover_under_sanitizer(shared_build, san):
    """A takeover of a group-shared connection never leaves an old owner's
    exclusive edge-triggered registration to swallow the new owner's next
    arrival (issue 21 review): fdc_takeover refuses it."""
    assert_repro_passes(shared_build, san, SHARED_TAKEOVER)


REPLAY_KEPT_NOMEM = CDIR / "repro" / "replay_kept_nomem.c"


@pytest.mark.sanitizer
@pytest.mark.timeout(300)
@pytest.mark.parametrize("san", sorted(SANITIZERS))
def test_replay_kept_without_memory_under_sanitizer(shared_build, san):
    """A kept edge's replay that cannot be queued (realloc fails: wrapped
    at link time) is retried by a later update pass, not by the same one
    for ever, and told once memory is back (review of the kept edges,
    finding 2)."""
    assert_repro_passes(shared_build, san, REPLAY_KEPT_NOMEM, cflags=("-Wl,--wrap=realloc",))


REPLAY_KEPT_SHARED_NOMEM = CDIR / "repro" / "replay_kept_shared_nomem.c"


@pytest.mark.sanitizer
@pytest.mark.timeout(300)
@pytest.mark.parametrize("san", sorted(SANITIZERS))
def test_replay_kept_shared_without_memory_under_sanitizer(shared_build, san):
    """The same out-of-memory retry as above, on an fd shared by two
    threads whose other owner sleeps: one retry per fd, never a copy per
    pass until the process traps; retried with a back-off (never a
    wake-up of its own), and replayed within one once memory is back
    (review of fd3c058)."""
    assert_repro_passes(shared_build, san, REPLAY_KEPT_SHARED_NOMEM,
                        cflags=("-Wl,--wrap=realloc",))


CTL_REPORT_NOMEM = CDIR / "repro" / "ctl_report_nomem.c"


@pytest.mark.sanitizer
@pytest.mark.timeout(300)
@pytest.mark.parametrize("san", sorted(SANITIZERS))
def test_ctl_report_without_memory_under_sanitizer(shared_build, san):
    """A failed registration (epoll_ctl wrapped: ENOSPC) whose report
    cannot be queued (realloc wrapped) is reported by a later pass once
    memory is back, never dropped (issue 21, the out-of-memory paths after
    the review of fd3c058)."""
    assert_repro_passes(shared_build, san, CTL_REPORT_NOMEM,
                        cflags=("-Wl,--wrap=epoll_ctl,--wrap=realloc",))


UPDATE_PASS_CLOSE = CDIR / "repro" / "update_pass_close.c"
LISTENER_REQUEUE_FAIL = CDIR / "repro" / "listener_requeue_fail.c"


@pytest.mark.sanitizer
@pytest.mark.timeout(300)
@pytest.mark.parametrize("san", sorted(SANITIZERS))
def test_update_pass_close_under_sanitizer(shared_build, san):
    """A final close on th's thread during th's update pass (a hook's
    delete) leaves th's local list consistent: the pass ends with it
    empty, not at -1 entries (issue 21, th->nbupdt accounting)."""
    assert_repro_passes(shared_build, san, UPDATE_PASS_CLOSE)


@pytest.mark.sanitizer
@pytest.mark.timeout(300)
@pytest.mark.parametrize("san", sorted(SANITIZERS))
def test_listener_requeue_fail_under_sanitizer(shared_build, san):
    """A listener whose requeue's ADD the kernel refused (epoll_ctl
    wrapped: ENOSPC after the DEL) is polled again by its thread: the next
    connection is reported within a second and accepted (the fdstress
    review's finding: the thread never polled it again, and a worker of one
    loop thread accepted nothing more)."""
    assert_repro_passes(shared_build, san, LISTENER_REQUEUE_FAIL,
                        cflags=("-Wl,--wrap=epoll_ctl",))
