"""Each step of the native fd core's protocols, one at a time (fdcore/fd.h).

Thread *contexts* are driven step by step from the test's own OS thread:
`h.th[1].enter(fd)` then `h.th[0].delete(fd)` is an exact interleaving. Every
fd put in the table is a real socket (the table owns it and closes it), and
every close is checked for real: the number is gone (EBADF) and the
CLOSE_END hook fired exactly once for that (fd, generation).
"""
from __future__ import annotations

import errno
import os
import socket
import threading

import pytest

from sockherd.fdcore import Hook, Outcome, State
from sockherd.fdcore._fdcore import lib

from fd_harness import (
    MAXFD,
    OWNER,
    EPOLLIN,
    EPOLLOUT,
    EPOLLRDHUP,
    EPOLLEXCLUSIVE,
    is_closed,
    epoll_regs,
    kernel_events,
    assert_clean,
    assert_closed_once,
)

pytestmark = pytest.mark.timeout(60)

# ---- insert ------------------------------------------------------------------


def test_insert_state(make):
    h = make(3, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b101, kind=7)
    i = h.t.dump(fd)
    assert i.tgid == 1 and i.refcount == 0
    assert i.state == State.READY_R | State.READY_W
    assert not i.state & (State.ACTIVE_R | State.ACTIVE_W)
    assert (i.owner, i.kind, i.thread_mask) == (OWNER, 7, 0b101)
    assert (i.running_mask, i.update_mask, i.polled_recv, i.polled_send) == (0, 0, 0, 0)
    assert i.generation == 0 and i.nb_takeover == 0 and not i.in_shared_list
    assert [x.fd for x in h.t.show_fd()] == [fd]
    # insert programs nothing: no poller has it
    for th in h.th:
        assert th.update_pass() == 0
        assert kernel_events(th.epfd, fd) is None


def test_insert_flags_recorded(make):
    h = make(1, 1)
    fd, _ = h.pair()
    h.insert(fd, cloned=True, exclusive=True)
    st = h.t.dump(fd).state
    assert st & State.CLONED and st & State.EXCLUSIVE and not st & State.LINGER_RISK
    fd2, _ = h.pair()
    h.insert(fd2, linger_risk=True)
    st = h.t.dump(fd2).state
    assert st & State.LINGER_RISK and not st & (State.CLONED | State.EXCLUSIVE)


def test_insert_twice_eexist(make):
    h = make(2, 2)
    fd, _ = h.pair()
    h.insert(fd, mask=1)
    before = h.t.dump(fd)
    for tgid in (1, 2):
        with pytest.raises(OSError) as ei:
            h.insert(fd, owner=0x999, tgid=tgid, mask=1)
        assert ei.value.errno == errno.EEXIST
    assert h.t.dump(fd) == before


@pytest.mark.parametrize("kw", [
    dict(tgid=0), dict(tgid=3), dict(tgid=-1), dict(mask=0), dict(mask=1 << 2),
    dict(owner=0),
], ids=["tgid0", "tgid-too-big", "tgid-neg", "mask0", "mask-outside-group", "owner0"])
def test_insert_einval(make, kw):
    h = make(4, 2)   # groups of 2 threads: bits 0b11
    fd, _ = h.pair()
    h.keep_fd(fd)
    args = dict(owner=OWNER, tgid=1, mask=1)
    args.update(kw)
    with pytest.raises(OSError) as ei:
        h.insert(fd, **args)
    assert ei.value.errno == errno.EINVAL
    assert_clean(h.t.dump(fd), fd)
    assert not is_closed(fd)
    # the entry is still usable
    h.insert(fd, mask=0b11)
    assert h.t.dump(fd).thread_mask == 0b11
    h._extra_fds.remove(fd)


def test_insert_bad_flags_einval(make):
    h = make(1, 1)
    fd, _ = h.pair()
    h.keep_fd(fd)
    for bad in (lib.FDC_MUST_CLOSE, lib.FDC_ACTIVE_R, 1 << 30):
        assert lib.fdc_insert(h.t.ptr, fd, OWNER, 0, 1, 1, bad) == -errno.EINVAL
    assert_clean(h.t.dump(fd), fd)


@pytest.mark.parametrize("bad", [MAXFD, MAXFD + 5, -1])
def test_insert_out_of_table_ebadf(make, bad):
    h = make(1, 1)
    with pytest.raises(OSError) as ei:
        h.insert(bad)
    assert ei.value.errno == errno.EBADF
    with pytest.raises(OSError) as ei:
        h.t.dump(bad)
    assert ei.value.errno == errno.EBADF


# ---- direction verbs -----------------------------------------------------------

VERBS = {
    "want_recv": (State.ACTIVE_R, True), "stop_recv": (State.ACTIVE_R, False),
    "want_send": (State.ACTIVE_W, True), "stop_send": (State.ACTIVE_W, False),
    "may_recv": (State.READY_R, True), "cant_recv": (State.READY_R, False),
    "may_send": (State.READY_W, True), "cant_send": (State.READY_W, False),
}


@pytest.mark.parametrize("verb", list(VERBS))
def test_verb_flips_exactly_its_bit(make, verb):
    bit, sets = VERBS[verb]
    h = make(2, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=1)
    th = h.th[0]
    # put the bit in the opposite position first
    opposite = {"want": "stop", "stop": "want", "may": "cant", "cant": "may"}
    if bool(h.t.dump(fd).state & bit) == sets:
        head, tail = verb.split("_")
        getattr(th, f"{opposite[head]}_{tail}")(fd)
    th.update_pass()
    before = h.t.dump(fd)
    assert bool(before.state & bit) != sets
    getattr(th, verb)(fd)
    after = h.t.dump(fd)
    assert int(before.state) ^ int(after.state) == int(bit)
    # idempotent
    getattr(th, verb)(fd)
    assert h.t.dump(fd).state == after.state
    is_active = bit in (State.ACTIVE_R, State.ACTIVE_W)
    # ACTIVE flips program an update (sole owner: local list); READY ones never
    assert after.update_mask == (1 if is_active else 0)
    assert not after.in_shared_list
    assert th.update_pass() == (1 if is_active else 0)
    assert h.t.dump(fd).update_mask == 0


def test_verbs_on_closed_fd_ebadf(make):
    h = make(2, 2)
    fd, _ = h.pair()
    for verb in VERBS:
        for th in h.th:
            with pytest.raises(OSError) as ei:
                getattr(th, verb)(fd)
            assert ei.value.errno == errno.EBADF
    with pytest.raises(OSError) as ei:
        h.th[0].want_recv(MAXFD)
    assert ei.value.errno == errno.EBADF
    h.keep_fd(fd)


def test_want_recv_registers_in_kernel_and_stop_deletes(make):
    h = make(1, 1)
    fd, peer = h.pair()
    h.insert(fd)
    th = h.th[0]
    c0 = th.counters()
    th.want_recv(fd)
    assert th.update_pass() == 1
    i = h.t.dump(fd)
    assert i.polled_recv == 1 and i.polled_send == 0 and i.update_mask == 0
    ev = kernel_events(th.epfd, fd)
    assert ev & EPOLLIN and ev & EPOLLRDHUP and not ev & EPOLLOUT
    assert [r[2] for r in epoll_regs(th.epfd) if r[0] == fd] == [fd]   # gen 0 << 32 | fd
    th.want_send(fd)
    assert th.update_pass() == 1   # MOD
    assert kernel_events(th.epfd, fd) & EPOLLOUT
    assert h.t.dump(fd).polled_send == 1
    th.stop_recv(fd)
    th.stop_send(fd)
    assert th.update_pass() == 1   # DEL
    assert kernel_events(th.epfd, fd) is None
    i = h.t.dump(fd)
    assert (i.polled_recv, i.polled_send) == (0, 0)
    c1 = th.counters()
    assert (c1["ctl_add"] - c0["ctl_add"], c1["ctl_mod"] - c0["ctl_mod"],
            c1["ctl_del"] - c0["ctl_del"], c1["ctl_err"]) == (1, 1, 1, 0)


# ---- delete ------------------------------------------------------------------


@pytest.mark.parametrize("who", [0, 1, 2], ids=["owner", "same-group-nonowner", "other-group"])
def test_delete_idle_closes_now(make, who):
    h = make(4, 2)   # group 1: tids 0,1; group 2: tids 2,3
    fd, peer = h.pair()
    h.insert(fd, mask=1, kind=3)
    h.th[0].want_recv(fd)
    h.th[0].update_pass()
    assert kernel_events(h.th[0].epfd, fd) is not None
    assert h.th[who].delete(fd) is True
    assert_closed_once(h, fd, 0)
    assert h.count(Hook.CLOSE_END, tid=who) == 1
    assert kernel_events(h.th[0].epfd, fd) is None
    # the peer sees the close
    assert peer.recv(1) == b""


def test_delete_closed_fd_ebadf(make):
    h = make(2, 2)
    fd, _ = h.pair()
    h.insert(fd)
    assert h.th[0].delete(fd)
    for th in h.th:
        with pytest.raises(OSError) as ei:
            th.delete(fd)
        assert ei.value.errno == errno.EBADF
    assert h.closes(fd, 0) == 1
    for bad in (MAXFD, -1):
        with pytest.raises(OSError) as ei:
            h.th[0].delete(bad)
        assert ei.value.errno == errno.EBADF


def test_delete_never_inserted_ebadf(make):
    h = make(1, 1)
    fd, _ = h.pair()
    h.keep_fd(fd)
    with pytest.raises(OSError) as ei:
        h.th[0].delete(fd)
    assert ei.value.errno == errno.EBADF
    assert not is_closed(fd)
    assert h.count(Hook.CLOSE_BEGIN) == 0


def test_delete_disown_does_not_close(make):
    h = make(1, 1)
    fd, _ = h.pair()
    h.keep_fd(fd)
    h.insert(fd, disown=True)
    assert h.th[0].delete(fd)
    assert h.closes(fd, 0) == 1
    assert_clean(h.t.dump(fd), fd)
    assert not is_closed(fd)


def test_delete_linger_risk_sends_rst(make):
    h = make(1, 1)
    srv = h.keep(socket.create_server(("127.0.0.1", 0)))
    cli = h.keep(socket.create_connection(srv.getsockname()))
    conn, _ = srv.accept()
    fd = conn.detach()
    h.insert(fd, linger_risk=True)
    assert h.th[0].delete(fd)
    assert_closed_once(h, fd, 0)
    with pytest.raises(ConnectionResetError):
        cli.recv(1)


def test_reinsert_after_close_new_generation(make):
    h = make(1, 1)
    fd, _ = h.pair()
    h.insert(fd)
    assert h.th[0].delete(fd)
    h.reuse(fd)
    h.insert(fd, owner=0x77)
    i = h.t.dump(fd)
    assert i.generation == 1 and i.owner == 0x77 and i.state == State.READY_R | State.READY_W
    out, gen = h.th[0].enter(fd)
    assert (out, gen) == (Outcome.DONE, 1)
    assert h.th[0].leave(fd, gen) == Outcome.DONE
    assert h.th[0].delete(fd)
    assert_closed_once(h, fd, 1)


# ---- enter / leave -----------------------------------------------------------


def test_enter_leave_done(make):
    h = make(2, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b11)
    c0 = h.th[1].counters()
    out, gen = h.th[1].enter(fd)
    assert (out, gen) == (Outcome.DONE, 0)
    i = h.t.dump(fd)
    assert i.running_mask == 0b10 and i.refcount == 0   # the running bit pins, not a ref
    out0, gen0 = h.th[0].enter(fd)                      # two owners inside at once
    assert out0 == Outcome.DONE and h.t.dump(fd).running_mask == 0b11
    assert h.th[1].leave(fd, gen) == Outcome.DONE
    assert h.th[0].leave(fd, gen0) == Outcome.DONE
    i = h.t.dump(fd)
    assert i.running_mask == 0 and i.refcount == 0 and i.thread_mask == 0b11
    assert h.th[1].counters() == c0
    assert h.count(Hook.ENTER_RUNNING) == 2 and h.count(Hook.LEAVE) == 2
    assert h.count(Hook.ENTER_RETRY) == 0


def test_enter_closed_fd(make):
    h = make(1, 1)
    fd, _ = h.pair()
    h.keep_fd(fd)
    c0 = h.th[0].counters()["poll_drop_fd"]
    assert h.th[0].enter(fd)[0] == Outcome.CLOSED
    assert h.th[0].counters()["poll_drop_fd"] == c0 + 1
    assert h.th[0].enter(MAXFD)[0] == Outcome.CLOSED
    assert h.t.dump(fd).refcount == 0


def test_enter_other_group_closed(make):
    h = make(2, 2)
    fd, _ = h.pair()
    h.insert(fd, tgid=1, mask=1)
    c0 = h.th[1].counters()["poll_drop_fd"]
    assert h.th[1].enter(fd)[0] == Outcome.CLOSED
    assert h.th[1].counters()["poll_drop_fd"] == c0 + 1
    i = h.t.dump(fd)
    assert i.running_mask == 0 and i.refcount == 0 and i.update_mask == 0


def test_enter_non_owner_migrated(make):
    h = make(2, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b01)
    c0 = h.th[1].counters()["poll_skip_fd"]
    assert h.th[1].enter(fd)[0] == Outcome.MIGRATED
    assert h.th[1].counters()["poll_skip_fd"] == c0 + 1
    i = h.t.dump(fd)
    assert i.running_mask == 0 and i.refcount == 0
    assert i.update_mask == 0b10 and not i.in_shared_list   # its own DEL programmed
    assert h.count(Hook.ENTER_RUNNING) == 0                  # never set a running bit
    assert h.th[1].update_pass() == 0                        # nothing registered: no syscall
    assert h.t.dump(fd).update_mask == 0
    assert h.count(Hook.UPDATE_CONSUMED, tid=1, fd=fd) == 1


def test_leave_without_running_bit_or_stale_gen(make):
    h = make(1, 1)
    fd, _ = h.pair()
    h.insert(fd)
    assert h.th[0].leave(fd, 0) == Outcome.CLOSED     # never entered
    out, gen = h.th[0].enter(fd)
    assert h.th[0].leave(fd, gen + 1) == Outcome.CLOSED
    assert h.t.dump(fd).running_mask == 1             # a wrong gen does not drop the bit
    assert h.th[0].leave(fd, gen) == Outcome.DONE
    assert h.t.dump(fd).running_mask == 0


def test_leave_of_old_incarnation_closed(make):
    """The handler's incarnation was closed and the number reused: leave with
    the old gen reports CLOSED and does not touch the new incarnation."""
    h = make(2, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b11)
    out, gen = h.th[1].enter(fd)
    assert out == Outcome.DONE
    assert h.th[1].delete(fd) is True      # the handler deletes its own fd: closes now
    assert_closed_once(h, fd, gen)
    h.reuse(fd)
    h.insert(fd, mask=0b11)
    before = h.t.dump(fd)
    assert before.generation == gen + 1
    assert h.th[1].leave(fd, gen) == Outcome.CLOSED
    assert h.t.dump(fd) == before


def test_leave_programs_del_for_unwanted_direction(make):
    h = make(1, 1)
    fd, peer = h.pair()
    h.insert(fd)
    th = h.th[0]
    th.want_recv(fd)
    th.update_pass()
    peer.send(b"x")
    evs = th.poll(1000)
    assert [(e.fd, e.gen) for e in evs] == [(fd, 0)]
    assert evs[0].events & State.POLL_IN and evs[0].owner == OWNER
    assert h.t.dump(fd).running_mask == 1
    th.stop_recv(fd)            # the handler stops reading
    assert th.leave(fd, 0) == Outcome.DONE
    assert h.t.dump(fd).update_mask == 1
    assert th.update_pass() == 1
    assert kernel_events(th.epfd, fd) is None and h.t.dump(fd).polled_recv == 0
    assert th.poll(0) == []


def test_handler_deletes_its_own_fd(make):
    h = make(1, 1)
    fd, peer = h.pair()
    h.insert(fd)
    th = h.th[0]
    th.want_recv(fd)
    peer.send(b"x")
    (ev,) = th.poll(1000)
    assert th.delete(fd) is True          # we are the only runner: closes now
    assert_closed_once(h, fd, ev.gen)
    assert th.leave(fd, ev.gen) == Outcome.CLOSED
    assert th.poll(0) == []


# ---- takeover ----------------------------------------------------------------


def test_takeover_success(make):
    h = make(3, 1)
    fd, peer = h.pair()
    h.insert(fd, mask=0b001)
    h.th[0].want_recv(fd)
    h.th[0].update_pass()
    assert h.t.dump(fd).polled_recv == 0b001
    c0 = h.th[2].counters()["fd_takeover"]
    assert h.th[2].takeover(fd, OWNER) is True
    i = h.t.dump(fd)
    assert i.thread_mask == 0b100 and i.running_mask == 0 and i.refcount == 0
    assert not i.state & State.ACTIVE_R          # recv stopped, the new owner re-arms
    assert i.nb_takeover == 1 and i.owner == OWNER
    assert h.th[2].counters()["fd_takeover"] == c0 + 1
    assert h.count(Hook.TAKEOVER_OWNED, tid=2, fd=fd) == 1
    # the old owner still has it in its epoll until it sees it: it then drops it
    assert kernel_events(h.th[0].epfd, fd) is not None
    assert h.th[0].enter(fd)[0] == Outcome.MIGRATED
    assert h.t.dump(fd).update_mask & 0b001
    assert h.th[0].update_pass() == 1
    assert kernel_events(h.th[0].epfd, fd) is None and h.t.dump(fd).polled_recv == 0
    # the new owner re-arms on its own poller only
    h.th[2].update_pass()
    h.th[2].want_recv(fd)
    i = h.t.dump(fd)
    assert i.update_mask == 0b100 and not i.in_shared_list
    h.th[2].update_pass()
    assert h.t.dump(fd).polled_recv == 0b100
    peer.send(b"x")
    assert [e.fd for e in h.th[2].poll(1000)] == [fd]
    assert h.th[2].leave(fd, 0) == Outcome.DONE
    assert h.th[0].poll(0) == []
    # a second takeover counts too
    assert h.th[1].takeover(fd, OWNER) is True
    assert h.t.dump(fd).nb_takeover == 2 and h.t.dump(fd).thread_mask == 0b010


def test_takeover_wrong_owner(make):
    h = make(2, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=1)
    h.th[0].want_recv(fd)
    h.th[0].update_pass()
    before = h.t.dump(fd)
    assert h.th[1].takeover(fd, OWNER + 1) is False
    assert h.t.dump(fd) == before
    assert h.th[1].counters()["fd_takeover"] == 0
    assert h.count(Hook.TAKEOVER_OWNED) == 0


def test_takeover_while_inside_busy(make):
    h = make(2, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=1)
    h.th[0].want_recv(fd)
    h.th[0].update_pass()
    out, gen = h.th[0].enter(fd)
    before = h.t.dump(fd)
    assert h.th[1].takeover(fd, OWNER) is False
    assert h.t.dump(fd) == before
    assert before.running_mask == 1 and before.state & State.ACTIVE_R
    assert h.th[0].leave(fd, gen) == Outcome.DONE
    assert h.th[1].takeover(fd, OWNER) is True


def test_takeover_closed_or_foreign(make):
    h = make(2, 2)
    fd, _ = h.pair()
    h.insert(fd, tgid=1, mask=1)
    before = h.t.dump(fd)
    assert h.th[1].takeover(fd, OWNER) is False       # group 2 cannot take a group 1 fd
    assert h.t.dump(fd) == before
    assert h.th[0].delete(fd)
    assert h.th[0].takeover(fd, OWNER) is False
    assert h.th[0].takeover(fd, 0) is False          # owner 0 = closed: still no
    assert_clean(h.t.dump(fd), fd)
    for bad in (MAXFD, -1):
        with pytest.raises(OSError) as ei:
            h.th[0].takeover(bad, OWNER)
        assert ei.value.errno == errno.EBADF


def test_takeover_by_co_owner_einval(make):
    """One owner among several cannot take the fd for itself alone (its
    running bit would look like an ordinary runner's): EINVAL, nothing moves."""
    h = make(3, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b011)
    h.th[0].want_recv(fd)
    for th in h.th:
        th.update_pass()
    before = h.t.dump(fd)
    for tid in (0, 1):
        with pytest.raises(OSError) as ei:
            h.th[tid].takeover(fd, OWNER)
        assert ei.value.errno == errno.EINVAL
        assert h.t.dump(fd) == before
        assert h.th[tid].counters()["fd_takeover"] == 0
    # an outsider can
    assert h.th[2].takeover(fd, OWNER) is True
    assert h.t.dump(fd).thread_mask == 0b100


def test_takeover_of_own_sole_fd_is_a_takeover(make):
    h = make(2, 1)
    fd, peer = h.pair()
    h.insert(fd, mask=0b01)
    h.th[0].want_recv(fd)
    h.th[0].update_pass()
    assert h.th[0].takeover(fd, OWNER) is True
    i = h.t.dump(fd)
    assert i.thread_mask == 0b01 and i.nb_takeover == 1 and not i.state & State.ACTIVE_R
    assert h.th[0].counters()["fd_takeover"] == 1
    # recv stopped, and the taker, which still polled it, was told: its next
    # pass drops the registration before it sleeps, so data arriving now
    # wakes nobody (no report, no spurious wake-up)
    assert h.t.dump(fd).update_mask == 0b01
    assert h.th[0].update_pass() == 1
    assert h.t.dump(fd).polled_recv == 0 and kernel_events(h.th[0].epfd, fd) is None
    peer.send(b"x")
    assert h.th[0].poll(50) == []
    assert h.th[0].counters()["poll_io"] == 0


def test_takeover_keeps_wanted_send_polled(make):
    """recv is stopped at takeover, but a send still wanted must be polled by
    the new owner (nobody else would tell its poller)."""
    h = make(3, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b001)
    h.th[0].want_send(fd)
    h.th[0].update_pass()
    assert h.t.dump(fd).polled_send == 0b001
    assert h.th[2].takeover(fd, OWNER) is True
    i = h.t.dump(fd)
    assert i.state & State.ACTIVE_W and i.update_mask & 0b100
    assert h.th[2].update_pass() == 1
    assert h.t.dump(fd).polled_send & 0b100
    assert kernel_events(h.th[2].epfd, fd) & EPOLLOUT
    evs = h.th[2].poll(1000)                  # a socketpair end is writable
    assert [(e.fd, bool(e.events & State.POLL_OUT)) for e in evs] == [(fd, True)]
    assert h.th[2].leave(fd, evs[0].gen) == Outcome.DONE
    # the old owner drops its registration when it sees the fd
    assert h.th[0].poll(1000) == []
    assert h.th[0].update_pass() == 1
    assert h.t.dump(fd).polled_send == 0b100


# ---- update programming ------------------------------------------------------


def test_update_local_list_for_sole_owner(make):
    h = make(3, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b010)
    h.th[1].want_recv(fd)
    i = h.t.dump(fd)
    assert i.update_mask == 0b010 and not i.in_shared_list
    # other threads' passes do not see it
    assert h.th[0].update_pass() == 0 and h.th[2].update_pass() == 0
    assert h.t.dump(fd).update_mask == 0b010
    assert h.th[1].update_pass() == 1
    i = h.t.dump(fd)
    assert i.update_mask == 0 and i.polled_recv == 0b010
    assert kernel_events(h.th[1].epfd, fd) is not None
    assert kernel_events(h.th[0].epfd, fd) is None


def test_update_shared_list_last_consumer_removes(make):
    h = make(3, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b111)
    h.th[0].want_recv(fd)
    i = h.t.dump(fd)
    assert i.in_shared_list and i.update_mask == i.thread_mask == 0b111
    consumed = []
    h.at(Hook.UPDATE_CONSUMED, lambda tid, f, g: consumed.append(
        (tid, h.t.dump(f).update_mask)), fd=fd, once=False)
    for tid, left in ((2, 0b011), (0, 0b010), (1, 0)):
        assert h.th[tid].update_pass() == 1
        i = h.t.dump(fd)
        assert i.update_mask == left
        assert i.in_shared_list == bool(left)
        assert i.polled_recv & (1 << tid)
        assert kernel_events(h.th[tid].epfd, fd) & EPOLLIN
    assert consumed == [(2, 0b011), (0, 0b010), (1, 0)]
    assert h.t.dump(fd).polled_recv == 0b111
    # nothing left for anybody
    assert all(th.update_pass() == 0 for th in h.th)


def test_update_by_non_owner_wakes_owners(make):
    h = make(3, 1)
    fd, _ = h.pair()
    h.insert(fd, mask=0b001)
    w0 = [th.counters()["wakeups"] for th in h.th]
    h.th[1].want_recv(fd)       # a non-owner: the shared list, and wake the owner
    i = h.t.dump(fd)
    assert i.in_shared_list and i.update_mask == i.thread_mask == 0b001
    assert h.th[0].poll(0) == []
    w1 = [th.counters()["wakeups"] for th in h.th]
    assert w1[0] == w0[0] + 1
    i = h.t.dump(fd)
    assert i.polled_recv == 0b001 and i.update_mask == 0 and not i.in_shared_list
    assert kernel_events(h.th[0].epfd, fd) & EPOLLIN
    # nobody else was woken
    assert h.th[1].poll(0) == [] and h.th[2].poll(0) == []
    w2 = [th.counters()["wakeups"] for th in h.th]
    assert w2[1:] == w0[1:]


def test_update_by_other_group_wakes_all_owners(make):
    h = make(4, 2)
    fd, _ = h.pair()
    h.insert(fd, tgid=2, mask=0b11)      # tids 2 and 3
    h.th[0].stop_send(fd)                # no ACTIVE change: no update
    assert h.t.dump(fd).update_mask == 0
    h.th[0].want_recv(fd)
    i = h.t.dump(fd)
    assert i.in_shared_list and i.update_mask == 0b11
    for tid in (2, 3):
        w = h.th[tid].counters()["wakeups"]
        assert h.th[tid].poll(0) == []
        assert h.th[tid].counters()["wakeups"] == w + 1
        assert kernel_events(h.th[tid].epfd, fd) & EPOLLIN
    i = h.t.dump(fd)
    assert i.polled_recv == 0b11 and i.update_mask == 0 and not i.in_shared_list
    # group 1's pollers have nothing
    assert h.th[0].update_pass() == 0 and h.th[1].update_pass() == 0


# ---- listeners across groups -------------------------------------------------


@pytest.mark.parametrize("exclusive", [False, True])
def test_listener_fds_per_group(make, exclusive):
    h = make(4, 2)
    srv = socket.create_server(("127.0.0.1", 0), backlog=16)
    srv.setblocking(False)
    name = srv.getsockname()
    lfd = srv.detach()
    fds = h.t.insert_listener(lfd, OWNER, {1: 0b11, 2: 0b11}, kind=5, exclusive=exclusive)
    assert fds[1] == lfd and fds[2] != lfd and fds[2] >= 0
    for g, f in fds.items():
        i = h.t.dump(f)
        assert i.tgid == g and i.thread_mask == 0b11 and i.kind == 5
        assert i.state & State.CLONED and bool(i.state & State.EXCLUSIVE) == exclusive
        with socket.fromfd(f, socket.AF_INET, socket.SOCK_STREAM) as s:
            assert s.getsockname() == name
    assert os.fstat(fds[1]).st_ino == os.fstat(fds[2]).st_ino
    h.th[0].want_recv(fds[1])     # owner of a shared fd: shared list
    h.th[2].want_recv(fds[2])
    for th in h.th:
        th.update_pass()
    for th in h.th:
        mine = fds[th.tgid]
        ev = kernel_events(th.epfd, mine)
        assert ev & EPOLLIN and bool(ev & EPOLLEXCLUSIVE) == exclusive
        assert kernel_events(th.epfd, fds[3 - th.tgid]) is None
    for g in (1, 2):
        assert h.t.dump(fds[g]).polled_recv == 0b11
    cli = h.keep(socket.create_connection(name))
    got = []
    for th in h.th:
        for ev in th.poll(200 if th.tid == 0 else 0):
            assert ev.fd == fds[th.tgid] and ev.kind == 5
            got += th.accept(ev.fd)
            assert th.leave(ev.fd, ev.gen) == Outcome.DONE
    assert len(got) == 1
    for c in got:
        os.close(c)
    # closing one group's copy removes it from that group's instances (CLONED:
    # the description is still open under the other number)
    assert h.th[1].delete(fds[1]) is True
    assert_closed_once(h, fds[1], 0)
    for th in h.th[:2]:
        assert kernel_events(th.epfd, fds[1]) is None
    for th in h.th[2:]:
        assert kernel_events(th.epfd, fds[2]) is not None
    cli2 = h.keep(socket.create_connection(name))
    assert h.th[0].poll(50) == [] and h.th[1].poll(0) == []
    evs = h.th[2].poll(1000)
    assert [e.fd for e in evs] == [fds[2]]
    for c in h.th[2].accept(fds[2]):
        os.close(c)
    assert h.th[2].leave(fds[2], 0) == Outcome.DONE
    assert h.th[3].delete(fds[2]) is True
    assert_closed_once(h, fds[2], 0)
    for th in h.th:
        assert epoll_regs(th.epfd) == []
    del cli, cli2


@pytest.mark.parametrize("closer", [2, 1], ids=["other-group", "runner-of-group"])
def test_cloned_listener_closed_from_another_group(make, closer):
    """Group 2 deletes group 1's copy of a shared listener (e.g. a soft-stop
    driven from another group); with a group-1 runner inside, the close is
    deferred to it. Either way group 1's epoll instances lose it, while
    group 2's copy keeps working."""
    h = make(4, 2)
    srv = socket.create_server(("127.0.0.1", 0), backlog=16)
    srv.setblocking(False)
    name = srv.getsockname()
    fds = h.t.insert_listener(srv.detach(), OWNER, {1: 0b11, 2: 0b11})
    h.th[0].want_recv(fds[1])
    h.th[3].want_recv(fds[2])
    for th in h.th:
        th.update_pass()
    gen = None
    if closer == 1:
        out, gen = h.th[1].enter(fds[1])
        assert out == Outcome.DONE
    assert h.th[2].delete(fds[1]) is (closer == 2)
    if closer == 1:
        assert kernel_events(h.th[0].epfd, fds[1]) is not None
        assert h.th[1].leave(fds[1], gen) == Outcome.CLOSED
    assert_closed_once(h, fds[1], 0)
    assert h.count(Hook.CLOSE_END, tid=closer) == 1
    for th in h.th[:2]:
        assert kernel_events(th.epfd, fds[1]) is None
        assert th.poll(0) == []
    cli = h.keep(socket.create_connection(name))
    evs = h.th[3].poll(1000)
    assert [e.fd for e in evs] == [fds[2]]
    for c in h.th[3].accept(fds[2]):
        os.close(c)
    assert h.th[3].leave(fds[2], evs[0].gen) == Outcome.DONE
    assert h.th[0].poll(0) == [] and h.th[1].poll(0) == []
    del cli


def test_listener_fds_bad_groups(make):
    h = make(2, 2)
    srv = h.keep(socket.create_server(("127.0.0.1", 0)))
    for masks in ({3: 1}, {0: 1}, {}):
        with pytest.raises(OSError) as ei:
            h.t.insert_listener(srv.fileno(), OWNER, masks)
        assert ei.value.errno == errno.EINVAL
    assert h.t.show_fd() == []


# ---- generation in epoll data ------------------------------------------------


def test_stale_report_of_old_incarnation_dropped(make):
    """A registration of the old incarnation outlives its close (the file is
    still open under another number, and the fd was not flagged CLONED):
    its reports carry the old generation and are never delivered."""
    h = make(1, 1)
    th = h.th[0]
    fd, peer = h.pair()
    h.insert(fd)
    th.want_recv(fd)
    th.update_pass()
    alias = h.keep_fd(os.dup(fd))
    peer.send(b"old")
    assert th.delete(fd) is True
    assert_closed_once(h, fd, 0)
    # still registered in the kernel under (old file, fd) with gen 0
    assert [(r[0], r[2]) for r in epoll_regs(th.epfd)] == [(fd, fd)]
    peer2 = h.reuse(fd)
    h.insert(fd, owner=0x42)
    s0 = th.counters()["poll_stale"]
    assert th.poll(0) == []
    assert th.counters()["poll_stale"] == s0 + 1
    th.want_recv(fd)
    th.update_pass()
    assert sorted(r[2] for r in epoll_regs(th.epfd) if r[0] == fd) == [fd, (1 << 32) | fd]
    peer2.send(b"new")
    evs = th.poll(1000)
    assert [(e.fd, e.gen, e.owner) for e in evs] == [(fd, 1, 0x42)]
    assert th.counters()["poll_stale"] == s0 + 2
    assert th.leave(fd, 1) == Outcome.DONE
    os.close(alias)
    h._extra_fds.remove(alias)
    assert [r[2] for r in epoll_regs(th.epfd) if r[0] == fd] == [(1 << 32) | fd]


# ---- poller odds and ends ------------------------------------------------------


def test_poll_of_inactive_direction_is_not_delivered(make):
    h = make(1, 1)
    th = h.th[0]
    fd, peer = h.pair()
    h.insert(fd)
    th.want_recv(fd)
    th.update_pass()
    peer.send(b"x")
    # someone stops recv without the poller having run its pass yet: the
    # report arrives for a direction nobody wants, is dropped, and a DEL follows
    h.at(Hook.BEFORE_WAIT, lambda *a: th.stop_recv(fd))
    assert th.poll(1000) == []
    assert th.counters()["wake_nowork"] == 1
    assert h.t.dump(fd).running_mask == 0
    th.update_pass()
    assert kernel_events(th.epfd, fd) is None


def test_wake_from_another_thread(make):
    h = make(2, 1)
    th = h.th[1]
    timer = threading.Timer(0.05, h.t.wake, (1,))
    timer.start()
    assert th.poll(5000) == []
    timer.join()
    assert th.counters()["wakeups"] == 1
    with pytest.raises(OSError) as ei:
        h.t.wake(2)
    assert ei.value.errno == errno.EINVAL
