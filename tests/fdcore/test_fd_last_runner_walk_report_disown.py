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

import errno
import os
import socket
import threading
import time

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


# ---- 3. a failed epoll_ctl -------------------------------------------------


def regular_file(tmp_path) -> int:
    path = tmp_path / "plain"
    path.write_bytes(b"x")
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def poll_once(th, timeout_ms: int = 5000):
    t0 = time.monotonic()
    evs = th.poll(timeout_ms)
    return evs, time.monotonic() - t0


def test_bug3_failed_add_is_reported_to_the_owner(make, tmp_path):
    """The number turns into a regular file behind the table's back: the ADD
    fails with EPERM. polled_mask must not claim a registration, and the
    owner must hear of it at once (no sleeping through a starved fd)."""
    h = make(1, 1)
    fd, _ = h.pair()
    h.insert(fd)
    f = regular_file(tmp_path)
    os.dup2(f, fd)
    os.close(f)
    before = h.th[0].counters()["ctl_err"]
    h.th[0].want_recv(fd)
    evs, took = poll_once(h.th[0])
    assert took < 2.0, "slept with a failure to report"
    assert [(e.fd, e.events) for e in evs] == [(fd, State.POLL_ERR | State.POLL_CTL)]
    info = h.t.dump(fd)
    assert info.polled_recv == 0 and kernel_events(h.th[0].epfd, fd) is None
    assert info.ctl_errno == errno.EPERM
    assert info.state & State.ERR and info.state & State.ACTIVE_R
    assert h.th[0].counters()["ctl_err"] == before + 1
    h.th[0].leave_all()
    # each failed attempt is reported (one pending report per fd and thread)
    h.th[0].stop_recv(fd)
    h.th[0].want_recv(fd)
    h.th[0].update_pass()
    h.th[0].update_pass()
    evs, took = poll_once(h.th[0])
    assert took < 2.0 and [e.fd for e in evs] == [fd]
    assert h.th[0].counters()["ctl_err"] == before + 2
    h.th[0].leave_all()
    assert h.th[0].delete(fd) is True


def test_bug3_mod_of_a_number_closed_behind_our_back_is_not_re_added(make):
    """MOD answered ENOENT: the registered file is gone and the number holds
    a stranger's socket. Re-ADDing it would poll the stranger for us."""
    h = make(1, 1)
    fd, _ = h.pair()
    h.insert(fd)
    h.th[0].want_recv(fd)
    h.th[0].update_pass()
    assert kernel_events(h.th[0].epfd, fd) & EPOLLIN
    stranger, _peer = socket.socketpair()
    h.keep(_peer)
    os.dup2(stranger.fileno(), fd)        # the old file's last reference goes
    stranger.close()
    assert kernel_events(h.th[0].epfd, fd) is None
    h.th[0].want_send(fd)                 # MOD -> ENOENT
    evs, _ = poll_once(h.th[0])
    assert [(e.fd, e.events & State.POLL_CTL) for e in evs] == [(fd, State.POLL_CTL)]
    assert kernel_events(h.th[0].epfd, fd) is None, "a stranger's file was registered"
    info = h.t.dump(fd)
    assert info.ctl_errno == errno.ENOENT
    assert (info.polled_recv, info.polled_send) == (0, 0)
    assert h.th[0].counters()["ctl_err"] == 1
    h.th[0].leave_all()
    assert h.th[0].delete(fd) is True


def test_bug3_del_of_a_closed_number_is_counted(make):
    h = make(1, 1)
    fd, _ = h.pair()
    h.insert(fd)
    h.th[0].want_recv(fd)
    h.th[0].update_pass()
    os.close(fd)                          # behind the table's back
    h.th[0].stop_recv(fd)                 # DEL -> EBADF
    h.th[0].update_pass()
    assert h.th[0].counters()["ctl_err"] == 1
    assert h.t.dump(fd).polled_recv == 0
    h.reuse(fd)                           # the delete closes what the number holds now
    assert h.th[0].delete(fd) is True


def test_bug3_insert_refuses_what_epoll_cannot_poll(make, tmp_path):
    h = make(1, 1)
    f = h.keep_fd(regular_file(tmp_path))
    with pytest.raises(OSError) as exc:
        h.insert(f)
    assert exc.value.errno == errno.EPERM and "cannot poll" in str(exc.value)
    d = h.keep_fd(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
    with pytest.raises(OSError) as exc:
        h.insert(d)
    assert exc.value.errno == errno.EPERM
    closed = os.dup(0)
    os.close(closed)
    with pytest.raises(OSError) as exc:
        h.insert(closed)
    assert exc.value.errno == errno.EBADF
    for fd in (f, d):
        assert h.t.dump(fd).tgid == 0     # nothing half-inserted
    r, w = os.pipe()
    h.keep_fd(w)
    h.insert(r)                           # pipes, eventfds, sockets: fine
    ev = os.eventfd(0, os.EFD_CLOEXEC)
    h.insert(ev)


# ---- 4. smaller points -----------------------------------------------------


def test_bug4_disown_deferred_forget_has_a_visible_end(make):
    """A disowned fd deleted while another thread is inside is forgotten
    only when that thread leaves; released() tells the owner when it may
    close its fd, and the forget never closes it."""
    h = make(2, 1)
    fd, peer = h.pair()
    h.keep_fd(fd)
    h.insert(fd, mask=0b11, disown=True)
    h.th[0].want_recv(fd)
    for th in h.th:
        th.update_pass()
    gen = h.t.dump(fd).generation
    out, held = h.th[1].enter(fd)
    assert out == Outcome.DONE and held == gen
    assert h.th[0].delete(fd) is False
    assert h.t.released(fd, gen) is False   # not yet: the owner keeps off
    assert h.th[1].leave(fd, gen) == Outcome.CLOSED
    assert h.t.released(fd, gen) is True
    assert not is_closed(fd)                # forgotten, never closed
    for th in h.th:
        assert kernel_events(th.epfd, fd) is None
    peer.send(b"x")
    assert os.read(fd, 1) == b"x"


def test_bug4_disown_with_linger_risk_is_refused(make):
    h = make(1, 1)
    fd, _ = h.pair()
    h.keep_fd(fd)
    with pytest.raises(OSError) as exc:
        h.insert(fd, disown=True, linger_risk=True)
    assert exc.value.errno == errno.EINVAL


def test_bug4_plain_insert_of_a_listener_is_cloned(make):
    """The seed 004 trap: a listener also open elsewhere (here a dup, as the
    master's copy would be), inserted with plain insert() on 4 threads. The
    table marks it CLONED, so its delete leaves no registration behind."""
    h = make(4, 1)
    srv = socket.create_server(("127.0.0.1", 0))
    srv.setblocking(False)
    lfd = srv.detach()
    keep = h.keep_fd(os.dup(lfd))           # the master's copy
    h.insert(lfd, mask=0b1111)
    assert h.t.dump(lfd).state & State.CLONED
    h.th[0].want_recv(lfd)
    for th in h.th:
        th.update_pass()
    assert all(kernel_events(th.epfd, lfd) for th in h.th)
    assert h.th[0].delete(lfd) is True
    assert all(kernel_events(th.epfd, lfd) is None for th in h.th)
    assert not is_closed(keep)
    # a connected socket is not a listener: no CLONED; sole=True opts out
    fd, _ = h.pair()
    h.insert(fd)
    assert not h.t.dump(fd).state & State.CLONED
    srv2 = socket.create_server(("127.0.0.1", 0))
    l2 = srv2.detach()
    h.insert(l2, sole=True)
    assert not h.t.dump(l2).state & State.CLONED


def test_accepted_insert_skips_the_probe_and_keeps_no_flag(make):
    """accepted=True is the accept path's promise (a connected socket): no
    probe syscall, nothing CLONED, and the flag itself is not stored."""
    h = make(1, 1)
    srv = h.keep(socket.create_server(("127.0.0.1", 0)))
    cli = h.keep(socket.create_connection(srv.getsockname()))
    conn, _ = srv.accept()
    fd = conn.detach()
    h.insert(fd, accepted=True)
    st = h.t.dump(fd).state
    assert st == State.READY_R | State.READY_W
    h.th[0].want_recv(fd)
    cli.send(b"x")
    evs, _ = poll_once(h.th[0])
    assert [e.fd for e in evs] == [fd]
    h.th[0].leave_all()
    assert h.th[0].delete(fd) is True
