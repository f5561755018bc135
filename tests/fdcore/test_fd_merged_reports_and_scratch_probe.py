"""Second adversarial review (fdcore), aimed at the fixes of 2b27b71 (and
20bbd1e): the removal counter bumped while the entry is still locked, the
EXCLUSIVE DEL+ADD stopping after a refused DEL, failed registrations
reported per attempt and thread *before* epoll_wait (merge_report), and
insert's probe on the table's scratch epoll instance.

Findings (strict xfails on the core of 0753a8f, passing since the fix that
followed; only the finding's own check raises AssertionError, a broken
set-up raises RuntimeError):
  1. fdc_poll counts WAKE_NOWORK ("wake-ups whose batch came back empty",
     fd-t.h) when cnt == nrep, i.e. whenever no epoll event was *added* to
     the failure reports: an epoll report merged into a failure report (real
     I/O, handed to the owner in the batch) is counted as a wake-up for
     nothing, and so is any wake whose batch holds only reports.
  2. insert's probe ADDs with events = 0, never with EPOLLEXCLUSIVE: an
     epoll fd inserted EXCLUSIVE passes the probe, and every ADD of it
     fails EINVAL for ever (the kernel refuses EPOLLEXCLUSIVE on an epoll
     target), which is exactly what the probe exists to refuse (-EPERM,
     "its ADD would fail for ever").

The rest are interleavings and inputs that held, kept as regression guards.
"""
from __future__ import annotations

import errno
import os
import select
import socket
import time

import pytest

from sockherd.fdcore import Hook, State

from fd_harness import (
    swapped_with_old_file_readable,
    EPOLLIN,
    OWNER,
    epoll_regs,
    kernel_events,
)

pytestmark = pytest.mark.timeout(60)

CTL_ERR = State.POLL_ERR | State.POLL_CTL


def require(cond, msg: str) -> None:
    """A precondition of the scenario (not the finding)."""
    if not cond:
        raise RuntimeError(f"scenario set-up: {msg}")


def turn_into_regular_file(fd: int, tmp_path, name: str = "plain") -> None:
    """Behind the table's back the number now holds a regular file: any ADD
    of it fails with EPERM."""
    path = tmp_path / name
    path.write_bytes(b"x")
    f = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    os.dup2(f, fd)
    os.close(f)


def epoll_fds() -> set[int]:
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[eventpoll]":
                out.add(int(name))
        except OSError:
            pass
    return out


# =============================================================================
# Findings
# =============================================================================


def test_finding1_merged_event_is_not_a_wake_for_nothing(make):
    """Finding 6's scenario of the first review: the MOD fails ENOENT (the
    number was swapped, the old file lives on in a dup and reports IN), the
    same poll merges that IN into the failure report. The batch holds one
    event with IN: the wake did work, yet wake_nowork moves."""
    h = make(1, 1)
    th = h.th[0]
    fd = swapped_with_old_file_readable(h, th)
    th.want_send(fd)                            # MOD -> ENOENT
    before = th.counters()["wake_nowork"]
    evs = th.poll(0)
    try:
        require([(e.fd, e.events) for e in evs] == [(fd, State.POLL_IN | CTL_ERR)],
                f"one merged event, got {evs}")
        require(th.counters()["poll_io"] >= 1, "epoll reported the fd")
        assert th.counters()["wake_nowork"] == before, \
            "a wake whose I/O report was handed over counted as a wake for nothing"
    finally:
        th.leave_all()


def test_finding2_insert_refuses_an_exclusive_fd_epoll_cannot_add(make):
    h = make(1, 1)
    ep = select.epoll()
    fd = os.dup(ep.fileno())
    ep.close()
    try:
        h.insert(fd, exclusive=True)
    except OSError as exc:                      # the fix: refused up front
        os.close(fd)
        assert exc.errno in (errno.EPERM, errno.EINVAL)
        return
    th = h.th[0]
    th.want_recv(fd)
    evs = th.poll(0)
    th.leave_all()
    require([(e.fd, e.events & CTL_ERR) for e in evs] == [(fd, CTL_ERR)], "the ADD failed")
    require(h.t.dump(fd).ctl_errno == errno.EINVAL, "EINVAL, as for every later ADD")
    assert False, "insert accepted an EXCLUSIVE fd whose ADD can never succeed"


# =============================================================================
# Guards: interleavings and inputs that held
# =============================================================================


def test_walker_on_entry_closed_and_reinserted_in_another_group_walks_again(make):
    """Group 1 = threads 0..2, group 2 = threads 3, 4. W (0) stands on the
    head E of group 1's list; before it steps, E is deleted (final close:
    removal from group 1, counter bumped), the number reused, inserted in
    group 2 and put on group 2's shared list. W steps into group 2's list
    (E's new links), reaches its END, sees group 1's counter moved and walks
    again: B's update (behind E) is consumed in this very pass."""
    W, D, S = 0, 1, 2
    h = make(5, 2)
    e, _ = h.pair()
    b, _ = h.pair()
    h.insert(e, mask=1 << D)
    h.insert(b, mask=1 << W)
    h.th[S].want_recv(e)
    h.th[S].want_recv(b)
    require(h.t.dump(e).in_shared_list and h.t.dump(b).in_shared_list, "list E, B")
    done = {}

    def move(*_):
        assert h.th[D].delete(e) is True       # W holds no reference: closes now
        h.reuse(e)
        h.insert(e, tgid=2, mask=0b01)          # thread 3
        h.th[4].want_recv(e)                    # non-owner: group 2's shared list
        done["in_g2"] = h.t.dump(e).in_shared_list

    h.at(Hook.WALK_ARRIVE, move, tid=W, fd=e)
    h.th[W].update_pass()
    assert done == {"in_g2": 1}
    ib = h.t.dump(b)
    assert ib.update_mask == 0 and not ib.in_shared_list
    assert ib.polled_recv == 1 << W and kernel_events(h.th[W].epfd, b) & EPOLLIN
    ie = h.t.dump(e)
    assert ie.tgid == 2 and ie.in_shared_list and ie.update_mask == 0b01
    h.th[3].update_pass()                       # group 2's walk consumes it
    ie = h.t.dump(e)
    assert not ie.in_shared_list and ie.update_mask == 0
    assert kernel_events(h.th[3].epfd, e) & EPOLLIN


def test_remover_bumps_while_locked_adder_waits_no_deadlock(make):
    """At LIST_UNLINK (the remover inside its locked window, before its bump
    and its out store) a re-arm of the entry by a non-owner runs on another
    OS thread: its add must wait for the lock (it cannot re-add the entry
    before the bump) and complete once the remover is done; nothing stuck,
    and R's registration ends with both directions."""
    import threading

    from fd_harness import EPOLLOUT

    R, S = 0, 1
    h = make(2, 1)
    a, _ = h.pair()
    h.insert(a, mask=1 << R)
    h.th[S].want_recv(a)                        # shared list: update for R
    box = {}

    def window(*_):
        box["locked"] = not h.t.dump(a).in_shared_list   # links LOCKED (-2)

        def rearm():
            h.th[S].want_send(a)
            box["rearmed"] = True

        t = threading.Thread(target=rearm, daemon=True)
        t.start()
        box["t"] = t
        t.join(0.3)
        box["waited"] = t.is_alive()            # spinning on the locked entry

    h.at(Hook.LIST_UNLINK, window, fd=a)
    h.th[R].update_pass()
    box["t"].join(10)
    assert not box["t"].is_alive(), "re-arm stuck"
    assert box["locked"] and box["waited"] and box.get("rearmed")
    h.th[R].update_pass()
    info = h.t.dump(a)
    assert not info.in_shared_list and info.update_mask == 0
    assert kernel_events(h.th[R].epfd, a) & (EPOLLIN | EPOLLOUT) == EPOLLIN | EPOLLOUT


def test_reports_fill_the_batch_before_wait_then_events_follow(make, tmp_path):
    """A failing fd and a ready one, batches of one: the first poll returns
    the report alone without entering epoll_wait (no BEFORE_WAIT, no sleep
    despite a 5 s timeout), the second the ready fd; each held once."""
    h = make(1, 1)
    th = h.th[0]
    busy, peer = h.pair()
    peer.send(b"x")
    h.insert(busy)
    th.want_recv(busy)
    th.update_pass()
    bad, _ = h.pair()
    h.insert(bad)
    turn_into_regular_file(bad, tmp_path)
    th.want_recv(bad)
    waits = h.count(Hook.BEFORE_WAIT)
    t0 = time.monotonic()
    evs = th.poll(5000, max_events=1)
    assert time.monotonic() - t0 < 2.0
    assert [(e.fd, e.events) for e in evs] == [(bad, CTL_ERR)]
    assert h.count(Hook.BEFORE_WAIT) == waits
    assert h.t.dump(bad).running_mask == 1
    assert th.leave_all() == 0
    evs = th.poll(5000, max_events=1)
    assert [(e.fd, e.events & State.POLL_IN) for e in evs] == [(busy, State.POLL_IN)]
    assert th.leave_all() == 0
    assert h.t.dump(bad).running_mask == 0 and h.t.dump(busy).running_mask == 0


def test_owner_retry_after_a_report_is_reported_again(make, tmp_path):
    """Per attempt: the owner hears of its failure, stops and wants again;
    the new ADD fails too and is reported again (same incarnation)."""
    h = make(1, 1)
    th = h.th[0]
    fd, _ = h.pair()
    h.insert(fd)
    turn_into_regular_file(fd, tmp_path)
    gen = h.t.dump(fd).generation
    th.want_recv(fd)
    assert [(e.fd, e.events, e.gen) for e in th.poll(0)] == [(fd, CTL_ERR, gen)]
    th.leave_all()
    assert th.poll(0) == []
    th.stop_recv(fd)
    th.want_recv(fd)
    assert [(e.fd, e.events, e.gen) for e in th.poll(0)] == [(fd, CTL_ERR, gen)]
    th.leave_all()
    assert th.poll(0) == []
    assert h.t.dump(fd).running_mask == 0


def test_probe_leaves_the_scratch_epoll_empty_and_refuses_o_path(make, tmp_path):
    """Non-sockets are probed with ADD + DEL on the table's scratch epoll:
    nothing stays registered there (a leftover would be a stale watch), a
    pipe and an eventfd are accepted, an O_PATH fd and /dev/null refused."""
    before = epoll_fds()
    h = make(2, 1)
    ours = epoll_fds() - before
    scratch = ours - {th.epfd for th in h.th}
    require(len(scratch) == 1, f"one scratch epoll, got {ours}")
    (probe,) = scratch
    r, w = os.pipe()
    h.keep_fd(w)
    h.insert(r)
    efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    h.insert(efd)
    assert epoll_regs(probe) == []
    path = os.open(tmp_path, os.O_PATH | os.O_CLOEXEC)
    null = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    try:
        for f in (path, null):
            with pytest.raises(OSError) as exc:
                h.insert(f)
            assert exc.value.errno == errno.EPERM
    finally:
        os.close(path)
        os.close(null)
    with pytest.raises(OSError) as exc:
        h.insert(path)                          # closed now
    assert exc.value.errno == errno.EBADF
    assert epoll_regs(probe) == []
    h.th[0].want_recv(r)
    os.write(w, b"x")
    evs = h.th[0].poll(0)
    assert [(e.fd, e.events & State.POLL_IN) for e in evs] == [(r, State.POLL_IN)]
    h.th[0].leave_all()


def test_exclusive_change_after_number_swapped_reports_without_add(make):
    """The exclusive DEL+ADD with the old file still alive elsewhere (a dup):
    DEL of the number finds the stranger (ENOENT), no ADD is made, the owner
    hears of it once; the old registration is the kernel's (unremovable by
    number), polled says nothing is ours."""
    h = make(1, 1)
    th = h.th[0]
    fd, _ = h.pair()
    h.keep_fd(os.dup(fd))
    h.insert(fd, exclusive=True)
    th.want_recv(fd)
    th.update_pass()
    stranger, p2 = socket.socketpair()
    h.keep(p2)
    os.dup2(stranger.fileno(), fd)
    stranger.close()
    adds = th.counters()["ctl_add"]
    th.want_send(fd)
    evs = th.poll(0)
    try:
        assert [(e.fd, e.events & CTL_ERR) for e in evs] == [(fd, CTL_ERR)]
        assert th.counters()["ctl_add"] == adds
        info = h.t.dump(fd)
        assert info.ctl_errno == errno.ENOENT
        assert (info.polled_recv, info.polled_send) == (0, 0)
    finally:
        th.leave_all()
