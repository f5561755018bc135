"""The races named by HAProxy's fd seeds, each as a deterministic interleaving
of thread contexts of the native core (plus a few real-thread variants).

A context is not an OS thread: the test drives contexts 0, 1, 2 step by step,
and the table's hooks run another context's step exactly in the middle of a
protocol (e.g. inside an enter, right after its running bit was OR'ed). A hook
never triggers the final close of the fd its caller holds a reference on.
"""
from __future__ import annotations

import errno
import os
import socket
import threading
import time

import pytest

from sockherd.fdcore import Hook, Outcome, State

from fd_harness import (
    OWNER,
    EPOLLIN,
    EPOLLOUT,
    Harness,
    joined,
    run_thread,
    is_closed,
    epoll_regs,
    kernel_events,
    assert_clean,
    assert_closed_once,
)

pytestmark = pytest.mark.timeout(60)

# ---- helpers -----------------------------------------------------------------


def listener(h: Harness) -> tuple[int, tuple]:
    srv = socket.create_server(("127.0.0.1", 0), backlog=64)
    srv.setblocking(False)
    name = srv.getsockname()
    return srv.detach(), name


# ---- 1. seed 002: delete never waits for runners ---------------------------------


def test_seed002_delete_under_lock_while_handler_inside(make):
    h = make(2, 1)
    lfd, name = listener(h)
    h.insert(lfd, mask=0b11)
    h.th[0].want_recv(lfd)
    for th in h.th:
        th.update_pass()
    out, gen = h.th[1].enter(lfd)              # context 1 is inside its accept handler
    assert out == Outcome.DONE
    listener_lock = threading.Lock()
    with listener_lock:                        # unbind_listener(): lock(listener)
        t0 = time.monotonic()
        assert h.th[0].delete(lfd) is False    # deferred, never waits on running_mask
        assert time.monotonic() - t0 < 1.0
        i = h.t.dump(lfd)
        assert i.thread_mask == 0 and i.running_mask == 0b10 and i.tgid == 1
        assert i.state & State.MUST_CLOSE
        assert not is_closed(lfd) and h.closes(lfd, gen) == 0
        # nobody new gets in: an orphan only programs DELs
        assert h.th[0].enter(lfd)[0] == Outcome.MIGRATED
    # the handler now gets the listener lock and finishes
    assert listener_lock.acquire(blocking=False)
    listener_lock.release()
    assert h.th[1].leave(lfd, gen) == Outcome.CLOSED
    assert_closed_once(h, lfd, gen)
    assert h.count(Hook.CLOSE_END, tid=1) == 1
    for th in h.th:
        assert kernel_events(th.epfd, lfd) is None
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(name, timeout=2).close()


def test_seed002_foreign_group_delete_while_inside(make):
    h = make(4, 2)
    fd, _ = h.pair()
    h.insert(fd, tgid=1, mask=0b11)
    out, gen = h.th[0].enter(fd)
    assert h.th[3].delete(fd) is False         # another group: no running bit to vote with
    i = h.t.dump(fd)
    assert i.thread_mask == 0 and i.running_mask == 0b01 and i.state & State.MUST_CLOSE
    assert h.th[1].enter(fd)[0] == Outcome.MIGRATED
    assert h.th[0].leave(fd, gen) == Outcome.CLOSED
    assert_closed_once(h, fd, gen)


def test_seed002_handler_deletes_while_another_handler_inside(make):
    h = make(2, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b11)
    _, g0 = h.th[0].enter(fd)
    _, g1 = h.th[1].enter(fd)
    assert h.th[0].delete(fd) is False         # drops context 0's running bit too
    assert h.t.dump(fd).running_mask == 0b10
    assert h.th[0].leave(fd, g0) == Outcome.CLOSED   # "our own delete already dropped it"
    assert h.closes(fd, g0) == 0 and not is_closed(fd)
    assert h.th[1].leave(fd, g1) == Outcome.CLOSED
    assert_closed_once(h, fd, g1)


def test_seed002_real_threads_no_deadlock(make):
    """Thread A polls the listener, takes the event (running bit) and then
    needs the listener lock; thread B holds that lock and deletes the fd."""
    h = make(2, 1)
    lfd, name = listener(h)
    h.insert(lfd, mask=0b11)
    h.th[0].want_recv(lfd)
    h.th[0].update_pass()
    listener_lock = threading.Lock()
    entered = threading.Event()
    cli = h.keep(socket.create_connection(name))

    def thread_a():
        th = h.th[1]
        deadline = time.monotonic() + 10
        evs = []
        while not evs and time.monotonic() < deadline:
            evs = th.poll(100)
        assert [e.fd for e in evs] == [lfd]
        entered.set()
        with listener_lock:                    # listener_accept(): lock(listener)
            conns = th.accept(lfd)
        for c in conns:
            os.close(c)
        return len(conns), th.leave(lfd, evs[0].gen)

    def thread_b():
        with listener_lock:                    # unbind_listener(): lock(listener)
            locked.set()
            assert entered.wait(10)
            time.sleep(0.05)                   # A is (about to be) blocked on the lock
            return h.th[0].delete(lfd)

    locked = threading.Event()
    tb, boxb = run_thread(thread_b)
    assert locked.wait(10)
    ta, boxa = run_thread(thread_a)
    assert joined(tb, boxb) is False
    assert joined(ta, boxa) == (1, Outcome.CLOSED)
    assert_closed_once(h, lfd, 0)
    assert h.count(Hook.CLOSE_END, tid=1) == 1
    del cli


# ---- 2. seed 003: takeover against the poller ------------------------------------


@pytest.mark.parametrize("via", ["enter", "poll"])
def test_seed003_takeover_before_old_owner_enters(make, via):
    h = make(3, 1)
    fd, peer = h.pair()
    h.insert(fd, mask=0b001)
    h.th[0].want_recv(fd)
    h.th[0].update_pass()
    peer.send(b"x")                      # the kernel has a report for thread 0 now
    assert h.th[2].takeover(fd, OWNER) is True
    skip0 = h.th[0].counters()["poll_skip_fd"]
    if via == "enter":
        assert h.th[0].enter(fd)[0] == Outcome.MIGRATED
    else:
        assert h.th[0].poll(1000) == []  # the late report is not delivered
        assert h.th[0].counters()["poll_io"] == 1
    assert h.th[0].counters()["poll_skip_fd"] == skip0 + 1
    assert h.count(Hook.ENTER_RUNNING, tid=0) == 0
    i = h.t.dump(fd)
    assert i.running_mask == 0 and i.update_mask & 0b001 and i.thread_mask == 0b100
    assert h.th[0].update_pass() == 1    # the DEL
    assert h.t.dump(fd).polled_recv == 0
    assert kernel_events(h.th[0].epfd, fd) is None
    assert h.th[0].poll(0) == []
    # the new owner re-arms and gets the data
    h.th[2].want_recv(fd)
    evs = h.th[2].poll(1000)
    assert [e.fd for e in evs] == [fd]
    assert h.th[2].leave(fd, evs[0].gen) == Outcome.DONE


def test_seed003_aba_takeover_right_after_running_bit(make):
    """cd8914bc5: the poller ORs its running bit *before* validating, so a
    takeover attempted right then fails its CAS 0 -> bit."""
    h = make(3, 1)
    fd, peer = h.pair()
    h.insert(fd, mask=0b001)
    h.th[0].want_recv(fd)
    h.th[0].update_pass()
    peer.send(b"x")
    tried = []

    def steal(tid, f, gen):
        assert h.t.dump(fd).running_mask == 0b001
        tried.append(h.th[2].takeover(fd, OWNER))

    h.at(Hook.ENTER_RUNNING, steal, tid=0, fd=fd)
    evs = h.th[0].poll(1000)
    assert tried == [False]
    assert [(e.fd, e.gen) for e in evs] == [(fd, 0)]
    i = h.t.dump(fd)
    assert i.thread_mask == 0b001 and i.running_mask == 0b001 and i.nb_takeover == 0
    assert i.state & State.ACTIVE_R                   # a failed takeover stops nothing
    assert h.th[2].counters()["fd_takeover"] == 0
    assert h.count(Hook.TAKEOVER_OWNED) == 0 and h.count(Hook.ENTER_RETRY) == 0
    assert h.th[0].leave(fd, 0) == Outcome.DONE
    assert h.th[2].takeover(fd, OWNER) is True       # once idle it works


def test_seed003_enter_during_takeover_retries_then_migrated(make):
    """The old owner's poller reaches the fd while the taker holds it (running
    == taker bit, thread_mask not yet moved): its running bit lies outside
    thread_mask, it spins in the consistency loop, and leaves MIGRATED once
    the takeover stored the new thread_mask."""
    h = make(3, 1)
    fd, peer = h.pair()
    h.insert(fd, mask=0b001)
    h.th[0].want_recv(fd)
    h.th[0].update_pass()
    retrying = threading.Event()
    h.at(Hook.ENTER_RETRY, lambda *a: retrying.set(), tid=0, fd=fd, once=False)
    box: dict = {}

    def in_takeover(tid, f, gen):
        assert h.t.dump(fd).running_mask == 0b100
        box["t"] = run_thread(h.th[0].enter, fd)
        assert retrying.wait(10), "old owner never reached the consistency loop"
        i = h.t.dump(fd)
        assert i.running_mask == 0b101 and i.thread_mask == 0b001

    h.at(Hook.TAKEOVER_OWNED, in_takeover, tid=2, fd=fd)
    assert h.th[2].takeover(fd, OWNER) is True
    out, _ = joined(*box["t"])
    assert out == Outcome.MIGRATED
    i = h.t.dump(fd)
    assert i.thread_mask == 0b100 and i.running_mask == 0 and i.nb_takeover == 1
    assert i.update_mask & 0b001                 # old owner programmed its DEL
    assert h.th[0].update_pass() == 1
    assert kernel_events(h.th[0].epfd, fd) is None and h.t.dump(fd).polled_recv == 0
    assert h.closes(fd, 0) == 0


def test_takeover_by_co_owner_vs_entering_owner(make):
    """Regression (found by this test): a co-owner's running bit lies inside
    thread_mask, so another owner entering during its takeover passed the
    consistency loop, and the takeover then narrowed thread_mask under it (I3).
    A co-owner's takeover is now refused (EINVAL) and the runner stays an owner."""
    h = make(2, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b11)
    seen = []
    h.at(Hook.TAKEOVER_OWNED, lambda *a: seen.append(h.th[1].enter(fd)), tid=0, fd=fd)
    with pytest.raises(OSError) as ei:
        h.th[0].takeover(fd, OWNER)
    assert ei.value.errno == errno.EINVAL
    assert len(seen) == 1 and seen[0][0] == Outcome.DONE
    i = h.t.dump(fd)
    assert i.thread_mask == 0b11 and i.running_mask == 0b10 and i.nb_takeover == 0
    assert h.th[1].leave(fd, seen[0][1]) == Outcome.DONE
    assert h.t.dump(fd).running_mask == 0


def test_co_owner_takeover_refused_vs_delete(make):
    """The refused co-owner takeover still votes as a runner: a delete landing
    while it holds its running bit is completed by it."""
    h = make(2, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b11)
    res = []
    h.at(Hook.TAKEOVER_OWNED, lambda *a: res.append(h.th[1].delete(fd)), tid=0, fd=fd)
    # orphaned under it: no longer a co-owner, the CAS loses, it closes: ESTALE
    assert h.th[0].takeover(fd, OWNER) is False
    assert res == [False]
    assert_closed_once(h, fd, 0)
    assert h.count(Hook.CLOSE_END, tid=0) == 1


def test_takeover_vs_delete_in_takeover_owned(make):
    """A delete while the taker holds the fd: the takeover's thread_mask CAS
    loses against the orphan, and the taker, last runner, closes."""
    h = make(4, 2)
    fd, _ = h.pair()
    h.insert(fd, mask=0b01)
    res = []
    h.at(Hook.TAKEOVER_OWNED, lambda *a: res.append(h.th[0].delete(fd)), tid=1, fd=fd)
    assert h.th[1].takeover(fd, OWNER) is False
    assert res == [False]
    assert_closed_once(h, fd, 0)
    assert h.count(Hook.CLOSE_END, tid=1) == 1
    assert h.th[1].counters()["fd_takeover"] == 0


def test_takeover_vs_foreign_delete_in_takeover_owned(make):
    h = make(4, 2)
    fd, _ = h.pair()
    h.insert(fd, mask=0b01)
    res = []
    h.at(Hook.TAKEOVER_OWNED, lambda *a: res.append(h.th[2].delete(fd)), tid=1, fd=fd)
    assert h.th[1].takeover(fd, OWNER) is False
    assert res == [False]
    assert_closed_once(h, fd, 0)
    assert h.count(Hook.CLOSE_END, tid=1) == 1


# ---- 3. two threads both believing they are last -----------------------------------


@pytest.mark.parametrize("late", [0, 1, 2], ids=["closer-itself", "same-group", "other-group"])
def test_both_last_must_close_is_one_shot(make, late):
    """Context 0 leaves last and wins MUST_CLOSE; right when its close starts
    (CLOSE_BEGIN: tgid not yet reset) another delete of the same incarnation
    also sees no runner left. The one-shot token makes it back off."""
    h = make(4, 2)
    fd, _ = h.pair()
    h.insert(fd, mask=0b11)
    out, gen = h.th[0].enter(fd)
    assert h.th[3].delete(fd) is False              # orphaned by another group, deferred
    res = []

    def late_delete(tid, f, g):
        assert h.t.dump(fd).running_mask == 0      # nobody left inside
        res.append(h.th[late].delete(fd))

    h.at(Hook.CLOSE_BEGIN, late_delete, fd=fd)
    assert h.th[0].leave(fd, gen) == Outcome.CLOSED
    assert res == [False]
    assert_closed_once(h, fd, gen)
    assert h.count(Hook.CLOSE_END, tid=0) == 1
    # a stale local-list entry may remain with the late deleter: harmless
    for th in h.th:
        th.update_pass()
    assert_closed_once(h, fd, gen)


def test_enter_in_close_begin_turned_away(make):
    h = make(2, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b11)
    res = []
    h.at(Hook.CLOSE_BEGIN, lambda *a: res.append(h.th[1].enter(fd)[0]), fd=fd)
    h.at(Hook.CLOSE_DRAINED, lambda *a: res.append(h.th[1].enter(fd)[0]), fd=fd)
    assert h.th[0].delete(fd) is True
    assert res == [Outcome.MIGRATED, Outcome.CLOSED]
    assert_closed_once(h, fd, 0)


@pytest.mark.parametrize("a,b,expect", [
    (0, 0, (False, False)),      # the same context twice
    (0, 2, (False, False)),      # same group, then another group
    (2, 3, (False, False)),      # two contexts of another group
    (0, 1, (False, True)),       # then the runner itself deletes: its bit goes, it closes
    (1, 0, (True, "EBADF")),     # the runner deletes first: closes now
], ids=["same-context", "mixed", "other-group", "runner-second", "runner-first"])
def test_double_delete_with_runner_one_close(make, a, b, expect):
    h = make(4, 2)
    fd, _ = h.pair()
    h.insert(fd, mask=0b11)
    out, gen = h.th[1].enter(fd)             # context 1 is inside
    first = h.th[a].delete(fd)
    try:
        second = h.th[b].delete(fd)
    except OSError as exc:
        assert exc.errno == errno.EBADF
        second = "EBADF"
    assert (first, second) == expect
    assert h.closes(fd, gen) == (1 if True in expect else 0)
    assert h.th[1].leave(fd, gen) == Outcome.CLOSED
    assert_closed_once(h, fd, gen)


@pytest.mark.parametrize("inner", [1, 2, 3])
def test_delete_nested_in_delete_orphaned(make, inner):
    """A second delete of the same incarnation inside the first one's window
    (thread_mask already 0, first deleter's running bit held)."""
    h = make(4, 2)
    fd, _ = h.pair()
    h.insert(fd, mask=0b11)
    res = []
    h.at(Hook.DELETE_ORPHANED, lambda *a: res.append(h.th[inner].delete(fd)), tid=0, fd=fd)
    assert h.th[0].delete(fd) is True
    assert res == [False]
    assert_closed_once(h, fd, 0)
    assert h.count(Hook.CLOSE_END, tid=0) == 1


def test_concurrent_deletes_and_runner_real_threads(make):
    """OS threads: one context enters/leaves in a loop while two others (one
    of another group) delete the same incarnation. One close, always."""
    h = make(4, 2)
    for _ in range(60):
        fd, _peer = h.pair()
        h.insert(fd, mask=0b11)
        gen = h.t.dump(fd).generation
        barrier = threading.Barrier(3)

        def runner():
            barrier.wait()
            for _ in range(20):
                out, g = h.th[1].enter(fd)
                if out != Outcome.DONE:
                    return out
                if h.th[1].leave(fd, g) != Outcome.DONE:
                    return "left-closed"
            return "done"

        def deleter(tid):
            barrier.wait()
            try:
                return h.th[tid].delete(fd)
            except OSError as exc:
                assert exc.errno == errno.EBADF
                return None

        ts = [run_thread(runner), run_thread(deleter, 0), run_thread(deleter, 2)]
        results = [joined(*t) for t in ts]
        assert results[1] is not True or results[2] is not True, results
        assert h.closes(fd, gen) == 1, (results, h.t.dump(fd))
        assert is_closed(fd)
        assert_clean(h.t.dump(fd), fd)


def test_takeovers_runners_delete_real_threads(make):
    """OS threads: the owner enters/leaves, an outsider keeps taking the fd
    over and entering as the new owner, a third context deletes it. Whatever
    the timing: one close, nobody stuck, nobody inside an fd it does not own
    once done, and the running bits seen inside are always our own."""
    import random

    h = make(3, 1)
    rnd = random.Random(7)
    for _ in range(40):
        fd, _peer = h.pair()
        h.insert(fd, mask=0b001)
        gen = h.t.dump(fd).generation
        barrier = threading.Barrier(3)
        delay = rnd.random() * 0.002

        def worker(tid, take):
            th = h.th[tid]
            barrier.wait()
            outcomes = []
            for _ in range(30):
                if take:
                    try:
                        th.takeover(fd, OWNER)
                    except OSError as exc:
                        assert exc.errno == errno.EBADF
                out, g = th.enter(fd)
                outcomes.append(out)
                if out == Outcome.DONE:
                    assert h.t.dump(fd).running_mask & th.bit
                    r = th.leave(fd, g)
                    outcomes.append(r)
                    if r == Outcome.CLOSED:
                        break
                elif out == Outcome.CLOSED:
                    break
            return outcomes

        def deleter():
            barrier.wait()
            time.sleep(delay)
            try:
                return h.th[1].delete(fd)
            except OSError as exc:
                assert exc.errno == errno.EBADF
                return None

        ts = [run_thread(worker, 0, False), run_thread(worker, 2, True), run_thread(deleter)]
        results = [joined(*t) for t in ts]
        assert h.closes(fd, gen) == 1, (results, h.t.dump(fd))
        assert is_closed(fd)
        assert_clean(h.t.dump(fd), fd)


# ---- 4. a stale update bit after close ---------------------------------------------


@pytest.mark.parametrize("changer", [1, 2], ids=["same-group", "other-group"])
def test_stale_update_bit_cleared_by_close(make, changer):
    h = make(4, 2)
    fd, _ = h.pair()
    h.insert(fd, mask=0b01)
    h.th[changer].want_recv(fd)               # a non-owner: shared list of group 1
    i = h.t.dump(fd)
    assert i.update_mask == 0b01 and i.in_shared_list
    assert h.th[0].delete(fd) is True         # before any update pass
    assert_closed_once(h, fd, 0)              # update_mask 0, off the shared list
    # the owner's (woken) pass finds nothing
    assert h.th[0].poll(0) == []
    peer = h.reuse(fd)
    h.insert(fd, mask=0b01)
    h.th[changer].want_recv(fd)
    i = h.t.dump(fd)
    assert i.update_mask == 0b01 and i.in_shared_list and i.generation == 1
    assert h.th[0].update_pass() == 1         # ADD: the update was not swallowed
    assert kernel_events(h.th[0].epfd, fd) & EPOLLIN
    peer.send(b"new")
    evs = h.th[0].poll(1000)
    assert [(e.fd, e.gen) for e in evs] == [(fd, 1)]
    assert h.th[0].leave(fd, 1) == Outcome.DONE
    assert h.th[0].counters()["ctl_err"] == 0


def test_stale_local_list_entry_after_close(make):
    h = make(1, 1)
    th = h.th[0]
    fa, _ = h.pair()
    fb, _ = h.pair()
    h.insert(fa)
    h.insert(fb)
    th.want_recv(fa)                          # local list: [fa, fb]
    th.want_recv(fb)
    assert th.delete(fa) is True              # fa stays listed (not the last entry)
    assert_closed_once(h, fa, 0)
    d0 = th.counters()["poll_drop_fd"]
    assert th.update_pass() == 1              # only fb's ADD
    assert th.counters()["poll_drop_fd"] == d0 + 1
    # same again, but the number is reused before the pass
    th.want_recv(fb)
    th.stop_recv(fb)                          # fb listed again
    peer = h.reuse(fa)
    h.insert(fa)
    th.want_recv(fa)
    th.update_pass()
    assert [r[2] for r in epoll_regs(th.epfd) if r[0] == fa] == [(1 << 32) | fa]
    peer.send(b"x")
    assert [(e.fd, e.gen) for e in th.poll(1000)] == [(fa, 1)]
    assert th.leave(fa, 1) == Outcome.DONE
    assert th.counters()["ctl_err"] == 0


def test_update_programmed_during_close(make):
    """A late visitor during the final close: before the tgid reset its
    change programs nothing (thread_mask is 0), after it the fd is gone."""
    h = make(2, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b01)
    errs = []

    def verb(tid, f, g):
        try:
            h.th[1].want_recv(fd)
        except OSError as exc:
            errs.append(exc.errno)

    h.at(Hook.CLOSE_BEGIN, verb, fd=fd)
    h.at(Hook.CLOSE_DRAINED, verb, fd=fd)
    assert h.th[0].delete(fd) is True
    assert errs == [errno.EBADF]
    assert_closed_once(h, fd, 0)
    h.reuse(fd)
    h.insert(fd, mask=0b01)
    h.th[0].want_recv(fd)
    assert h.th[0].update_pass() == 1


def test_close_while_update_pass_holds_the_fd(make):
    """The owners' shared-list pass is consuming the fd when it is orphaned
    (a runner keeps the close deferred): the pass still converges, and the
    final close removes every registration and list entry."""
    h = make(3, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b111)
    h.th[0].want_recv(fd)
    for tid in (0, 1):
        h.th[tid].update_pass()
    box = {}

    def in_pass(tid, f, g):
        box["gen"] = h.th[1].enter(fd)[1]
        box["del"] = h.th[0].delete(fd)

    h.at(Hook.UPDATE_CONSUMED, in_pass, tid=2, fd=fd)
    h.th[2].update_pass()
    assert box["del"] is False
    i = h.t.dump(fd)
    assert i.thread_mask == 0 and i.running_mask == 0b010
    assert i.polled_recv == 0b011               # 2 saw itself no longer an owner: no ADD
    assert h.th[1].leave(fd, box["gen"]) == Outcome.CLOSED
    assert_closed_once(h, fd, 0)
    for th in h.th:
        th.update_pass()
        assert kernel_events(th.epfd, fd) is None


# ---- 5. the consistency loop when the own bit leaves thread_mask --------------------


def test_enter_inside_delete_orphaned_does_not_spin(make):
    h = make(2, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b11)
    res = []
    h.at(Hook.DELETE_ORPHANED, lambda *a: res.append(h.th[0].enter(fd)[0]), tid=1, fd=fd)
    assert h.th[1].delete(fd) is True
    assert res == [Outcome.MIGRATED]
    assert h.count(Hook.ENTER_RETRY) == 0
    assert h.th[0].counters()["poll_skip_fd"] == 1
    assert_closed_once(h, fd, 0)
    assert h.th[0].update_pass() == 0


def test_delete_inside_enter_running_enter_closes(make):
    """The runner already OR'ed its bit when the delete orphans the fd: the
    loop sees its bit gone from thread_mask and leaves at once; being the last
    runner, it performs the close."""
    h = make(2, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b11)
    res = []
    h.at(Hook.ENTER_RUNNING, lambda *a: res.append(h.th[1].delete(fd)), tid=0, fd=fd)
    out, _ = h.th[0].enter(fd)
    assert res == [False]
    assert out == Outcome.CLOSED
    assert h.count(Hook.ENTER_RETRY) == 0
    assert_closed_once(h, fd, 0)
    assert h.count(Hook.CLOSE_END, tid=0) == 1


def test_two_runners_plus_delete_no_livelock(make):
    """f98a8c317: context 2 is inside, context 0 enters and a delete lands
    right after its running bit: context 0 must leave (MIGRATED) instead of
    waiting for context 2's bit, now outside thread_mask, to go away."""
    h = make(3, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b111)
    _, g2 = h.th[2].enter(fd)
    res = []
    h.at(Hook.ENTER_RUNNING, lambda *a: res.append(h.th[1].delete(fd)), tid=0, fd=fd)
    out, _ = h.th[0].enter(fd)
    assert res == [False]
    assert out == Outcome.MIGRATED
    assert h.count(Hook.ENTER_RETRY) == 0
    assert h.t.dump(fd).running_mask == 0b100
    assert h.th[2].leave(fd, g2) == Outcome.CLOSED
    assert_closed_once(h, fd, 0)


def test_enter_retry_then_delete_resolves_against_us(make):
    """A takeover is in progress (taker bit outside thread_mask) when the
    owner enters: it retries; the fd is then deleted under both: the owner
    exits the loop and the last one out closes, exactly once."""
    h = make(3, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b001)
    retrying = threading.Event()
    h.at(Hook.ENTER_RETRY, lambda *a: retrying.set(), tid=0, fd=fd, once=False)
    box: dict = {}

    def in_takeover(tid, f, gen):
        box["t"] = run_thread(h.th[0].enter, fd)
        assert retrying.wait(10)
        box["del"] = h.th[1].delete(fd)           # orphan while both hold running bits

    h.at(Hook.TAKEOVER_OWNED, in_takeover, tid=2, fd=fd)
    took = h.th[2].takeover(fd, OWNER)
    out, _ = joined(*box["t"])
    assert box["del"] is False and took is False
    assert out in (Outcome.MIGRATED, Outcome.CLOSED)
    assert_closed_once(h, fd, 0)
    closer = [tid for p, tid, f, g in h.log if p == Hook.CLOSE_END and f == fd]
    assert closer in ([0], [2])
    assert (out == Outcome.CLOSED) == (closer == [0])


def test_enter_retry_resolves_in_our_favour(make):
    """The new owner meets the old owner's stale running bit: context 0 (old
    owner) OR'ed its bit while the takeover by context 2 was in progress and
    is still in its consistency loop when context 2, now the owner, enters.
    Context 2 retries (a bit outside thread_mask), context 0 sees its own bit
    gone from thread_mask and leaves MIGRATED, and context 2 proceeds DONE."""
    h = make(3, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b001)
    x_retrying, x_gate = threading.Event(), threading.Event()

    def old_owner_retry(tid, f, gen):
        x_retrying.set()
        assert x_gate.wait(10)

    h.at(Hook.ENTER_RETRY, old_owner_retry, tid=0, fd=fd, once=False)
    box: dict = {}

    def in_takeover(tid, f, gen):
        box["x"] = run_thread(h.th[0].enter, fd)
        assert x_retrying.wait(10)

    h.at(Hook.TAKEOVER_OWNED, in_takeover, tid=2, fd=fd)
    assert h.th[2].takeover(fd, OWNER) is True
    i = h.t.dump(fd)
    assert i.thread_mask == 0b100 and i.running_mask == 0b001   # old owner's stale bit
    h.at(Hook.ENTER_RETRY, lambda *a: x_gate.set(), tid=2, fd=fd)
    out, gen = h.th[2].enter(fd)
    assert out == Outcome.DONE
    assert joined(*box["x"])[0] == Outcome.MIGRATED
    assert h.count(Hook.ENTER_RETRY, tid=2) >= 1
    assert h.t.dump(fd).running_mask == 0b100
    assert h.th[2].leave(fd, gen) == Outcome.DONE
    assert h.t.dump(fd).running_mask == 0 and h.closes(fd, 0) == 0


# ---- 6. seed 001: a shared fd changed by a non-owner converges everywhere -----------


@pytest.mark.parametrize("layout", ["same-group", "other-group"])
def test_seed001_shared_fd_converges_on_every_owner(make, layout):
    # same-group: 4 threads in 1 group, owners 0,1,2, changer 3 (not an owner)
    # other-group: group 1 = tids 0,1,2, group 2 = tids 3,4; changer 3
    h = make(4, 1) if layout == "same-group" else make(5, 2)
    owners = [0, 1, 2]
    fd, peer = h.pair()
    h.insert(fd, mask=0b111, kind=9)
    ch = h.th[3]

    def converge(expect_in: bool, expect_out: bool = False):
        w0 = [h.th[t].counters()["wakeups"] for t in owners]
        for n, t in enumerate(owners):
            for e in h.th[t].poll(0):                  # woken, pass applied
                assert e.fd == fd
                assert h.th[t].leave(fd, e.gen) == Outcome.DONE
            assert h.th[t].counters()["wakeups"] == w0[n] + 1
        i = h.t.dump(fd)
        assert i.update_mask == 0 and not i.in_shared_list
        assert i.polled_recv == (i.thread_mask if expect_in else 0)
        assert i.polled_send == (i.thread_mask if expect_out else 0)
        for t in owners:
            ev = kernel_events(h.th[t].epfd, fd)
            if not (expect_in or expect_out):
                assert ev is None
            else:
                assert ev is not None
                assert bool(ev & EPOLLIN) == expect_in and bool(ev & EPOLLOUT) == expect_out
                (data,) = [r[2] for r in epoll_regs(h.th[t].epfd) if r[0] == fd]
                assert data == fd
        for th in h.th[3:]:
            assert kernel_events(th.epfd, fd) is None

    ch.want_recv(fd)
    i = h.t.dump(fd)
    assert i.update_mask == i.thread_mask == 0b111 and i.in_shared_list
    converge(True)
    ch.want_send(fd)
    converge(True, True)
    ch.stop_send(fd)
    converge(True)
    # a change landing while the owners are half-way through a pass
    ch.stop_recv(fd)
    assert h.th[0].update_pass() == 1
    ch.want_recv(fd)                       # re-arms thread 0's bit too
    assert h.t.dump(fd).update_mask == 0b111
    converge(True)
    # every owner gets the report (not exclusive)
    peer.send(b"x")
    for t in owners:
        evs = h.th[t].poll(1000)
        assert [(e.fd, e.kind) for e in evs] == [(fd, 9)]
        assert h.th[t].leave(fd, evs[0].gen) == Outcome.DONE
    peer.recv(0)
    ch.stop_recv(fd)
    converge(False)
    assert all(h.th[t].counters()["ctl_err"] == 0 for t in owners)


def test_seed001_converges_with_real_poller_threads(make):
    """Three OS threads run their poll loops; a non-owner flips the shared fd
    many times; every owner's epoll must end where the last change put it."""
    h = make(4, 1)
    owners = [0, 1, 2]
    fd, _ = h.pair()
    h.insert(fd, mask=0b111)
    stop = threading.Event()

    def loop(tid):
        th = h.th[tid]
        while not stop.is_set():
            for e in th.poll(20):
                th.leave(e.fd, e.gen)
        th.update_pass()

    ts = [run_thread(loop, t) for t in owners]
    ch = h.th[3]
    for n in range(200):
        if n % 2:
            ch.stop_recv(fd)
        else:
            ch.want_recv(fd)
        if n % 7 == 0:
            time.sleep(0.001)
    ch.want_recv(fd)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        i = h.t.dump(fd)
        if i.polled_recv == 0b111 and i.update_mask == 0 and not i.in_shared_list:
            break
        time.sleep(0.01)
    stop.set()
    for t in ts:
        joined(*t)
    i = h.t.dump(fd)
    assert i.polled_recv == 0b111 and i.update_mask == 0 and not i.in_shared_list, i
    for t in owners:
        assert kernel_events(h.th[t].epfd, fd) & EPOLLIN
        assert h.th[t].counters()["ctl_err"] == 0


def test_shared_list_stress_converges(make):
    """Real OS threads: 3 pollers of one group keep polling while 2 non-owner
    threads flip want/stop on 12 shared fds at random. Once the flipping
    stops, every fd must converge: no update bit left, off the shared list,
    polled == wanted on every owner, and the kernel agrees (no lost entry in
    the lock-free list, no lost wake-up)."""
    import random

    h = make(5, 1)
    h.t.set_hook(None)                 # no Python in the hot path: real concurrency
    owners = [0, 1, 2]
    fds = []
    for _ in range(12):
        fd, _peer = h.pair()
        h.insert(fd, mask=0b111)
        fds.append(fd)
    stop = threading.Event()

    def poller(tid):
        th = h.th[tid]
        while not stop.is_set():
            for e in th.poll(5):
                th.leave(e.fd, e.gen)

    def changer(tid, seed):
        rnd = random.Random(seed)
        th = h.th[tid]
        end = time.monotonic() + 1.5
        n = 0
        while time.monotonic() < end:
            fd = rnd.choice(fds)
            rnd.choice((th.want_recv, th.stop_recv, th.want_send, th.stop_send))(fd)
            n += 1
        return n

    ps = [run_thread(poller, t) for t in owners]
    cs = [run_thread(changer, 3, 1), run_thread(changer, 4, 2)]
    assert all(joined(*c) > 0 for c in cs)
    final = {}
    for n, fd in enumerate(fds):
        want_r, want_w = bool(n & 1), bool(n & 2)
        (h.th[3].want_recv if want_r else h.th[3].stop_recv)(fd)
        (h.th[4].want_send if want_w else h.th[4].stop_send)(fd)
        final[fd] = (want_r, want_w)
    deadline = time.monotonic() + 10

    def unsettled():
        out = []
        for fd in fds:
            i = h.t.dump(fd)
            r, w = final[fd]
            if (i.update_mask or i.in_shared_list or i.polled_recv != (0b111 if r else 0)
                    or i.polled_send != (0b111 if w else 0)):
                out.append(i)
        return out

    def settled():
        return not unsettled()

    while not settled() and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    for p in ps:
        joined(*p)
    assert settled(), unsettled()
    for t in owners:
        regs = {fd: ev for fd, ev, _ in epoll_regs(h.th[t].epfd)}
        for fd in fds:
            r, w = final[fd]
            if r or w:
                assert bool(regs[fd] & EPOLLIN) == r and bool(regs[fd] & EPOLLOUT) == w
            else:
                assert fd not in regs
        assert h.th[t].counters()["ctl_err"] == 0
