"""The defects of the fdcore review (issue 6), each as the interleaving or
input that exposed it, driven through the step hooks.

1. release_running decided "I was the last runner" from the mask its own
   clear returned: a thread admitted after that clear, inside when a delete
   orphaned the fd, had the fd closed under it.
2. list_remove bumped the group's removal counter before the entry was out:
   a walker that read the counter after the bump, then `first`, could be
   carried past every entry by the removed entry re-added at the tail, see an
   unchanged counter, and sleep through an update.
"""
from __future__ import annotations

import threading

import pytest

from sockherd.fdcore import Hook, Outcome, State

from fd_harness import EPOLLIN, Harness, assert_closed_once, is_closed, kernel_events

pytestmark = pytest.mark.timeout(60)

C, X, D = 0, 1, 2   # the leaving thread, the entering owner, the deleter


def admit_x_then_delete(h: Harness, fd: int, box: dict):
    """Hook step run while C is between its running-bit clear and its read of
    thread_mask: X is admitted (thread_mask still holds it), then D deletes;
    D must defer the close to X, which is inside."""
    def step(_tid, _fd, _gen):
        out, box["gen"] = h.th[X].enter(fd)
        assert out == Outcome.DONE
        box["deleted_now"] = h.th[D].delete(fd)
        assert h.t.dump(fd).running_mask == 1 << X
    return step


def x_inside_then_leaves_and_closes(h: Harness, fd: int, box: dict):
    assert box["deleted_now"] is False            # X was inside: deferred
    # X is still running its handler: the fd must still be open and whole
    assert not is_closed(fd), "closed while another thread is inside"
    assert h.closes(fd, box["gen"]) == 0
    info = h.t.dump(fd)
    assert info.running_mask == 1 << X and info.thread_mask == 0
    assert info.state & State.MUST_CLOSE
    assert h.th[X].leave(fd, box["gen"]) == Outcome.CLOSED
    assert_closed_once(h, fd, box["gen"])


def test_bug1_leave_then_foreign_owner_enters_then_delete(make):
    """The review's interleaving on a listener co-owned by C and X."""
    h = make(3, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=(1 << C) | (1 << X))
    out, gen = h.th[C].enter(fd)
    assert out == Outcome.DONE
    box: dict = {}
    h.at(Hook.RELEASE_CLEARED, admit_x_then_delete(h, fd, box), tid=C, fd=fd)
    assert h.th[C].leave(fd, gen) != Outcome.CLOSED
    x_inside_then_leaves_and_closes(h, fd, box)


def test_bug1_enter_exit_path_after_takeover(make):
    """C, the owner, is about to set its running bit when X takes the fd
    over; C's consistency loop then sees itself outside thread_mask and
    leaves through the same release, while X enters and D deletes."""
    h = make(3, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=1 << C)

    def takeover(_tid, _fd, _gen):
        assert h.th[X].takeover(fd, h.t.dump(fd).owner) is True

    box: dict = {}
    h.at(Hook.ENTER_OWNER, takeover, tid=C, fd=fd)
    h.at(Hook.RELEASE_CLEARED, admit_x_then_delete(h, fd, box), tid=C, fd=fd)
    assert h.th[C].enter(fd)[0] == Outcome.MIGRATED
    x_inside_then_leaves_and_closes(h, fd, box)


def test_bug1_takeover_release_then_second_takeover(make):
    """C takes the fd over and, between its clear and its read, X takes it
    from C, enters, and D deletes: C must not close under X."""
    h = make(3, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=1 << D)
    owner = h.t.dump(fd).owner
    box: dict = {}

    def x_takes_enters_d_deletes(_tid, _fd, _gen):
        assert h.th[X].takeover(fd, owner) is True
        admit_x_then_delete(h, fd, box)(_tid, _fd, _gen)

    h.at(Hook.RELEASE_CLEARED, x_takes_enters_d_deletes, tid=C, fd=fd)
    # C's own takeover succeeded before it was overtaken; either way it
    # must not have closed the fd
    h.th[C].takeover(fd, owner)
    x_inside_then_leaves_and_closes(h, fd, box)


def test_bug1_foreign_group_delete_still_closes_once(make):
    """The fix's other side: a foreign delete landing between the last
    runner's clear and its read sees no runner and wins the close; the
    leaver's fresh read of running_mask must then not close a second time.
    The deleter is a real thread: its close waits for the leaver's
    reference, which a hook step on the leaver's own thread would deadlock."""
    h = make(4, 2)
    fd, _ = h.pair()
    h.insert(fd, tgid=1, mask=0b11)
    _, gen = h.th[0].enter(fd)
    closing = threading.Event()
    box: dict = {}
    h.at(Hook.CLOSE_BEGIN, lambda *_: closing.set(), tid=3, fd=fd)

    def foreign_delete():
        box["now"] = h.th[3].delete(fd)

    def start_deleter(_tid, _fd, _gen):
        box["thread"] = threading.Thread(target=foreign_delete, daemon=True)
        box["thread"].start()
        assert closing.wait(10), "the foreign delete did not start the close"

    h.at(Hook.RELEASE_CLEARED, start_deleter, tid=0, fd=fd)
    assert h.th[0].leave(fd, gen) == Outcome.MIGRATED
    box["thread"].join(10)
    assert not box["thread"].is_alive()
    assert box["now"] is True
    assert_closed_once(h, fd, gen)
    assert h.count(Hook.CLOSE_END, tid=3) == 1


# ---- 2. the shared-list walker and the removal counter ---------------------


def test_bug2_walker_carried_past_an_update_walks_again(make):
    """Group of 3: W (tid 0) walks, R (tid 1) removes the list head A while W
    stands on it, and the head is re-added at the tail behind B, which holds
    W's update. W must still consume B's update in this pass."""
    W, R, S = 0, 1, 2
    h = make(3, 1)
    a, _ = h.pair()
    b, _ = h.pair()
    h.insert(a, mask=1 << R)          # A: updates for R only
    h.insert(b, mask=1 << W)          # B: updates for W only
    h.th[S].want_recv(a)              # made by a non-owner: shared list
    h.th[S].want_recv(b)
    assert h.t.dump(a).in_shared_list and h.t.dump(b).in_shared_list

    locked = threading.Event()        # R holds A and its neighbours locked
    unlink = threading.Event()        # R may unlink A
    removed = threading.Event()       # R's pass is over
    errors: list[BaseException] = []

    def r_waits(_tid, _fd, _gen):     # R: A and its neighbours locked
        locked.set()
        unlink.wait(10)

    def r_pass():
        try:
            h.th[R].update_pass()
        except BaseException as exc:
            errors.append(exc)
        finally:
            removed.set()

    def w_on_a(_tid, _fd, _gen):      # W standing on A, read counter and head
        unlink.set()
        assert removed.wait(10), "R's pass did not finish"
        h.th[S].want_send(a)          # A re-added at the tail, behind B
        assert h.t.dump(a).in_shared_list

    h.at(Hook.LIST_UNLINK, r_waits, fd=a)
    h.at(Hook.WALK_ARRIVE, w_on_a, tid=W, fd=a)
    r = threading.Thread(target=r_pass, daemon=True)
    r.start()
    # W's pass starts once R holds A locked (on today's fixed code, before
    # R has moved the removal counter; on the old code, just after)
    assert locked.wait(10), "R never reached the unlink of A"
    h.th[W].update_pass()
    r.join(10)
    assert not r.is_alive() and not errors, errors

    info = h.t.dump(b)
    assert not info.update_mask & (1 << W), "W slept through B's update"
    assert info.polled_recv & (1 << W)
    assert kernel_events(h.th[W].epfd, b) & EPOLLIN
