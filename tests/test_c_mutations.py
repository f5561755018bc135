"""Mutation check of the C tests: known core bugs put back into a copy of the
core must make the C stress program (tests/c) or the deterministic repro
(tests/c/repro) fail.

For each mutant, fdcore/*.c and *.h are copied into a temporary directory and
the bug is re-injected there by exact textual replacements, each confined to
one function (located by its signature, which must occur exactly once) and
each asserting that its anchor text occurs exactly once in it: a refactor of
the core makes this module fail loudly instead of silently testing an
unmutated core. The program is then built against the copy and run:

* a stress check runs one scenario with a fixed list of seeds, one run after
  the other, and stops at the first failure; it passes if some run failed
  (non-zero exit with "FAIL:" or a sanitizer report, or no exit at all: a
  hang) within BUDGET seconds. The control: the unmutated core, built the
  same way, runs the very same command line (seed included) and must pass.
* the repro check builds tests/c/repro/repro_walk.c under ASAN against the
  copy and expects exit 1 with its "FAIL:" line (2 would mean the
  interleaving could not be driven, which proves nothing). Its control: the
  same program on the unmutated core exits 0 (here, and under both
  sanitizers in tests/test_c_sanitizers.py).

The mutants:
  bug1-*     issue 6, bug 1: release_running decides "last runner" from the
             mask its own clear returned (prev == bit), not from a fresh read
             of running_mask; caught by the coown scenario, both its paths
             (co-owners + delete; takeover back and forth + delete). The
             window is a few instructions: the stress hits it because the
             hook yields at FDC_HK_RELEASE_CLEARED and FDC_HK_ENTER_OWNER
             (without those two hook calls the mutant survives 10 s runs).
  bug2       issue 6, bug 2: fdc_list_remove bumps the group's removal
             counter before the entry is unlinked; caught by repro_walk (the
             stress cannot see a thread sleeping through an update that a
             later wake-up repairs).
  e2ee5a5-*  the two bugs fixed in e2ee5a5, found by the takeover stress:
             a co-owner allowed to take over (strands another owner inside,
             I3); and a still-wanted send not registered for the taker (the
             condition narrowed to ACTIVE_R, which the takeover has just
             cleared, so only a taker that polled the fd before re-registers).
  hupwatch   issue 20's hang-up watch (the TSan failure of seed 3302437362):
             update_fd infers the kind of a recv-side registration (EPOLLIN
             or a hang-up watch alone) from WATCH_HUP in the state it reads,
             instead of th's polled_hup bit: want_recv and stop_hup between
             two passes (a stream connection resuming) leave the watch
             registered without EPOLLIN. Caught by churn, whose pause and
             resume ops make those two calls back to back (the kernel-truth
             and polled-kind checks of common.c).
  shared-*   issue 21, group-shared connections (fdc_insert_shared):
             shared-lt: update_fd leaves EPOLLET out of an FDC_EDGE fd's
             DEL + ADD (a level-triggered registration: correct reads, but
             every loser of dispatch's `inside` spins on the report while
             the winner works); caught by the shared scenario's quiescent
             check of the kernel's interest lists (EPOLLET iff FDC_EDGE).
             shared-no-replay: not a core mutant but the handler protocol
             of tests/c/stress_shared.c built with -DSHARED_NO_REPLAY (the
             winner drops what losers recorded, as dispatch.c would without
             its replay loop); caught by the writer's lost-report check.
             shared-siblings-first: the registrations in thread-id order,
             a sibling's before the inserter's (affinity lost: arrivals go
             to an idle sibling while the inserter waits too); the stress
             cannot tell, tests/c/repro/shared_affinity.c does.
             shared-reregister: the registration before the affinity fix
             (update passes narrow an EDGE fd's registration to the ACTIVE
             directions, each change programmed: DEL + ADD); the stress
             cannot tell, tests/c/repro/shared_affinity.c's rounds after
             a direction change do (round 1).
             shared-drop-kept / shared-drop-kept-send: a report of a
             direction not ACTIVE is dropped instead of kept (FDC_KEPT_*),
             both directions / the send side alone: an edge consumed
             between an EAGAIN (or a recv pause) and the want is lost;
             caught by the writer's lost-report and lost-send-report checks
             of the shared scenario at -t 3 (pollers asleep take the edge).
             The send side's window is made by the handler, not left to
             timing: it waits for the inserter asleep in epoll_wait, drains
             the peer, and holds the window until every other poller passed
             (stress_shared.c, hold_window); with a timed pause instead the
             mutant survived its 60 s twice at load 24-37, now it is caught
             in the first run or two (bench/RESULTS.md, 2026-11-26).
             shared-takeover: fdc_takeover takes a group-shared connection
             (the review finding of issue 21: the old owners' exclusive
             edge-triggered registrations stay, and one asleep swallows the
             new owner's next arrival); tests/c/repro/shared_takeover.c.
             replay-kept-same-pass: the update pass retries what its own
             retries list again (the review of the kept edges, finding 2,
             in today's terms: the retry ring's round re-reads its length
             and goes on past a failure): a kept edge's replay that cannot
             be queued (no memory) is met again by the same pass, for
             ever; tests/c/repro/replay_kept_nomem.c (realloc wrapped at
             link time; its child's alarm).
  nomem-*    the out-of-memory retries of reports (poller_owed.c, retry_later;
             poller_update.c, retry_owed; the review of fd3c058 and the
             look at the other OOM paths after it), each caught by a repro
             with realloc wrapped:
             nomem-update-list: fd3c058's retry, on the update lists (the
             local one inside a pass, with a wake-up of its own): on an
             fd shared with a sleeping sibling both walks re-list it, a
             copy more per pass until local_append's trap;
             tests/c/repro/replay_kept_shared_nomem.c.
             nomem-self-wake: a listed retry wakes its thread (a spin
             while memory is short); the same repro, whose thread must
             never be woken.
             nomem-no-timer: the wait is not bounded by the back-off: a
             thread with nothing else to do sleeps through the return of
             memory; the same repro (a retry during a 300 ms poll, the
             replay well before a 3 s one's end), and ctl_report_nomem.c.
             nomem-no-backoff: the bound never grows (1 ms for ever); the
             same repro (3..20 retries in a 300 ms poll).
             nomem-ctl-dropped: a failed registration's report that cannot
             be queued is dropped (the code before); tests/c/repro/
             ctl_report_nomem.c (epoll_ctl wrapped too).
             Also caught by the shared stress with epoll_ctl and realloc
             failing (-e 4 -m 2): an fd carrying FDC_POLL_CTL that no
             thread owes nor lists at a quiescent point.
             close-trims-walk: a final close during an update pass trims
             an entry the pass walks (the code before): the pass ends
             with nbupdt -1; tests/c/repro/update_pass_close.c.
  requeue-*, update-fail-unreported  failed registrations (the stress's
             -e: epoll_ctl ADD and MOD fail on purpose, common.c), caught
             by the listener scenario: fdc_requeue's failed ADD (after its
             DEL) leaving the polled bit set (requeue-fail-keeps-polled:
             check_requeue reads the kernel's interest list at once), or
             not reported (requeue-fail-unreported: no FDC_POLL_CTL, no
             report owed); an update pass's failure not reported
             (update-fail-unreported: an ACTIVE fd an owner does not poll
             at a quiescent point).
  listener-add-not-retried  the fdstress finding: a listener's refused
             registration (ENOSPC, ENOMEM) reported but never made again
             (the code before): its thread never polls it again; caught by
             tests/c/repro/listener_requeue_fail.c and by the listener
             scenario under -e (an ACTIVE listener an owner neither polls
             nor has listed, at a quiescent point). The real-worker test:
             tests/master/test_listener_polled_after_a_failed_requeue.py.
             Not a mutant: the polled bits set after each ADD instead of
             before. It changes nothing a test can see unless a sibling's
             update pass runs during fdc_insert_shared, i.e. a verb names
             the fd before the insert returns, and then the unmutated core
             fails too (the finding of stress_shared -x 1): see
             tests/c/repro/repro_shared_insert.c.
Not re-injected: the two shared-list hangs of bench/README.md (1, 1b), which
take 10M-300M stress operations to show (minutes to hours); and insert
claiming the entry without its lock bit (408f242, bench/README.md bug 2):
its window has no hook point, and the stress (chaos verbs on every
iteration) did not hit it in 80 s of runs: fdcore_bench repro-insert is its
reproduction.

Knobs: FDC_MUTATION_BUDGET (seconds per stress mutant, default 60).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from test_c_sanitizers import (
    CTL_REPORT_NOMEM, FDCORE, LISTENER_REQUEUE_FAIL, REPLAY_KEPT_NOMEM, REPLAY_KEPT_SHARED_NOMEM, REPORTS, REPRO_WALK,
    SHARED_AFFINITY, SHARED_TAKEOVER, STRESS_CFLAGS, UPDATE_PASS_CLOSE,
    build_program, build_shared, run_program,
    san_env,
    stress_argv, stress_sources,
)
from test_c_sanitizers import stress_binary  # noqa: F401  (a fixture, for clean_stress)

BUDGET = float(os.environ.get("FDC_MUTATION_BUDGET") or 60)
SEEDS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
RUN_SECONDS = 8          # main phase of one stress run (the mutants fail in ~1 s)
STRESS_SAN = "tsan"      # TSAN catches them as fast as a plain build, and races too

pytestmark = [pytest.mark.mutation, pytest.mark.timeout(int(BUDGET) + 240)]


@dataclass(frozen=True)
class Edit:
    file: str                 # in fdcore/
    within: str               # text opening the function (occurs once)
    old: str                  # occurs exactly once in that function
    new: str


@dataclass(frozen=True)
class Mutant:
    what: str
    edits: tuple[Edit, ...]
    cflags: tuple[str, ...] = ()   # a -D switch of the test program itself


RETRY_OWED = "static void retry_owed(struct fdc_thread *th)\n{"
RETRY_LATER = "void retry_later(struct fdc_thread *th, int fd, uint8_t why)\n{"

MUTANTS = {
    "bug1": Mutant(
        "release_running closes when its own clear returned only its bit (stale mask)",
        (
            Edit("fd.c", "static int release_running(struct fdc_thread *th, int fd)\n{",
                 "\tatomic_fetch_and(&e->running_mask, ~bit);\n",
                 "\tuint64_t prev = atomic_fetch_and(&e->running_mask, ~bit);\n"),
            Edit("fd.c", "static int release_running(struct fdc_thread *th, int fd)\n{",
                 "!atomic_load(&e->running_mask) &&",
                 "prev == bit &&"),
        ),
    ),
    "bug2": Mutant(
        "fdc_list_remove bumps the removal counter before unlinking the entry",
        (
            Edit("updlist.c", "void fdc_list_remove(struct fdc_table *t, struct fdc_group *g, int fd)\n{",
                 "\tatomic_fetch_add(&g->epoch, 1);\n", ""),
            Edit("updlist.c", "void fdc_list_remove(struct fdc_table *t, struct fdc_group *g, int fd)\n{",
                 "\tfdc_hook(t, FDC_HK_LIST_UNLINK, -1, fd, 0);\n",
                 "\tatomic_fetch_add(&g->epoch, 1);\n\tfdc_hook(t, FDC_HK_LIST_UNLINK, -1, fd, 0);\n"),
        ),
    ),
    "e2ee5a5-coowner": Mutant(
        "fdc_takeover lets a co-owner take the fd over (no EINVAL refusal)",
        (
            Edit("fd.c", "int fdc_takeover(struct fdc_thread *th, int fd, uint64_t expected_owner)\n{",
                 "\tif ((tmask & bit) && tmask != bit)\n"
                 "\t\treturn release_running(th, fd) == FDC_CLOSED ? -ESTALE : -EINVAL;\n",
                 ""),
        ),
    ),
    "e2ee5a5-send": Mutant(
        "fdc_takeover does not register a still-wanted send for the taker",
        (
            Edit("fd.c", "int fdc_takeover(struct fdc_thread *th, int fd, uint64_t expected_owner)\n{",
                 "if ((st & FDC_WANTED) ||", "if ((st & FDC_ACTIVE_R) ||"),
        ),
    ),
    "hupwatch": Mutant(
        "update_fd guesses a recv registration's kind from WATCH_HUP, not polled_hup",
        (
            Edit("poller_update.c", "static int update_fd(struct fdc_thread *th, int fd)\n{",
                 "\tif ((wr || wh) == pr && wh == ph && ww == ps)\n",
                 "\tif ((wr || wh) == pr && ww == ps && !(pr && (st & FDC_WATCH_HUP)))\n"),
        ),
    ),
    "shared-lt": Mutant(
        "update_fd drops EPOLLET for a group-shared connection (FDC_EDGE): level-triggered",
        (
            Edit("poller_update.c", "static int update_fd(struct fdc_thread *th, int fd)\n{",
                 "((st & FDC_EDGE) ? EPOLLET : 0)", "0"),
        ),
    ),
    "shared-siblings-first": Mutant(
        "fdc_insert_shared registers in thread-id order, a sibling before the inserter",
        (
            Edit("poller_accept.c", "int fdc_insert_shared(struct fdc_thread *th, int fd, uint64_t owner,",
                 "\trest = thread_mask & ~th->ltid_bit;\n"
                 "\tfor (bit = th->ltid_bit; bit; bit = rest & -rest, rest &= rest - 1) {",
                 "\trest = thread_mask;\n"
                 "\tfor (bit = rest & -rest, rest &= rest - 1; bit;"
                 " bit = rest & -rest, rest &= rest - 1) {"),
        ),
    ),
    "shared-reregister": Mutant(
        "a direction change of a group-shared connection re-registers it (DEL + ADD):"
        " the inserter's instance goes behind its siblings'",
        (
            Edit("poller_update.c", "static int update_fd(struct fdc_thread *th, int fd)\n{",
                 "\t\tww = any && (ps || ww);\n\t\twr = any;\n", ""),
            Edit("fd_verbs.c", "static int change_state(struct fdc_thread *th, int fd, uint32_t set,"
                 " uint32_t clr)\n{",
                 "else if (edge_needs_pass(th->t, fd, new, tm)) {", "else if (1) {"),
        ),
    ),
    "shared-drop-kept": Mutant(
        "fdc_poll drops a group-shared connection's report of a direction not ACTIVE"
        " instead of keeping it for the want that comes next",
        (
            Edit("poller.c", "static uint32_t apply_report(struct fdc_entry *e, uint32_t flags)\n{",
                 "\t\tif (old & FDC_EDGE) {", "\t\tif (0) {"),
        ),
    ),
    "shared-drop-kept-send": Mutant(
        "fdc_poll drops a group-shared connection's writable edge while send is not ACTIVE"
        " (an EAGAIN, the edge, then want_send: the response stalls)",
        (
            Edit("poller.c", "static uint32_t apply_report(struct fdc_entry *e, uint32_t flags)\n{",
                 "if ((flags & (FDC_POLL_OUT | FDC_POLL_ERR)) && !(old & FDC_ACTIVE_W))",
                 "if (0)"),
        ),
    ),
    "shared-takeover": Mutant(
        "fdc_takeover takes a group-shared connection (FDC_EDGE) like any fd",
        (
            Edit("fd.c", "int fdc_takeover(struct fdc_thread *th, int fd, uint64_t expected_owner)",
                 "\tif (atomic_load(&e->state) & FDC_EDGE) {", "\tif (0) {"),
        ),
    ),
    "replay-kept-same-pass": Mutant(
        "the update pass retries what its own retries list again: a kept edge's replay"
        " that cannot be queued (no memory) is retried by the pass that meets it, for"
        " ever (the review of the kept edges, finding 2)",
        (
            Edit("poller_update.c", RETRY_OWED,
                 "\tfor (int n = th->nbretry; n > 0; n--) {", "\twhile (th->nbretry > 0) {"),
            Edit("poller_update.c", RETRY_OWED, "\t\t\tbreak;\n", ""),
        ),
    ),
    "nomem-update-list": Mutant(
        "a replay that cannot be queued is retried through the update lists (fd3c058:"
        " th's local list inside a pass, and a wake-up of th)",
        (
            Edit("poller_owed.c", "void fdc_replay_kept(struct fdc_thread *th, int fd, uint32_t kept)\n{",
                 "\tretry_later(th, fd, FDC_RETRY_KEPT);\n",
                 "\tif (th->in_pass) {\n\t\tfdc_program_own_update(th, fd);\n"
                 "\t\tfdc_wake(th->t, th->tid);\n\t\treturn;\n\t}\n"
                 "\tfdc_updt_polling(th, fd, th->tgid);\n"),
        ),
    ),
    "nomem-self-wake": Mutant(
        "a listed retry wakes its own thread (a spin while memory is short)",
        (
            Edit("poller_owed.c", RETRY_LATER, "\tth->nbretry++;\n",
                 "\tth->nbretry++;\n\tfdc_wake(th->t, th->tid);\n"),
        ),
    ),
    "nomem-no-timer": Mutant(
        "the wait is not bounded while retries are listed: memory's return is slept through",
        (
            Edit("poller.c", "static int poll_round(struct fdc_thread *th, int timeout_ms,",
                 "\tif (th->nbretry && (timeout_ms < 0 || timeout_ms > th->retry_ms)) {",
                 "\tif (0) {"),
        ),
    ),
    "nomem-no-backoff": Mutant(
        "the retries' bound never grows: a retry every millisecond while memory is short",
        (
            Edit("poller_update.c", RETRY_OWED,
                 "th->retry_ms * 2 > FDC_RETRY_MAX_MS ?\n"
                 "\t\t\t               FDC_RETRY_MAX_MS : th->retry_ms * 2;",
                 "th->retry_ms;"),
        ),
    ),
    "nomem-ctl-dropped": Mutant(
        "a failed registration's report that cannot be queued (no memory) is dropped",
        (
            Edit("poller_owed.c", "void fail_fd(struct fdc_thread *th, int fd, int err)\n{",
                 "\t\tretry_later(th, fd, FDC_RETRY_CTL);\n", "\t\t;\n"),
        ),
    ),
    "close-trims-walk": Mutant(
        "a final close during an update pass trims an entry the pass walks (nbupdt -1)",
        (
            Edit("fd.c", "static void close_orphan(struct fdc_thread *th, int fd)\n{",
                 "th->nbupdt > th->nbwalk &&", "th->nbupdt &&"),
        ),
    ),
    "requeue-fail-keeps-polled": Mutant(
        "fdc_requeue's failed ADD (after its DEL) leaves th's polled bits set: polled_mask"
        " says registered, the kernel has nothing (I8)",
        (
            Edit("poller_accept.c", "int fdc_requeue(struct fdc_thread *th, int fd)\n{",
                 "\t\tset_polled(pol, bit, 0, 0, 0);\n", ""),
        ),
    ),
    "requeue-fail-unreported": Mutant(
        "fdc_requeue's failed DEL or ADD is not reported (no FDC_POLL_CTL): th no longer polls"
        " the listener and nobody is told (I8)",
        (
            Edit("poller_accept.c", "int fdc_requeue(struct fdc_thread *th, int fd)\n{",
                 "\t\tfail_fd(th, fd, err);\n", ""),
        ),
    ),
    "update-fail-unreported": Mutant(
        "an update pass's failed epoll_ctl is not reported (no FDC_POLL_CTL): the owner waits"
        " for events that never come (I8)",
        (
            Edit("poller_update.c", "static int update_fd(struct fdc_thread *th, int fd)\n{",
                 "\t\tfail_fd(th, fd, err);\n", ""),
        ),
    ),
    "listener-add-not-retried": Mutant(
        "a listener's registration refused for want of resources (a requeue's ADD after its"
        " DEL) is reported but never made again: its thread polls it no more (fdstress)",
        (
            Edit("poller_owed.c", "void fail_fd(struct fdc_thread *th, int fd, int err)\n{",
                 "\t\tretry_later(th, fd, FDC_RETRY_ADD);\n", "\t\t;\n"),
        ),
    ),
    "shared-no-replay": Mutant(
        "the handler of a shared connection drops the reports others recorded meanwhile"
        " (stress_shared.c built with -DSHARED_NO_REPLAY: dispatch.c's replay left out)",
        (),
        ("-DSHARED_NO_REPLAY",),
    ),
}

# (case id, mutant, mode, groups, extra options of stress_fd)
STRESS_CASES = [
    ("bug1-shared", "bug1", "coown", 1, ("-x", "1", "-t", "6")),
    ("bug1-handover", "bug1", "coown", 1, ("-x", "2", "-t", "6")),
    # takeover -x 1 catches it too, in 4 of 10 runs of 10 s: coown -x 3
    # (co-owned fds taken over by non-owners, entered by 6 threads) always
    ("e2ee5a5-coowner", "e2ee5a5-coowner", "coown", 1, ("-x", "3", "-t", "6")),
    ("e2ee5a5-send", "e2ee5a5-send", "takeover", 1, ("-x", "2")),
    ("hupwatch", "hupwatch", "churn", 1, ()),
    # issue 21: caught by the quiescent check of the kernel's registrations
    # (EPOLLET iff FDC_EDGE) once a send flip made a pass DEL + ADD it
    ("shared-lt", "shared-lt", "shared", 1, ("-t", "6", "-b", "2")),
    # caught by the writer: a burst nobody reads within the lost-report delay
    ("shared-no-replay", "shared-no-replay", "shared", 1, ("-t", "6", "-b", "2")),
    # caught by the writer: a burst, or a response, that nobody goes on with
    ("shared-drop-kept", "shared-drop-kept", "shared", 1, ("-t", "3")),
    ("shared-drop-kept-send", "shared-drop-kept-send", "shared", 1, ("-t", "3")),
    # failed registrations (-e: epoll_ctl wrapped, common.c): fdc_requeue's
    # promises checked against the kernel right after each failed requeue
    # (stress_listener.c, check_requeue); a failure nobody is told of is
    # an ACTIVE fd an owner does not poll at a quiescent point, or one
    # carrying FDC_POLL_CTL that no thread owes nor lists
    ("requeue-fail-keeps-polled", "requeue-fail-keeps-polled", "listener", 1, ("-e", "8", "-b", "2")),
    ("requeue-fail-unreported", "requeue-fail-unreported", "listener", 1, ("-e", "8", "-b", "2")),
    ("update-fail-unreported", "update-fail-unreported", "listener", 1, ("-e", "8", "-b", "2")),
    ("nomem-ctl-dropped-stress", "nomem-ctl-dropped", "shared", 1,
     ("-t", "8", "-b", "3", "-m", "2", "-e", "4")),
    # the fdstress finding: a listener an owner neither polls nor has
    # listed to register again, at a quiescent point
    ("listener-add-not-retried", "listener-add-not-retried", "listener", 1,
     ("-e", "8", "-b", "2")),
]


def function_span(text: str, opening: str, where: str) -> tuple[int, int]:
    """Start and end of the function whose definition begins with `opening`
    (which must occur exactly once): up to the first line that is "}"."""
    n = text.count(opening)
    assert n == 1, f"{where}: the function opening {opening!r} occurs {n} times, expected once"
    start = text.index(opening)
    end = text.find("\n}\n", start)
    assert end > start, f"{where}: no end found for {opening!r}"
    return start, end + 3


def mutate(dst: Path, mutant: Mutant) -> None:
    """Copies the core into dst and applies the mutant's edits there."""
    dst.mkdir(parents=True, exist_ok=True)
    for p in sorted(FDCORE.glob("*.c")) + sorted(FDCORE.glob("*.h")):
        shutil.copy2(p, dst / p.name)
    for ed in mutant.edits:
        path = dst / ed.file
        text = path.read_text()
        where = f"fdcore/{ed.file}"
        start, end = function_span(text, ed.within, where)
        body = text[start:end]
        n = body.count(ed.old)
        assert n == 1, (
            f"{where}: anchor {ed.old!r} occurs {n} times in {ed.within.splitlines()[0]!r}, "
            "expected once: the core changed, update the mutant")
        path.write_text(text[:start] + body.replace(ed.old, ed.new) + text[end:])
    for name in {ed.file for ed in mutant.edits}:
        assert (dst / name).read_text() != (FDCORE / name).read_text(), f"{name} not mutated"


def test_mutants_apply(tmp_path):
    """Every mutant's anchors are still in the core (fast, no build)."""
    for name, mutant in MUTANTS.items():
        mutate(tmp_path / name, mutant)


@pytest.fixture(scope="module")
def clean_stress(stress_binary):
    """The stress program on the unmutated core (the control's build: the
    one tests/test_c_sanitizers.py runs, compiled once per test run)."""
    return stress_binary(STRESS_SAN)


def failure(res: subprocess.CompletedProcess | None) -> str | None:
    """What made a run fail, or None if it passed."""
    if res is None:
        return "hang (no exit)"
    found = [r for r in (*REPORTS, "ERROR: ThreadSanitizer") if r in res.stderr]
    if res.returncode != 0 and found:
        return f"exit {res.returncode}, {found[0]}"
    if res.returncode != 0 and "FAIL:" in res.stderr:
        line = next(ln for ln in res.stderr.splitlines() if "FAIL:" in ln)
        return f"exit {res.returncode}: {line[line.index('FAIL:'):][:300]}"
    return None


def run_bounded(argv, env, timeout):
    try:
        return run_program(argv, env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return argv, None


@pytest.mark.long
@pytest.mark.parametrize("case,mutant,mode,groups,extra", STRESS_CASES,
                         ids=[c[0] for c in STRESS_CASES])
def test_stress_catches_mutant(tmp_path, clean_stress, case, mutant, mode, groups, extra):
    mutate(tmp_path / "core", MUTANTS[mutant])
    binary = build_program(tmp_path / "stress_fd", STRESS_SAN, stress_sources(),
                           core=tmp_path / "core", cflags=(*STRESS_CFLAGS, *MUTANTS[mutant].cflags))
    env = san_env(STRESS_SAN)
    env.pop("FDC_STRESS_SEED", None)
    env.pop("FDC_STRESS_SECONDS", None)
    env.pop("FDC_STRESS_ITERS", None)
    t0 = time.monotonic()
    tried = []
    caught = None
    for seed in SEEDS:
        left = BUDGET - (time.monotonic() - t0)
        if left <= 1:
            break
        argv = stress_argv(binary, mode, groups, seed, min(RUN_SECONDS, left), extra)
        # the run's own watchdog (-d 20) reports a hang; this timeout only
        # bounds a program that cannot even do that
        argv, res = run_bounded(argv, env, timeout=left + 40)
        why = failure(res)
        tried.append((seed, round(time.monotonic() - t0, 1), why))
        if why:
            caught = (seed, argv, why)
            break
        assert res.returncode == 0, (
            f"{' '.join(argv)}: exit {res.returncode} without FAIL or sanitizer report\n"
            f"{res.stdout[-2000:]}\n{res.stderr[-4000:]}")
    elapsed = time.monotonic() - t0
    assert caught, (
        f"mutant {mutant} ({MUTANTS[mutant].what}) survived {elapsed:.0f} s of "
        f"'{mode} {' '.join(extra)}' runs: {tried}")
    seed, argv, why = caught
    print(f"{case}: caught after {elapsed:.1f} s (seed {seed}, run {len(tried)}): {why}")

    # control: the very same command on the unmutated core passes
    cargv = [str(clean_stress), *argv[argv.index(str(binary)) + 1:]]
    cargv, res = run_bounded(cargv, env, timeout=RUN_SECONDS + 120)
    assert failure(res) is None and res.returncode == 0, (
        f"control failed on the unmutated core: {' '.join(cargv)}: {failure(res)}\n"
        f"{res.stdout[-2000:] if res else ''}\n{res.stderr[-8000:] if res else ''}")


def assert_repro_catches(tmp_path, shared_build, mutant: str, source: Path, fail_line: str,
                         cflags: tuple[str, ...] = ()) -> None:
    """A tests/c/repro/ program built under ASAN against the mutant exits 1
    with fail_line (on either stream); the control, on the unmutated core,
    exits 0 with OK. cflags: the program's own (a link-time wrap)."""
    mutate(tmp_path / "core", MUTANTS[mutant])
    binary = build_program(tmp_path / source.stem, "asan", [str(source)],
                           core=tmp_path / "core", cflags=cflags)
    t0 = time.monotonic()
    argv, res = run_bounded([str(binary)], san_env("asan"), timeout=60)
    assert res is not None, f"{source.stem} hung on mutant {mutant}"
    assert res.returncode == 1 and fail_line in res.stdout + res.stderr, (
        f"{source.stem} on mutant {mutant} should exit 1 with its FAIL line: exit "
        f"{res.returncode}\n{res.stdout}\n{res.stderr[-8000:]}")
    print(f"{mutant}: caught by {source.stem} in {time.monotonic() - t0:.2f} s")

    # control (also tests/test_c_sanitizers.py, whose build this is): the
    # unmutated core passes
    clean = build_shared(shared_build, source.stem, "asan", [str(source)], cflags=cflags)
    argv, res = run_bounded([str(clean)], san_env("asan"), timeout=60)
    assert res is not None and res.returncode == 0 and res.stdout.startswith("OK"), (
        f"control: {source.stem} on the unmutated core: {res and res.returncode}\n"
        f"{res and res.stdout}\n{res and res.stderr[-8000:]}")


def test_repro_walk_catches_bug2(tmp_path, shared_build):
    assert_repro_catches(tmp_path, shared_build, "bug2", REPRO_WALK,
                         "FAIL: W's update pass ended with its update bit on B")


def test_shared_affinity_catches_siblings_first(tmp_path, shared_build):
    """Issue 21's affinity: a sibling registered before the inserting thread
    gets the arrivals while both sleep (the stress cannot see who was
    first; tests/c/repro/shared_affinity.c can)."""
    assert_repro_catches(tmp_path, shared_build, "shared-siblings-first", SHARED_AFFINITY,
                         "FAIL: inserter T1 round 0")


def test_shared_affinity_catches_reregistration(tmp_path, shared_build):
    """The affinity fix: a direction change (a response larger than the
    socket buffer) re-registering the inserter's exclusive entry puts it
    behind its sibling's, and the next arrival goes to the sibling while
    both sleep (round 1, after the first changes)."""
    assert_repro_catches(tmp_path, shared_build, "shared-reregister", SHARED_AFFINITY,
                         "FAIL: inserter T1 round 1")


def test_shared_takeover_catches_a_taken_shared_fd(tmp_path, shared_build):
    """A takeover of a group-shared connection leaves an old owner's
    registration to swallow the next arrival (issue 21 review)."""
    assert_repro_catches(tmp_path, shared_build, "shared-takeover", SHARED_TAKEOVER,
                         "FAIL: the new owner T2 never heard of the arrival")


def test_replay_kept_nomem_catches_a_retry_in_the_same_pass(tmp_path, shared_build):
    """A kept edge's replay that cannot be queued is retried by the next
    update pass, never by the one that met it (tests/c/repro/
    replay_kept_nomem.c: the pass never ends, and its child's alarm kills
    it; before the retry ring, it died on local_append's trap)."""
    assert_repro_catches(tmp_path, shared_build, "replay-kept-same-pass", REPLAY_KEPT_NOMEM,
                         "FAIL: the update pass with the replay unqueueable died",
                         cflags=("-Wl,--wrap=realloc",))


WRAP_REALLOC = ("-Wl,--wrap=realloc",)


@pytest.mark.parametrize("mutant,fail_line", [
    ("nomem-update-list", "FAIL: A died (signal 4)"),
    ("nomem-self-wake", "FAIL: A woke itself"),
    ("nomem-no-timer", "FAIL: a 300 ms poll while memory is short"),
    ("nomem-no-backoff", "FAIL: a 300 ms poll while memory is short"),
])
def test_replay_kept_shared_nomem_catches(tmp_path, shared_build, mutant, fail_line):
    """The out-of-memory retry of a kept edge on an fd shared with a
    sleeping sibling (review of fd3c058): listed once, retried with a
    back-off, never a wake-up of its own, replayed once memory is back
    (tests/c/repro/replay_kept_shared_nomem.c)."""
    assert_repro_catches(tmp_path, shared_build, mutant, REPLAY_KEPT_SHARED_NOMEM, fail_line,
                         cflags=WRAP_REALLOC)


@pytest.mark.parametrize("mutant", ["nomem-ctl-dropped", "nomem-no-timer"])
def test_ctl_report_nomem_catches(tmp_path, shared_build, mutant):
    """A failed registration's report that found no memory is told once
    memory is back, within a back-off (tests/c/repro/ctl_report_nomem.c)."""
    assert_repro_catches(tmp_path, shared_build, mutant, CTL_REPORT_NOMEM,
                         "FAIL: the failed registration's report",
                         cflags=("-Wl,--wrap=epoll_ctl,--wrap=realloc",))


def test_update_pass_close_catches_a_trim_under_the_walk(tmp_path, shared_build):
    """A close during an update pass must not trim the entries the pass
    walks (tests/c/repro/update_pass_close.c)."""
    assert_repro_catches(tmp_path, shared_build, "close-trims-walk", UPDATE_PASS_CLOSE,
                         "FAIL: the pass that closed Y")


def test_listener_requeue_fail_catches_a_listener_never_registered_again(tmp_path, shared_build):
    """A listener whose requeue's ADD was refused must be polled again by
    its thread (the fdstress finding; tests/c/repro/listener_requeue_fail.c)."""
    assert_repro_catches(tmp_path, shared_build, "listener-add-not-retried", LISTENER_REQUEUE_FAIL,
                         "FAIL: after its failed requeue, the listener was never polled again",
                         cflags=("-Wl,--wrap=epoll_ctl",))
