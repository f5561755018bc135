"""Adversarial review of the issue 6 fixes (fdcore): the interleavings and
inputs tried against release_running's fresh read, the shared-list walk and
its removal counter, the failed-epoll_ctl policy and insert's probe.

Findings (each test failed on the core of 54a05e0, where they were strict
xfails, and passes since the fixes that followed; only the finding's own
check raises AssertionError, a broken set-up raises RuntimeError):
  1. fdc_list_remove bumps the removal counter after the store that marks the
     entry out. Between the two the entry can be re-added at the tail; a
     walker standing on it follows it there, skips what lay between, reads
     the counter before the bump and does not walk again. The hooks cannot
     stop a thread inside that window, so this one test builds the core (the
     C sources as they are) with every atomic_fetch_add routed through a
     function that can stall one thread right before the counter's bump.
  2. An EXCLUSIVE fd changes directions by DEL + ADD: a DEL answered ENOENT
     (the number was closed behind the table's back) is followed by an ADD
     whose success erases the error, so a stranger's file is registered
     under our incarnation and nobody is told: the "MOD/ENOENT never re-ADDs"
     rule does not hold on the exclusive path.
  3. A failed registration queued on a thread that then loses the fd to a
     takeover is dropped by report_failed (not an owner), and the sticky
     POLL_CTL bit keeps the new owner's own failure from ever being queued:
     an fd wanted and registered nowhere, reported to nobody.
  4. report_failed only runs with room left in the batch: while epoll fills
     every batch (max_events ready fds), a pending report waits for ever.
  5. insert's probe refuses only regular files and directories: a character
     device without a poll method (/dev/null) is accepted, and its ADD fails
     later with EPERM.
  6. A failed report merged into an event of the same batch goes through
     apply_report, which replaces the state's last IN/PRI/OUT: the state then
     forgets the IN this very batch reported.
  7. The final close sets SO_LINGER 0 on a LINGER_RISK fd even when it is
     CLONED: the socket lives on in its other holder, whose close then
     resets the connection (the reason insert refuses DISOWN|LINGER_RISK).

The rest are interleavings that held, kept as regression guards (hook
points not covered by the model checker of test_fd_interleavings.py:
RELEASE_CLEARED, ENTER_OWNER, WALK_ARRIVE; and the failed-report list).
"""
from __future__ import annotations

import errno
import os
import shutil
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from sockherd.fdcore import Hook, Outcome, State

from fd_harness import (
    swapped_with_old_file_readable,
    EPOLLEXCLUSIVE,
    EPOLLIN,
    OWNER,
    Harness,
    assert_closed_once,
    is_closed,
    joined,
    kernel_events,
    run_thread,
)

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
CTL_ERR = State.POLL_ERR | State.POLL_CTL


def require(cond, msg: str) -> None:
    """A precondition of the scenario (not the finding): RuntimeError, so a
    broken set-up never passes as an expected failure."""
    if not cond:
        raise RuntimeError(f"scenario set-up: {msg}")


def regular_file(tmp_path: Path, name: str = "plain") -> int:
    path = tmp_path / name
    path.write_bytes(b"x")
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def turn_into_regular_file(fd: int, tmp_path: Path, name: str = "plain") -> None:
    """Behind the table's back, the number now holds a regular file: any
    ADD of it fails with EPERM (how these tests make epoll_ctl fail)."""
    f = regular_file(tmp_path, name)
    os.dup2(f, fd)
    os.close(f)


def closer_tids(h: Harness, fd: int) -> list[int]:
    return [tid for p, tid, f, _g in h.log if p == Hook.CLOSE_END and f == fd]


# =============================================================================
# Findings
# =============================================================================

# ---- finding 1: the walk's counter moves after the entry can be re-added ------

INSTR_H = r"""
/* force-included before every source: each atomic_fetch_add first calls
 * instr_rmw(object), so the driver can stall one thread right before one
 * read-modify-write of one object (the group's removal counter) */
#include <stdatomic.h>
extern void instr_rmw(volatile void *obj);
#undef atomic_fetch_add
#define atomic_fetch_add(PTR, VAL) \
	(instr_rmw((volatile void *)(PTR)), __atomic_fetch_add((PTR), (VAL), __ATOMIC_SEQ_CST))
"""

WALK_DRIVER_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fd-int.h"

enum { W = 0, R = 1, S = 2 };   /* walker, remover, re-arming non-owner */

static struct fdc_table *T;
static int A, B;
static sem_t w_on_a, go_w, w_done, r_at_bump, go_r, r_done, s_done;
static atomic_int stall_w = 1, stall_r = 1;
static _Thread_local int is_r;

void instr_rmw(volatile void *obj)
{
	if (is_r && T && obj == (volatile void *)&T->groups[1].epoch &&
	    atomic_exchange(&stall_r, 0)) {
		sem_post(&r_at_bump);
		sem_wait(&go_r);
	}
}

static void hook(void *arg, int point, int tid, int fd, uint32_t gen)
{
	(void)arg; (void)gen;
	if (point == FDC_HK_WALK_ARRIVE && tid == W && fd == A && atomic_exchange(&stall_w, 0)) {
		sem_post(&w_on_a);
		sem_wait(&go_w);
	}
}

static void *w_main(void *x) { fdc_update_pass(fdc_thread(T, W)); sem_post(&w_done); return x; }
static void *r_main(void *x) { is_r = 1; fdc_update_pass(fdc_thread(T, R)); sem_post(&r_done); return x; }
static void *s_main(void *x) { fdc_want_send(fdc_thread(T, S), A); sem_post(&s_done); return x; }

static int waited(sem_t *sem, int ms)   /* 1 if posted within ms */
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	while (sem_timedwait(sem, &ts) < 0)
		if (errno != EINTR)
			return 0;
	return 1;
}

static int pair_fd(void)
{
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
		perror("SETUP: socketpair");
		exit(2);
	}
	return sv[0];
}

static void check(int rc, const char *what)
{
	if (rc < 0) {
		fprintf(stderr, "SETUP: %s failed: %d\n", what, rc);
		exit(2);
	}
}

int main(void)
{
	struct fdc_fdinfo ib;
	pthread_t w, r, s;
	int err, r_stalled, a_locked, ms, s_finished, w_first;

	alarm(30);
	sem_init(&w_on_a, 0, 0); sem_init(&go_w, 0, 0); sem_init(&w_done, 0, 0);
	sem_init(&r_at_bump, 0, 0); sem_init(&go_r, 0, 0); sem_init(&r_done, 0, 0);
	sem_init(&s_done, 0, 0);
	T = fdc_table_new(4096, 3, 1, &err);
	if (!T)
		check(err, "table");
	A = pair_fd();
	B = pair_fd();
	check(fdc_insert(T, A, 1, 0, 1, 1u << R, 0), "insert A");   /* A: updates for R */
	check(fdc_insert(T, B, 2, 0, 1, 1u << W, 0), "insert B");   /* B: updates for W */
	check(fdc_want_recv(fdc_thread(T, S), A), "want A");        /* by a non-owner: */
	check(fdc_want_recv(fdc_thread(T, S), B), "want B");        /* the shared list */
	if (atomic_load(&T->groups[1].first) != A || !fdc_in_shared_list(T, B)) {
		fprintf(stderr, "SETUP: the shared list is not A, B\n");
		return 2;
	}
	fdc_set_hook(T, hook, NULL);

	/* W reads the counter, then `first` (A), and stops on A */
	pthread_create(&w, NULL, w_main, NULL);
	if (!waited(&w_on_a, 5000)) {
		fprintf(stderr, "SETUP: W never arrived on A\n");
		return 2;
	}
	/* R consumes its update of A, which leaves the list; R stops right
	 * before its first bump of the removal counter */
	pthread_create(&r, NULL, r_main, NULL);
	r_stalled = waited(&r_at_bump, 5000);
	/* A core that bumps while A is still locked makes S and W wait for R
	 * here (short waits, then R goes on); otherwise nothing can block them,
	 * so wait for them as long as a loaded machine may need. */
	a_locked = r_stalled && fdc_lnext(atomic_load(&T->fdtab[A].links)) == FDC_LIST_LOCKED;
	ms = a_locked ? 300 : 10000;
	/* S re-arms A for R: back on the list, at the tail, behind B */
	pthread_create(&s, NULL, s_main, NULL);
	s_finished = waited(&s_done, ms);
	/* W steps on from A */
	sem_post(&go_w);
	w_first = waited(&w_done, ms);
	/* R bumps the counter and finishes */
	sem_post(&go_r);
	if (!w_first && !waited(&w_done, 10000)) {
		fprintf(stderr, "STUCK: W's pass never ended\n");
		return 3;
	}
	if (!waited(&r_done, 10000) || (!s_finished && !waited(&s_done, 10000))) {
		fprintf(stderr, "STUCK: R's pass or S's want_send never ended\n");
		return 3;
	}
	pthread_join(w, NULL); pthread_join(r, NULL); pthread_join(s, NULL);
	fdc_dump(T, B, &ib);
	printf("r_stalled_before_bump=%d a_locked_then=%d a_readded_meanwhile=%d "
	       "w_done_before_bump=%d b_update_mask=%#llx\n", r_stalled, a_locked, s_finished,
	       w_first, (unsigned long long)ib.update_mask);
	if (ib.update_mask & (1u << W)) {
		printf("SKIPPED: W's update pass ended with B's update for W unconsumed\n");
		return 1;
	}
	return 0;
}
"""


def test_finding1_walker_carried_past_by_a_re_add_before_the_counter_moves(tmp_path):
    """Group of 3: W walks, R removes the head A while W stands on it, S
    re-arms A (re-added at the tail, behind B, which holds W's update) while
    R is between its `links = out` store and its bump of the counter. W steps
    from A to the tail, ends its walk, reads the counter unchanged and stops:
    B's update is skipped, and W would sleep through it (the wake-up that
    announced B was consumed by the wait that led to this pass).
    The fix that makes this pass: bump the counter after the unlink but
    before the store that marks the entry out (the entry is still locked
    then, so nobody can re-add it, and a walker standing on it waits)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not found (the C sanitizer tests need it too)")
    (tmp_path / "instr.h").write_text(INSTR_H)
    (tmp_path / "driver.c").write_text(WALK_DRIVER_C)
    core = sorted(str(p) for p in (ROOT / "fdcore").glob("*.c") if not p.name.startswith("_"))
    exe = tmp_path / "walk_driver"
    cmd = [gcc, "-std=gnu11", "-O1", "-g", "-pthread", "-Wall",
           "-include", str(tmp_path / "instr.h"), "-I", str(ROOT / "fdcore"),
           *core, str(tmp_path / "driver.c"), "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    require(res.returncode == 0, f"build failed:\n{' '.join(cmd)}\n{res.stderr}")
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    require(res.returncode in (0, 1), f"driver exited {res.returncode}\n{res.stdout}{res.stderr}")
    assert res.returncode == 0, res.stdout


# ---- finding 2: the EXCLUSIVE path re-ADDs after DEL/ENOENT ------------------


def test_finding2_exclusive_del_enoent_then_add_registers_a_strangers_file(make):
    h = make(1, 1)
    fd, _ = h.pair()
    h.insert(fd, exclusive=True)
    th = h.th[0]
    th.want_recv(fd)
    th.update_pass()
    require(kernel_events(th.epfd, fd) & EPOLLEXCLUSIVE, "exclusive registration")
    stranger, peer = socket.socketpair()
    h.keep(peer)
    os.dup2(stranger.fileno(), fd)          # our file's last reference goes
    stranger.close()
    require(kernel_events(th.epfd, fd) is None, "the kernel dropped our registration")
    th.want_send(fd)                        # exclusive: DEL (ENOENT) + ADD
    evs = th.poll(0)
    try:
        # the rule of ctl(): the registration is gone and the number holds
        # another file, never re-ADD it; tell the owner
        assert kernel_events(th.epfd, fd) is None, "a stranger's file was registered"
        assert [(e.fd, e.events & CTL_ERR) for e in evs] == [(fd, CTL_ERR)]
        info = h.t.dump(fd)
        assert info.ctl_errno == errno.ENOENT
        assert (info.polled_recv, info.polled_send) == (0, 0)
    finally:
        th.leave_all()


# ---- finding 3: a pending report is lost to a takeover -----------------------


def test_finding3_failed_report_lost_when_the_fd_is_taken_over(make, tmp_path):
    """Thread 0's ADD fails (think ENOSPC at max_user_watches); before its
    next poll, thread 1 takes the idle fd over and wants recv: its ADD fails
    too. Nobody is ever told: thread 0 drops the queued report (not an owner
    any more), thread 1's failure is not queued (POLL_CTL already set)."""
    h = make(2, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b01)
    turn_into_regular_file(fd, tmp_path)
    h.th[0].want_recv(fd)
    h.th[0].update_pass()                       # ADD -> EPERM, queued on thread 0
    require(h.t.dump(fd).state & State.POLL_CTL, "thread 0's ADD failed")
    require(h.th[1].takeover(fd, OWNER) is True, "takeover")
    h.th[1].want_recv(fd)                       # the new owner wants it
    require(h.th[0].poll(0) == [], "thread 0 is no owner: no report to it")
    h.th[0].leave_all()
    seen = []
    for _ in range(3):
        seen += [(e.fd, e.events & CTL_ERR) for e in h.th[1].poll(0)]
        h.th[1].leave_all()
    info = h.t.dump(fd)
    require(info.state & State.ACTIVE_R and info.polled_recv == 0, "wanted, polled by nobody")
    assert (fd, CTL_ERR) in seen, "an fd wanted and registered nowhere, reported to nobody"


# ---- finding 4: a pending report starves behind full batches -----------------


def test_finding4_failed_report_starves_behind_full_batches(make, tmp_path):
    h = make(1, 1)
    th = h.th[0]
    busy, peer = h.pair()
    peer.send(b"never read")                    # level-triggered: every poll
    h.insert(busy)
    th.want_recv(busy)
    bad, _ = h.pair()
    h.insert(bad)
    turn_into_regular_file(bad, tmp_path)
    th.want_recv(bad)                           # its ADD fails: a report is due
    seen = []
    for _ in range(8):
        seen += [(e.fd, e.events & CTL_ERR) for e in th.poll(0, max_events=1)]
        th.leave_all()
    require((busy, 0) in seen, "the busy fd is reported")
    require(h.t.dump(bad).ctl_errno == errno.EPERM, "the ADD failed")
    assert (bad, CTL_ERR) in seen, "8 polls, the failed registration never reported"


# ---- finding 5: insert's probe and character devices -------------------------


def test_finding5_insert_accepts_a_device_epoll_cannot_poll(make):
    h = make(1, 1)
    null = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    try:
        h.insert(null)
    except OSError as exc:
        os.close(null)
        assert exc.errno == errno.EPERM
        return
    # inserted: the table owns (and at teardown closes) it; its ADD fails
    h.th[0].want_recv(null)
    evs = h.th[0].poll(0)
    h.th[0].leave_all()
    require([(e.fd, e.events & CTL_ERR) for e in evs] == [(null, CTL_ERR)], "the ADD failed")
    assert False, "insert accepted /dev/null, which epoll refuses (EPERM)"


# ---- finding 6: a merged report erases the batch's IN from the state ---------


def test_finding6_merged_report_keeps_the_batch_report_in_state(make):
    """The fd's old file stays open elsewhere (so its registration lives on
    and reports IN) while the number is swapped: the MOD of the pass fails
    ENOENT, the same poll reports IN for the same incarnation, the failure
    is merged into that event. The event says IN|ERR|CTL; the state's last
    poll report must say IN too."""
    h = make(1, 1)
    th = h.th[0]
    fd = swapped_with_old_file_readable(h, th)
    th.want_send(fd)                            # MOD -> ENOENT, merged below
    evs = th.poll(0)
    try:
        require([(e.fd, e.events) for e in evs] == [(fd, State.POLL_IN | CTL_ERR)],
                f"one merged event, got {evs}")
        assert h.t.dump(fd).state & State.POLL_IN, "the state forgot this batch's IN"
    finally:
        th.leave_all()


# ---- finding 7: LINGER_RISK on a CLONED fd resets another holder's socket -----


def test_finding7_linger_risk_on_a_cloned_fd_does_not_reset_the_other_holder(make):
    """insert refuses DISOWN|LINGER_RISK because "a reset there would hit
    whatever the owner does with it next"; a CLONED fd is the same case (the
    file description is open elsewhere: dup, fork, SCM_RIGHTS, and every
    listener is CLONED by default), yet the close still sets SO_LINGER 0 on
    it, so the other holder's graceful close becomes an abortive one."""
    h = make(1, 1)
    srv = h.keep(socket.create_server(("127.0.0.1", 0)))
    cli = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept()
    h.keep(conn)
    fd = cli.detach()
    other = h.keep_fd(os.dup(fd))               # e.g. passed to another process
    try:
        h.insert(fd, cloned=True, linger_risk=True)
    except OSError as exc:                      # refusing the combination is a fix too
        os.close(fd)
        assert exc.errno == errno.EINVAL
        return
    require(h.th[0].delete(fd) is True, "closed now")
    probe = socket.socket(fileno=os.dup(other))
    try:
        onoff, secs = struct.unpack("ii", probe.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, 8))
    finally:
        probe.close()
    assert (onoff, secs) != (1, 0), "the other holder's socket now resets on close"


# =============================================================================
# Interleavings that held: regression guards
# =============================================================================

# ---- release_running's fresh read (RELEASE_CLEARED) ---------------------------


def test_release_cleared_takeover_alone_leaver_migrates(make):
    """The owner leaves; between its clear and its read of thread_mask the
    idle fd is taken over. No delete: the leaver must neither close nor keep
    its registration, and the taker owns the fd alone."""
    h = make(2, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b01)
    h.th[0].want_recv(fd)
    h.th[0].update_pass()
    out, gen = h.th[0].enter(fd)
    assert out == Outcome.DONE
    took = []
    h.at(Hook.RELEASE_CLEARED, lambda *a: took.append(h.th[1].takeover(fd, OWNER)), tid=0, fd=fd)
    assert h.th[0].leave(fd, gen) == Outcome.MIGRATED
    assert took == [True]
    info = h.t.dump(fd)
    assert (info.thread_mask, info.running_mask) == (0b10, 0)
    assert not info.state & State.MUST_CLOSE and not is_closed(fd)
    assert h.closes(fd, gen) == 0
    h.th[0].update_pass()                       # the old owner drops its registration
    assert kernel_events(h.th[0].epfd, fd) is None
    assert h.t.dump(fd).polled_recv == 0
    assert h.th[1].delete(fd) is True
    assert_closed_once(h, fd, gen)


def test_release_cleared_co_owner_in_and_out_then_local_delete(make):
    """Co-owned by C and X: C leaves; in its window X enters and leaves, then
    D (same group, real thread) deletes and, alone, closes (its close waits
    for C's reference). C then reads thread_mask 0 and running 0 but the
    token is gone: C must not close a second time."""
    C, X, D = 0, 1, 2
    h = make(3, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=(1 << C) | (1 << X))
    _, gen = h.th[C].enter(fd)
    closing = threading.Event()
    box: dict = {}
    h.at(Hook.CLOSE_BEGIN, lambda *a: closing.set(), tid=D, fd=fd)

    def window(*_):
        out, g = h.th[X].enter(fd)
        assert out == Outcome.DONE
        assert h.th[X].leave(fd, g) == Outcome.DONE
        box["d"] = run_thread(h.th[D].delete, fd)
        assert closing.wait(10), "D did not start the close"

    h.at(Hook.RELEASE_CLEARED, window, tid=C, fd=fd)
    assert h.th[C].leave(fd, gen) == Outcome.MIGRATED
    assert joined(*box["d"]) is True
    assert_closed_once(h, fd, gen)
    assert closer_tids(h, fd) == [D]


def test_delete_release_cleared_runner_leaves_and_closes(make):
    """D deletes while X is inside; between D's clear and D's read, X leaves
    (real thread): X reads running 0, wins the token and closes (waiting for
    D's reference); D then also reads 0 and must back off."""
    D, X = 0, 1
    h = make(2, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b11)
    _, gen = h.th[X].enter(fd)
    closing = threading.Event()
    box: dict = {}
    h.at(Hook.CLOSE_BEGIN, lambda *a: closing.set(), tid=X, fd=fd)

    def window(*_):
        box["x"] = run_thread(h.th[X].leave, fd, gen)
        assert closing.wait(10), "X did not start the close"

    h.at(Hook.RELEASE_CLEARED, window, tid=D, fd=fd)
    assert h.th[D].delete(fd) is False
    assert joined(*box["x"]) == Outcome.CLOSED
    assert_closed_once(h, fd, gen)
    assert closer_tids(h, fd) == [X]


@pytest.mark.parametrize("deleter", [1, 3], ids=["same-group", "other-group"])
def test_enter_owner_window_delete_closes_entering_thread_migrates(make, deleter):
    """C passed its owner check but has not OR'ed its running bit when the fd
    is deleted by a thread that sees nobody inside and closes (real thread:
    the close waits for C's reference). C then ORs, finds thread_mask 0 and
    leaves without closing and without a stranded bit."""
    h = make(4, 2)
    fd, _ = h.pair()
    h.insert(fd, mask=0b11)
    gen = h.t.dump(fd).generation
    closing = threading.Event()
    box: dict = {}
    h.at(Hook.CLOSE_BEGIN, lambda *a: closing.set(), tid=deleter, fd=fd)

    def window(*_):
        box["d"] = run_thread(h.th[deleter].delete, fd)
        assert closing.wait(10), "the delete did not start the close"

    h.at(Hook.ENTER_OWNER, window, tid=0, fd=fd)
    assert h.th[0].enter(fd)[0] == Outcome.MIGRATED
    assert joined(*box["d"]) is True
    assert closer_tids(h, fd) == [deleter]
    for th in h.th:                             # a stale local entry: harmless
        th.update_pass()
    assert_closed_once(h, fd, gen)


def test_enter_owner_window_takeover_then_taker_inside(make):
    """C passed its owner check; X takes the fd over and enters before C ORs
    its bit. C must leave MIGRATED and leave X's running bit alone."""
    h = make(2, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b01)
    box: dict = {}

    def window(*_):
        assert h.th[1].takeover(fd, OWNER) is True
        box["x"] = h.th[1].enter(fd)

    h.at(Hook.ENTER_OWNER, window, tid=0, fd=fd)
    assert h.th[0].enter(fd)[0] == Outcome.MIGRATED
    out, gen = box["x"]
    assert out == Outcome.DONE
    info = h.t.dump(fd)
    assert (info.thread_mask, info.running_mask) == (0b10, 0b10)
    assert h.th[1].leave(fd, gen) == Outcome.DONE
    assert not is_closed(fd) and h.closes(fd, gen) == 0


# ---- the shared-list walk ------------------------------------------------------


def test_walker_on_removed_entry_follows_its_remembered_successor(make):
    """W stands on the head A; R's pass removes A (R's update consumed, not
    re-armed) before W steps: W goes on to A's remembered successor B and
    consumes B's update in the same pass."""
    W, R, S = 0, 1, 2
    h = make(3, 1)
    a, _ = h.pair()
    b, _ = h.pair()
    h.insert(a, mask=1 << R)
    h.insert(b, mask=1 << W)
    h.th[S].want_recv(a)
    h.th[S].want_recv(b)
    h.at(Hook.WALK_ARRIVE, lambda *x: h.th[R].update_pass(), tid=W, fd=a)
    h.th[W].update_pass()
    ia, ib = h.t.dump(a), h.t.dump(b)
    assert not ia.in_shared_list and ia.update_mask == 0 and ia.polled_recv == 1 << R
    assert not ib.in_shared_list and ib.update_mask == 0 and ib.polled_recv == 1 << W
    assert kernel_events(h.th[W].epfd, b) & EPOLLIN
    assert kernel_events(h.th[R].epfd, a) & EPOLLIN


# ---- the failed-report list ------------------------------------------------------


def test_failed_report_of_a_closed_incarnation_dropped_new_one_reported(make, tmp_path):
    """Thread 0 queues a failure for incarnation G, which is closed before
    any poll; the number is reused, inserted (G+1) and fails too. One poll:
    G's entry is dropped (stale), G+1 is reported once, nothing is held
    twice and no running bit is left behind."""
    h = make(1, 1)
    th = h.th[0]
    fd, _ = h.pair()
    h.insert(fd)
    gen = h.t.dump(fd).generation
    turn_into_regular_file(fd, tmp_path, "one")
    th.want_recv(fd)
    th.update_pass()                            # failure queued for gen
    assert th.delete(fd) is True
    h.reuse(fd)
    h.insert(fd)
    assert h.t.dump(fd).generation == gen + 1
    assert not h.t.dump(fd).state & State.POLL_CTL
    turn_into_regular_file(fd, tmp_path, "two")
    th.want_recv(fd)
    evs = th.poll(5000)
    assert [(e.fd, e.events, e.gen) for e in evs] == [(fd, CTL_ERR, gen + 1)]
    assert h.t.dump(fd).running_mask == 1
    assert th.leave_all() == 0
    assert h.t.dump(fd).running_mask == 0
    assert th.poll(0) == []                     # once per incarnation


def test_failed_report_of_a_reused_number_that_did_not_fail_is_dropped(make, tmp_path):
    """The failure of G is queued; G is closed, the number reused and
    inserted again (G+1), whose registration works: no report at all."""
    h = make(1, 1)
    th = h.th[0]
    fd, _ = h.pair()
    h.insert(fd)
    turn_into_regular_file(fd, tmp_path)
    th.want_recv(fd)
    th.update_pass()
    assert th.delete(fd) is True
    h.reuse(fd)
    h.insert(fd)
    th.want_recv(fd)
    assert th.poll(0) == []
    info = h.t.dump(fd)
    assert info.running_mask == 0 and not info.state & (State.POLL_CTL | State.ERR)
    assert info.polled_recv == 1 and kernel_events(th.epfd, fd) & EPOLLIN


def test_failed_reports_with_a_batch_of_one_each_once_without_blocking(make, tmp_path):
    """Two failed fds, batches of one event: each poll returns at once with
    one report (max == cnt after the first), each fd reported exactly once,
    then the poll is quiet."""
    h = make(1, 1)
    th = h.th[0]
    fds = []
    for i in range(2):
        fd, _ = h.pair()
        h.insert(fd)
        turn_into_regular_file(fd, tmp_path, f"f{i}")
        th.want_recv(fd)
        fds.append(fd)
    seen = []
    for _ in range(2):
        t0 = time.monotonic()
        evs = th.poll(5000, max_events=1)
        assert time.monotonic() - t0 < 2.0, "slept with a report pending"
        assert len(evs) == 1 and evs[0].events == CTL_ERR
        seen.append(evs[0].fd)
        th.leave_all()
    assert sorted(seen) == sorted(fds)
    assert th.poll(0) == []
    assert all(h.t.dump(fd).running_mask == 0 for fd in fds)


def test_failed_report_merged_into_the_batch_is_held_and_left_once(make):
    """Finding 6's scenario, what holds: the failure is merged into the
    event of the same incarnation (one event, not two enters), and leaving
    the batch drops the one running bit."""
    h = make(1, 1)
    th = h.th[0]
    fd = swapped_with_old_file_readable(h, th)
    th.want_send(fd)
    evs = th.poll(0)
    assert [(e.fd, e.events) for e in evs] == [(fd, State.POLL_IN | CTL_ERR)]
    assert h.t.dump(fd).running_mask == 1
    assert th.leave_all() == 0
    info = h.t.dump(fd)
    assert info.running_mask == 0 and info.ctl_errno == errno.ENOENT
    assert th.counters()["ctl_err"] == 1


def test_failed_report_not_delivered_to_a_thread_no_longer_owner(make, tmp_path):
    """Finding 3's scenario, what holds: the thread that failed and lost the
    fd to a takeover gets no report, holds nothing, and has its own (empty)
    registration settled."""
    h = make(2, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b01)
    turn_into_regular_file(fd, tmp_path)
    h.th[0].want_recv(fd)
    h.th[0].update_pass()
    assert h.th[1].takeover(fd, OWNER) is True
    assert h.th[0].poll(0) == []
    info = h.t.dump(fd)
    assert (info.running_mask, info.thread_mask) == (0, 0b10)
    assert (info.polled_recv, info.polled_send) == (0, 0)
    assert kernel_events(h.th[0].epfd, fd) is None
