"""Kernel truth of the per-thread epoll pollers (notes E/T4, A.10, A.11).

After every thread of a table ran its update pass, what each thread believes
its epoll instance holds (the fd's polled_recv/polled_send bits for the
thread) must be exactly what the kernel lists in /proc/self/fdinfo/<epfd>:

    tfd: <fd> events: <hex mask> data: <hex>

(the thread's own wake-up eventfd, data 0xffffffffffffffff, is ignored).
Every fd with a polled bit is listed once, with EPOLLIN iff polled_recv and
EPOLLOUT iff polled_send, data == generation << 32 | fd, and nothing else is
listed. On top of that, the desired state converges: an owner thread polls
exactly the ACTIVE directions, a non-owner polls nothing unless the fd was
taken over from it (the old owner drops its registration lazily, when it
next sees a report for the fd).
"""
from __future__ import annotations

import errno
import os
import random
import re
import socket
import threading
import time
from dataclasses import dataclass, field

import pytest

from sockherd.fdcore.table import Outcome, State, Table

pytestmark = pytest.mark.timeout(90)

EPOLLIN = 0x1
EPOLLOUT = 0x4
EPOLLRDHUP = 0x2000
EPOLLEXCLUSIVE = 0x10000000
WAKE_TOKEN = 0xFFFFFFFFFFFFFFFF

_TFD = re.compile(r"^tfd:\s*(\d+)\s+events:\s*([0-9a-fA-F]+)\s+data:\s*([0-9a-fA-F]+)", re.M)


@dataclass(frozen=True)
class Reg:
    fd: int
    events: int
    data: int


def kernel_regs(epfd: int) -> list[Reg]:
    """What the kernel has in epoll instance epfd, minus the wake-up eventfd."""
    with open(f"/proc/self/fdinfo/{epfd}") as f:
        text = f.read()
    regs = [Reg(int(m[1]), int(m[2], 16), int(m[3], 16)) for m in _TFD.finditer(text)]
    return [r for r in regs if r.data != WAKE_TOKEN]


def converge(t: Table, max_rounds: int = 10) -> None:
    """Runs update passes on every thread until a round makes no syscall."""
    for _ in range(max_rounds):
        if sum(th.update_pass() for th in t.threads) == 0:
            return
    pytest.fail(f"update passes still issue epoll_ctl calls after {max_rounds} rounds")


def assert_kernel_truth(t: Table, *, where: str = "") -> None:
    """polled bits == /proc fdinfo for every thread, plus convergence."""
    infos = {i.fd: i for i in t.show_fd()}
    problems: list[str] = []
    # numbers out of the table (closed, or open but not inserted) keep no
    # polled or update bits: a close leaves its entry clean (I5)
    top = max(int(n) for n in os.listdir("/proc/self/fd")) + 1
    for fd in range(min(top, t.maxfd)):
        if fd not in infos:
            i = t.dump(fd)
            if i.polled_recv or i.polled_send or i.update_mask or i.thread_mask or i.running_mask:
                problems.append(f"fd {fd} is out of the table but its entry is not clean: {i}")
    for th in t.threads:
        regs = kernel_regs(th.epfd)
        listed: dict[int, Reg] = {}
        for r in regs:
            if r.fd in listed:
                problems.append(f"thread {th.tid}: fd {r.fd} listed twice: {listed[r.fd]} {r}")
            listed[r.fd] = r
        # (an fd of another group listed here shows up as "no polled bit")
        expected = {
            fd: i for fd, i in infos.items()
            if i.tgid == th.tgid and ((i.polled_recv | i.polled_send) & th.bit)
        }
        for fd in sorted(set(listed) - set(expected)):
            problems.append(f"thread {th.tid}: kernel lists fd {fd} ({listed[fd]}) "
                            f"but no polled bit says so ({infos.get(fd)})")
        for fd in sorted(set(expected) - set(listed)):
            problems.append(f"thread {th.tid}: polled bits claim fd {fd} but the kernel "
                            f"does not list it ({expected[fd]})")
        for fd in sorted(set(expected) & set(listed)):
            i, r = expected[fd], listed[fd]
            # a recv-side registration is a hang-up watch alone (no EPOLLIN)
            # when WATCH_HUP holds it and ACTIVE_R is off
            want_in = bool(i.polled_recv & th.bit) and bool(
                i.state & State.ACTIVE_R or not i.state & State.WATCH_HUP)
            want_out = bool(i.polled_send & th.bit)
            excl = bool(i.state & State.EXCLUSIVE)
            if bool(r.events & EPOLLIN) != want_in or bool(r.events & EPOLLOUT) != want_out:
                problems.append(f"thread {th.tid}: fd {fd} events {r.events:#x} vs "
                                f"polled recv={want_in} send={want_out}")
            # polled_hup records the kind of the recv side: a watch alone
            watch = bool(i.polled_hup & th.bit)
            if watch and not i.polled_recv & th.bit:
                problems.append(f"thread {th.tid}: fd {fd} polled_hup without polled_recv")
            if bool(r.events & EPOLLIN) != (bool(i.polled_recv & th.bit) and not watch):
                problems.append(f"thread {th.tid}: fd {fd} events {r.events:#x} vs "
                                f"polled recv={bool(i.polled_recv & th.bit)} hup={watch}")
            if bool(r.events & EPOLLEXCLUSIVE) != excl:
                problems.append(f"thread {th.tid}: fd {fd} events {r.events:#x}, EXCLUSIVE={excl}")
            if i.polled_recv & th.bit and not excl and not r.events & EPOLLRDHUP:
                problems.append(f"thread {th.tid}: fd {fd} polled for recv without RDHUP "
                                f"({r.events:#x})")
            if r.data != (i.generation << 32 | fd):
                problems.append(f"thread {th.tid}: fd {fd} data {r.data:#x} != "
                                f"gen {i.generation} << 32 | fd")
    # convergence of the desired state, and no update left behind (I6)
    for fd, i in infos.items():
        if i.update_mask or i.in_shared_list:
            problems.append(f"fd {fd}: updates left after convergence: {i}")
        if i.running_mask:
            continue  # a handler is inside: its leave programs what is missing
        for th in t.threads:
            if th.tgid != i.tgid:
                continue
            pr, ps = bool(i.polled_recv & th.bit), bool(i.polled_send & th.bit)
            if i.thread_mask & th.bit:
                wr = bool(i.state & (State.ACTIVE_R | State.WATCH_HUP))
                ws = bool(i.state & State.ACTIVE_W)
                if (pr, ps) != (wr, ws):
                    problems.append(f"thread {th.tid} owns fd {fd} and polls recv={pr} "
                                    f"send={ps} instead of {wr}/{ws}: {i}")
            elif (pr or ps) and not i.nb_takeover:
                problems.append(f"thread {th.tid} is not an owner of fd {fd} yet polls it "
                                f"(no takeover explains it): {i}")
    assert not problems, f"{where}\n" + "\n".join(problems)


# ---------------------------------------------------------------------------
# fixtures


@pytest.fixture
def peers():
    """The far ends of the socketpairs given to tables (closed at teardown)."""
    socks: list[socket.socket] = []
    yield socks
    for s in socks:
        s.close()


def pair(peers: list[socket.socket]) -> int:
    """A socketpair: returns the fd for the table (ownership transferred),
    keeps the peer."""
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    peers.append(b)
    return a.detach()


def listener(backlog: int = 64) -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(backlog)
    s.setblocking(False)
    return s.detach()


def listed_in(t: Table, fd: int) -> list[int]:
    """tids whose epoll instance lists fd number `fd`."""
    return [th.tid for th in t.threads if any(r.fd == fd for r in kernel_regs(th.epfd))]


# ---------------------------------------------------------------------------
# deterministic scenarios


def test_single_owner_pairs_want_stop_both_directions(tables, peers):
    """Socketpairs owned by single threads of 2 groups; every want/stop of
    both directions, issued by the owner or by a thread of the other group."""
    t = tables(4, 2)
    fds = {}
    for th in t.threads:
        fd = pair(peers)
        t.insert(fd, 100 + th.tid, tgid=th.tgid, thread_mask=th.bit)
        fds[th.tid] = fd
    converge(t)
    assert_kernel_truth(t, where="nothing wanted")
    for th in t.threads:
        assert kernel_regs(th.epfd) == []

    steps = ["want_recv", "want_send", "stop_recv", "want_recv", "stop_send", "stop_recv",
             "want_send", "want_recv", "stop_send", "stop_recv"]
    for n, verb in enumerate(steps):
        for tid, fd in fds.items():
            # alternate the caller: the owner, then a thread of the other group
            caller = t.threads[tid] if n % 2 == 0 else t.threads[(tid + 2) % 4]
            getattr(caller, verb)(fd)
        converge(t)
        assert_kernel_truth(t, where=f"after {verb}")
        for tid, fd in fds.items():
            regs = {r.fd: r for r in kernel_regs(t.threads[tid].epfd)}
            st = t.dump(fd).state
            if st & (State.ACTIVE_R | State.ACTIVE_W):
                assert fd in regs
            else:
                assert fd not in regs
    for tid, fd in fds.items():
        assert t.threads[tid].delete(fd)
    converge(t)
    assert_kernel_truth(t, where="after deletes")
    for th in t.threads:
        assert kernel_regs(th.epfd) == [], th.tid


def test_a_hang_up_watch_keeps_a_stopped_recv_registered_for_rdhup_alone(tables, peers):
    """want_hup (issue 20, finding 4: a stream connection whose reading was
    paused was out of epoll, so its client's leaving went unheard): with
    recv stopped the fd stays registered with EPOLLRDHUP and no EPOLLIN,
    data arriving is not reported, the peer's close is; want_recv puts
    EPOLLIN back, stop_hup with recv stopped takes the fd out."""
    t = tables(2, 1)
    th = t.threads[0]
    fd = pair(peers)
    t.insert(fd, 7, tgid=th.tgid, thread_mask=th.bit)
    th.want_hup(fd)
    converge(t)
    assert_kernel_truth(t, where="watch alone")
    [reg] = kernel_regs(th.epfd)
    assert reg.events & EPOLLRDHUP and not reg.events & (EPOLLIN | EPOLLOUT)
    peers[-1].send(b"data nobody asked for")
    assert th.poll(50) == []
    th.want_recv(fd)
    converge(t)
    assert_kernel_truth(t, where="recv wanted with the watch")
    [reg] = kernel_regs(th.epfd)
    assert reg.events & EPOLLIN and reg.events & EPOLLRDHUP
    [ev] = th.poll(50)
    assert ev.events & State.POLL_IN
    th.leave_all()
    th.stop_recv(fd)
    converge(t)
    [reg] = kernel_regs(th.epfd)
    assert not reg.events & EPOLLIN
    peers[-1].close()
    peers.pop()
    [ev] = th.poll(1000)
    assert ev.fd == fd and ev.events & State.POLL_RDHUP
    th.leave_all()
    th.stop_hup(fd)
    converge(t)
    assert_kernel_truth(t, where="watch stopped")
    assert kernel_regs(th.epfd) == []
    assert th.delete(fd)


@pytest.mark.parametrize("resume", [("want_recv", "stop_hup"), ("stop_hup", "want_recv")],
                         ids=["want_recv-first", "stop_hup-first"])
@pytest.mark.parametrize("owners", [1, 3])
def test_resuming_a_watched_fd_between_two_passes_polls_its_input_again(tables, peers,
                                                                        resume, owners):
    """The TSan stress failure (tests/c/common.c:399, seed 3302437362:
    "kernel events 0x2018 vs polled r=1 w=0"): a paused fd registered for
    hang-ups alone, then want_recv and stop_hup (in either order: a stream
    connection's resume) before the owners' next pass. That pass saw recv
    wanted and recv polled, no WATCH_HUP, and kept the registration: no
    EPOLLIN, input never reported. One owner (local update list) and three
    (the group's shared list)."""
    t = tables(4, 1)
    owner_threads = t.threads[:owners]
    mask = sum(th.bit for th in owner_threads)
    fd = pair(peers)
    t.insert(fd, 9, tgid=1, thread_mask=mask)
    t.threads[0].want_recv(fd)
    converge(t)
    t.threads[0].stop_recv(fd)      # pause, as worker/stream.py does it
    t.threads[0].want_hup(fd)
    converge(t)
    assert_kernel_truth(t, where="paused")
    for th in owner_threads:
        [reg] = kernel_regs(th.epfd)
        assert reg.events & EPOLLRDHUP and not reg.events & EPOLLIN
    for verb in resume:
        getattr(t.threads[0], verb)(fd)
    converge(t)
    assert_kernel_truth(t, where="resumed")
    for th in owner_threads:
        [reg] = kernel_regs(th.epfd)
        assert reg.events & EPOLLIN, f"thread {th.tid}: {reg.events:#x}, no EPOLLIN after resume"
    peers[-1].send(b"after the resume")
    evs = t.threads[0].poll(1000)
    assert [e.fd for e in evs] == [fd] and evs[0].events & State.POLL_IN
    t.threads[0].leave_all()
    assert t.threads[0].delete(fd)


def test_shared_listener_converges_on_every_owner(tables):
    """A listener on 3 of 4 threads: want/stop from a non-owner of its group
    and from a thread of a foreign group reach every owner's instance."""
    t = tables(6, 2)  # group 1: tids 0-2, group 2: tids 3-5
    lfd = listener()
    t.insert(lfd, 7, tgid=1, thread_mask=0b101)
    t.threads[1].want_recv(lfd)           # non-owner of the same group
    converge(t)
    assert_kernel_truth(t, where="want_recv by non-owner")
    assert listed_in(t, lfd) == [0, 2]
    t.threads[4].stop_recv(lfd)           # a thread of group 2
    converge(t)
    assert_kernel_truth(t, where="stop_recv from foreign group")
    assert listed_in(t, lfd) == []
    t.threads[5].want_recv(lfd)
    t.threads[5].want_send(lfd)
    converge(t)
    assert_kernel_truth(t, where="want both from foreign group")
    assert listed_in(t, lfd) == [0, 2]
    t.threads[1].stop_send(lfd)
    converge(t)
    assert_kernel_truth(t, where="stop_send")
    assert t.threads[3].delete(lfd)       # delete from the foreign group
    converge(t)
    assert_kernel_truth(t, where="after delete")
    assert listed_in(t, lfd) == []


def test_listener_in_two_groups_and_group_local_delete(tables):
    """insert_listener gives each group its own number (a dup), all CLONED;
    each group's instances list only their own number; deleting one group's
    number DELs it from that group's instances only."""
    t = tables(4, 2)  # group 1: tids 0, 1; group 2: tids 2, 3
    lfd = listener()
    fds = t.insert_listener(lfd, 9, {1: 0b11, 2: 0b11})
    assert fds[1] == lfd and fds[2] != lfd
    for tgid, fd in fds.items():
        assert t.dump(fd).state & State.CLONED
        t.threads[t.group_base(tgid)].want_recv(fd)
    converge(t)
    assert_kernel_truth(t, where="listener in 2 groups")
    assert listed_in(t, fds[1]) == [0, 1]
    assert listed_in(t, fds[2]) == [2, 3]
    # a cloned fd is still open elsewhere (the other group's dup): its close
    # alone would not remove the registrations
    assert t.threads[0].delete(fds[1])
    converge(t)
    assert_kernel_truth(t, where="group 1 number deleted")
    assert listed_in(t, fds[1]) == []
    assert listed_in(t, fds[2]) == [2, 3]
    assert t.threads[0].delete(fds[2])    # cross-group delete
    converge(t)
    assert_kernel_truth(t, where="both deleted")
    assert listed_in(t, fds[2]) == []


def test_exclusive_listener_registered_with_epollexclusive(tables):
    t = tables(4, 1)
    lfd = listener()
    t.insert(lfd, 5, tgid=1, thread_mask=0b1111, exclusive=True)
    t.threads[0].want_recv(lfd)
    converge(t)
    assert_kernel_truth(t, where="exclusive listener")
    for th in t.threads:
        (reg,) = [r for r in kernel_regs(th.epfd) if r.fd == lfd]
        assert reg.events & EPOLLEXCLUSIVE, f"{reg.events:#x}"
        assert reg.events & EPOLLIN
        assert not reg.events & (EPOLLOUT | EPOLLRDHUP)
    # a change of directions on an EXCLUSIVE registration is DEL + ADD (MOD
    # fails with EINVAL): no ctl error, and the kernel follows
    t.threads[2].want_send(lfd)
    converge(t)
    assert_kernel_truth(t, where="exclusive, want_send")
    t.threads[1].stop_recv(lfd)
    converge(t)
    assert_kernel_truth(t, where="exclusive, send only")
    for th in t.threads:
        (reg,) = [r for r in kernel_regs(th.epfd) if r.fd == lfd]
        assert reg.events & (EPOLLEXCLUSIVE | EPOLLOUT) == EPOLLEXCLUSIVE | EPOLLOUT
        assert not reg.events & EPOLLIN
        assert th.counters()["ctl_err"] == 0
    t.threads[3].stop_send(lfd)
    converge(t)
    assert listed_in(t, lfd) == []
    assert_kernel_truth(t, where="exclusive, nothing wanted")


def test_non_exclusive_listener_has_no_exclusive_bit(tables):
    t = tables(2, 1)
    lfd = listener()
    t.insert(lfd, 5, tgid=1, thread_mask=0b11)
    t.threads[0].want_recv(lfd)
    converge(t)
    for th in t.threads:
        (reg,) = [r for r in kernel_regs(th.epfd) if r.fd == lfd]
        assert reg.events & (EPOLLIN | EPOLLRDHUP) == EPOLLIN | EPOLLRDHUP
        assert not reg.events & EPOLLEXCLUSIVE
    assert_kernel_truth(t)


def test_takeover_old_owner_drops_registration_on_next_report(tables, peers):
    t = tables(2, 1)
    t0, t1 = t.threads
    fd = pair(peers)
    peer = peers[-1]
    t.insert(fd, 42, tgid=1, thread_mask=t0.bit)
    t0.want_recv(fd)
    converge(t)
    assert listed_in(t, fd) == [0]
    assert t1.takeover(fd, 42)
    t1.want_recv(fd)                       # the new owner re-arms recv
    converge(t)
    assert_kernel_truth(t, where="after takeover")
    # the old owner keeps its registration until it sees a report for it
    assert listed_in(t, fd) == [0, 1]
    peer.send(b"x")
    before = t0.counters()
    assert t0.poll(0) == []                # not ours any more: no event
    after = t0.counters()
    assert after["poll_skip_fd"] == before["poll_skip_fd"] + 1
    converge(t)
    assert_kernel_truth(t, where="after the old owner saw a report")
    assert listed_in(t, fd) == [1]
    evs = t1.poll(0)
    assert [e.fd for e in evs] == [fd]
    for e in evs:
        assert t1.leave(e.fd, e.gen) == Outcome.DONE
    assert t1.delete(fd)
    converge(t)
    assert listed_in(t, fd) == []
    assert_kernel_truth(t)


def test_takeover_with_send_active_new_owner_polls_send(tables, peers):
    """Regression (found here as an xfail, fixed by e2ee5a5): an fd taken
    over with ACTIVE_W alone used to keep ACTIVE_W while the new owner's
    poller was never told, and want_send() flipped nothing: wanted for send
    by its only owner, polled by nobody."""
    t = tables(2, 1)
    t0, t1 = t.threads
    fd = pair(peers)
    t.insert(fd, 43, tgid=1, thread_mask=t0.bit)
    t0.want_send(fd)
    converge(t)
    assert listed_in(t, fd) == [0]
    assert t1.takeover(fd, 43)
    t1.want_send(fd)                       # the new owner subscribes to send
    converge(t)
    # the old owner drops its registration at its next report (writable)
    for th in (t0, t1):
        for e in th.poll(0):
            th.leave(e.fd, e.gen)
    converge(t)
    info = t.dump(fd)
    assert info.state & State.ACTIVE_W and info.thread_mask == t1.bit
    assert info.polled_send & t1.bit, info
    assert listed_in(t, fd) == [1]


@pytest.mark.parametrize("how", ["own-sole-fd", "take-back"])
def test_takeover_stops_recv_in_the_takers_own_poller(tables, peers, how):
    """Regression (found here as an xfail, fixed by 7502c51): a taker that
    already had the fd registered for recv in its own instance (it took over
    an fd it owned alone, or took one back before its lazy drop ran) was never
    told that recv stopped: its poller kept polling recv nobody wanted, and
    the next report was a spurious wake-up."""
    t = tables(2, 1)
    t0, t1 = t.threads
    fd = pair(peers)
    t.insert(fd, 44, tgid=1, thread_mask=t0.bit)
    t0.want_recv(fd)
    converge(t)
    if how == "take-back":
        assert t1.takeover(fd, 44)
        converge(t)                  # t0 keeps its registration (lazy drop)
    assert t0.takeover(fd, 44)
    converge(t)
    info = t.dump(fd)
    assert info.thread_mask == t0.bit and not info.state & State.ACTIVE_R
    # polled == active: recv stopped, so nobody polls it any more
    assert_kernel_truth(t, where=f"takeover ({how})")
    assert listed_in(t, fd) == []


def test_deferred_delete_keeps_registration_until_last_leave(tables, peers):
    t = tables(3, 1)
    fd = pair(peers)
    t.insert(fd, 11, tgid=1, thread_mask=0b011)
    t.threads[0].want_recv(fd)
    t.threads[0].want_send(fd)
    converge(t)
    assert listed_in(t, fd) == [0, 1]
    out, gen = t.threads[1].enter(fd)
    assert out == Outcome.DONE
    assert t.threads[2].delete(fd) is False      # deferred: thread 1 is inside
    converge(t)
    assert_kernel_truth(t, where="deferred delete")
    assert t.threads[1].leave(fd, gen) == Outcome.CLOSED
    converge(t)
    assert_kernel_truth(t, where="after the last leave closed it")
    assert listed_in(t, fd) == []


def test_number_reuse_registers_new_generation(tables, peers):
    t = tables(2, 1)
    fd = pair(peers)
    t.insert(fd, 1, tgid=1, thread_mask=0b11)
    t.threads[0].want_recv(fd)
    converge(t)
    gen0 = t.dump(fd).generation
    assert t.threads[0].delete(fd)
    # reuse the very number for a new socket
    new = pair(peers)
    if new != fd:
        os.dup2(new, fd)
        os.close(new)
    t.insert(fd, 2, tgid=1, thread_mask=0b11)
    t.threads[1].want_recv(fd)
    t.threads[1].want_send(fd)
    converge(t)
    info = t.dump(fd)
    assert info.generation == gen0 + 1
    assert_kernel_truth(t, where="reused number")
    for th in t.threads:
        (reg,) = [r for r in kernel_regs(th.epfd) if r.fd == fd]
        assert reg.data >> 32 == gen0 + 1


def test_foreign_group_want_stop_reaches_sleeping_owners(tables):
    """T6 with real threads: 3 owners of a listener sleep in poll(30 s); a
    thread of the other group flips recv on and off. Each flip must reach
    every owner's epoll instance through the wake-up, long before any poll
    timeout, and a connection made while wanted is accepted once."""
    t = tables(5, 2)                     # group 1: tids 0-2, group 2: tids 3-4
    lfd = listener()
    t.insert(lfd, 21, tgid=1, thread_mask=0b111)
    stop = threading.Event()
    accepted: list[int] = []
    errors: list[BaseException] = []

    def run(th):
        try:
            while not stop.is_set():
                for e in th.poll(30000):
                    try:
                        for c in th.accept(e.fd):
                            accepted.append(th.tid)
                            os.close(c)
                    finally:
                        th.leave(e.fd, e.gen)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(t.threads[i],), daemon=True) for i in range(3)]
    for w in workers:
        w.start()
    foreign = t.threads[3]
    clients: list[socket.socket] = []
    try:
        deadline_s = 10
        waiter = threading.Event()
        for flip in range(10):
            foreign.want_recv(lfd)
            end = time.monotonic() + deadline_s
            while listed_in(t, lfd) != [0, 1, 2]:
                assert time.monotonic() < end, f"flip {flip}: want_recv not applied by all owners"
                waiter.wait(0.002)
            if flip == 5:
                with socket.socket(fileno=os.dup(lfd)) as probe:
                    addr = probe.getsockname()
                clients.append(socket.create_connection(addr, timeout=10))
                end = time.monotonic() + deadline_s
                while not accepted:
                    assert time.monotonic() < end, "connection not accepted"
                    waiter.wait(0.002)
            foreign.stop_recv(lfd)
            end = time.monotonic() + deadline_s
            while listed_in(t, lfd) != []:
                assert time.monotonic() < end, f"flip {flip}: stop_recv not applied by all owners"
                waiter.wait(0.002)
    finally:
        stop.set()
        for i in range(3):
            t.wake(i)
        for w in workers:
            w.join(timeout=30)
        for c in clients:
            c.close()
    assert not any(w.is_alive() for w in workers)
    assert not errors, errors
    assert len(accepted) == 1
    converge(t)
    assert_kernel_truth(t, where="after the flips")
    for i in range(3):
        c = t.threads[i].counters()
        assert c["ctl_err"] == 0 and c["poll_stale"] == 0, c


def test_disown_delete_removes_registrations(tables, peers):
    """Regression (found here as an xfail, fixed by 7502c51): the final close
    DELed an fd from the instances polling it only when CLONED; a DISOWN fd,
    never close()d by the table, stayed registered in every instance that had
    polled it while its polled bits were zeroed (seed 004's spin)."""
    t = tables(2, 1)
    fd = pair(peers)
    try:
        t.insert(fd, 3, tgid=1, thread_mask=0b11, disown=True)
        t.threads[0].want_recv(fd)
        converge(t)
        assert listed_in(t, fd) == [0, 1]
        assert t.threads[0].delete(fd)
        converge(t)
        assert t.dump(fd).tgid == 0
        assert listed_in(t, fd) == []
    finally:
        os.close(fd)          # disowned: the fd is ours again


def test_disowned_fd_does_not_wake_the_pollers(tables, peers):
    """Regression (7502c51): the disowned fd, now the caller's, used to wake
    every thread that had polled it on every loop while it was readable."""
    t = tables(2, 1)
    fd = pair(peers)
    peer = peers[-1]
    try:
        t.insert(fd, 3, tgid=1, thread_mask=0b11, disown=True)
        t.threads[0].want_recv(fd)
        converge(t)
        assert t.threads[1].delete(fd)
        converge(t)
        peer.send(b"ready to read")
        before = [th.counters() for th in t.threads]
        for _ in range(3):
            for th in t.threads:
                assert th.poll(0) == []
        after = [th.counters() for th in t.threads]
        for b, a in zip(before, after):
            assert (a["poll_stale"], a["wake_nowork"]) == (b["poll_stale"], b["wake_nowork"])
    finally:
        os.close(fd)


def test_disowned_fd_reinserted_for_fewer_threads_keeps_kernel_truth(tables, peers):
    """Regression (7502c51): re-inserted for thread 0 only, the number kept
    thread 1's registration of the first life for good."""
    t = tables(2, 1)
    fd = pair(peers)
    t.insert(fd, 3, tgid=1, thread_mask=0b11, disown=True)
    t.threads[0].want_recv(fd)
    converge(t)
    assert t.threads[0].delete(fd)
    t.insert(fd, 4, tgid=1, thread_mask=0b01)       # the table owns it again
    t.threads[0].want_recv(fd)
    converge(t)
    assert_kernel_truth(t, where="re-inserted after a DISOWN delete")


def test_disown_cloned_delete_removes_registrations(tables, peers):
    """DISOWN together with CLONED: the final close DELs the fd from every
    instance that polled it and leaves it open."""
    t = tables(2, 1)
    fd = pair(peers)
    try:
        t.insert(fd, 3, tgid=1, thread_mask=0b11, disown=True, cloned=True)
        t.threads[0].want_recv(fd)
        converge(t)
        assert listed_in(t, fd) == [0, 1]
        assert t.threads[0].delete(fd)
        converge(t)
        assert listed_in(t, fd) == []
        assert_kernel_truth(t)
        os.fstat(fd)          # still open: disowned, not closed
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------
# randomized sequence


@dataclass
class Model:
    kind: str                      # "pair" | "listener"
    tgid: int
    mask: int
    recv: bool = False
    send: bool = False
    owner: int = 0
    disown: bool = False
    peer: socket.socket | None = field(default=None, repr=False)


@pytest.mark.parametrize("seed", [20261122, 4, 1004])
def test_randomized_operations_keep_kernel_truth(tables, peers, seed):
    rng = random.Random(seed)
    t = tables(6, 2)  # group 1: tids 0-2, group 2: tids 3-5
    groups = {g: [th for th in t.threads if th.tgid == g] for g in (1, 2)}
    live: dict[int, Model] = {}
    next_owner = 1000
    ops_done: dict[str, int] = {}

    def any_thread():
        return rng.choice(t.threads)

    def do_insert_pair():
        nonlocal next_owner
        g = rng.choice((1, 2))
        n = len(groups[g])
        mask = 1 << rng.randrange(n) if rng.random() < 0.7 else rng.randrange(1, 1 << n)
        fd = pair(peers)
        next_owner += 1
        disown = rng.random() < 0.15
        t.insert(fd, next_owner, tgid=g, thread_mask=mask, cloned=rng.random() < 0.2,
                 disown=disown)
        live[fd] = Model("pair", g, mask, owner=next_owner, disown=disown, peer=peers[-1])

    def forget(fd: int, m: Model) -> None:
        """After the final close: a disowned fd is ours again."""
        if m.disown:
            os.fstat(fd)                     # not closed by the table
            os.close(fd)

    def do_insert_listener():
        nonlocal next_owner
        lfd = listener()
        next_owner += 1
        excl = rng.random() < 0.5
        masks = {g: rng.randrange(1, 1 << len(groups[g])) for g in (1, 2)
                 if rng.random() < 0.7} or {1: 0b111}
        fds = t.insert_listener(lfd, next_owner, masks, exclusive=excl)
        for g, fd in fds.items():
            live[fd] = Model("listener", g, masks[g], owner=next_owner)

    def do_verb():
        fd = rng.choice(list(live))
        m = live[fd]
        verb = rng.choice(("want_recv", "stop_recv", "want_send", "stop_send"))
        getattr(any_thread(), verb)(fd)
        if verb.endswith("recv"):
            m.recv = verb.startswith("want")
        else:
            m.send = verb.startswith("want")

    def do_takeover():
        cands = [fd for fd, m in live.items() if m.kind == "pair"]
        if not cands:
            return
        fd = rng.choice(cands)
        m = live[fd]
        th = rng.choice(groups[m.tgid])
        if th.bit & m.mask and m.mask != th.bit:
            # one owner among several may not take over (e2ee5a5)
            with pytest.raises(OSError) as ei:
                th.takeover(fd, m.owner)
            assert ei.value.errno == errno.EINVAL
            return
        assert th.takeover(fd, m.owner), t.dump(fd)
        m.mask = th.bit
        m.recv = False
        # the documented contract: the new owner re-arms recv (mostly)
        if rng.random() < 0.8:
            th.want_recv(fd)
            m.recv = True

    def do_delete():
        fd = rng.choice(list(live))
        m = live.pop(fd)
        assert any_thread().delete(fd) is True
        forget(fd, m)
        if m.peer is not None and rng.random() < 0.5:
            m.peer.close()

    def do_deferred_delete():
        fd = rng.choice(list(live))
        m = live.pop(fd)
        th = rng.choice([x for x in groups[m.tgid] if x.bit & m.mask])
        out, gen = th.enter(fd)
        assert out == Outcome.DONE
        deleter = rng.choice([x for x in t.threads if x is not th])
        assert deleter.delete(fd) is False
        converge(t)
        assert_kernel_truth(t, where=f"seed {seed}: deferred delete of fd {fd} pending")
        assert th.leave(fd, gen) == Outcome.CLOSED
        forget(fd, m)

    def do_traffic():
        for m in live.values():
            if m.peer is not None and m.peer.fileno() >= 0 and rng.random() < 0.3:
                try:
                    m.peer.send(b"y")
                except OSError:
                    pass

    def do_poll():
        th = any_thread()
        for e in th.poll(0):
            if e.events & State.POLL_IN and e.fd in live and live[e.fd].kind == "pair":
                try:
                    os.read(e.fd, 4096)
                except OSError:
                    pass
            th.leave(e.fd, e.gen)

    ops = [(do_insert_pair, 4), (do_insert_listener, 1), (do_verb, 10), (do_takeover, 2),
           (do_delete, 2), (do_deferred_delete, 1), (do_traffic, 1), (do_poll, 3)]
    funcs = [f for f, _ in ops]
    weights = [w for _, w in ops]
    for n in range(300):
        f = do_insert_pair if len(live) < 3 else rng.choices(funcs, weights)[0]
        if f in (do_delete, do_deferred_delete) and not live:
            f = do_insert_pair
        f()
        ops_done[f.__name__] = ops_done.get(f.__name__, 0) + 1
        converge(t)
        assert_kernel_truth(t, where=f"seed {seed}, op {n} ({f.__name__})")
        # the table agrees with the model
        infos = {i.fd: i for i in t.show_fd()}
        assert set(infos) == set(live), (n, f.__name__)
        for fd, m in live.items():
            i = infos[fd]
            assert (i.tgid, i.thread_mask) == (m.tgid, m.mask), (n, fd, i, m)
            assert bool(i.state & State.ACTIVE_R) == m.recv, (n, fd, i, m)
            assert bool(i.state & State.ACTIVE_W) == m.send, (n, fd, i, m)
    for th in t.threads:
        assert th.counters()["ctl_err"] == 0, (th.tid, th.counters())
    for fd in list(live):
        assert t.threads[0].delete(fd)
        forget(fd, live.pop(fd))
    converge(t)
    assert_kernel_truth(t, where="all deleted")
    for th in t.threads:
        assert kernel_regs(th.epfd) == [], th.tid
    assert ops_done.get("do_takeover", 0) > 0 and ops_done.get("do_poll", 0) > 0, ops_done


# ---------------------------------------------------------------------------
# concurrent operations, checked at quiescent points


def test_concurrent_operations_converge_to_kernel_truth(tables, peers):
    """6 real OS threads (2 groups), each driving its own context: inserts
    and deletes of its own fds, want/stop on anybody's fds (other groups'
    included), takeovers, traffic, poll + leave. At the end of each round all
    of them park on a barrier; the main thread then runs update passes on
    every context and checks the kernel truth."""
    t = tables(6, 2)
    rounds, ops = 12, 60
    lock = threading.Lock()
    shared: list[int] = []                       # fds in the table, any worker's
    barrier = threading.Barrier(len(t.threads) + 1, timeout=60)
    errors: list[BaseException] = []
    stats = {"deferred": 0, "takeover": 0, "co_owner": 0, "events": 0, "ebadf": 0,
             "entered": 0, "closed_by_leave": 0}

    def worker(th, seed: int) -> None:
        rng = random.Random(seed)
        mine: dict[int, socket.socket] = {}
        group = [x for x in t.threads if x.tgid == th.tgid]
        owner_base = (th.tid + 1) << 32
        try:
            for _r in range(rounds):
                for n in range(ops):
                    x = rng.random()
                    with lock:
                        snapshot = list(shared)
                    if x < 0.15 and len(mine) < 6:
                        a, b = socket.socketpair()
                        a.setblocking(False)
                        b.setblocking(False)
                        fd = a.detach()
                        mask = th.bit | (rng.randrange(1 << len(group)) if rng.random() < 0.3 else 0)
                        t.insert(fd, owner_base + n + 1, tgid=th.tgid, thread_mask=mask, kind=1,
                                 cloned=rng.random() < 0.3)
                        mine[fd] = b
                        with lock:
                            shared.append(fd)
                    elif x < 0.25 and mine:
                        fd = rng.choice(list(mine))
                        with lock:
                            shared.remove(fd)
                        if not th.delete(fd):
                            stats["deferred"] += 1
                        peer = mine.pop(fd)
                        with lock:
                            peers.append(peer)       # closed at teardown
                    elif x < 0.60 and snapshot:
                        fd = rng.choice(snapshot)
                        verb = rng.choice(("want_recv", "stop_recv", "want_send", "stop_send"))
                        try:
                            getattr(th, verb)(fd)
                        except OSError:
                            stats["ebadf"] += 1     # deleted meanwhile
                    elif x < 0.68 and snapshot:
                        fd = rng.choice(snapshot)
                        try:
                            owner = t.dump(fd).owner
                        except OSError:
                            continue
                        try:
                            took = bool(owner) and th.takeover(fd, owner)
                        except OSError as exc:
                            if exc.errno != errno.EINVAL:
                                raise
                            stats["co_owner"] += 1      # refused (e2ee5a5)
                            continue
                        if took:
                            stats["takeover"] += 1
                            try:
                                th.want_recv(fd)
                            except OSError:
                                stats["ebadf"] += 1  # its inserter deleted it
                    elif x < 0.78 and mine:
                        try:
                            rng.choice(list(mine.values())).send(b"z")
                        except OSError:
                            pass
                    elif x < 0.85 and snapshot:
                        # be inside someone's fd for a while: its deletes
                        # meanwhile are deferred to our leave
                        fd = rng.choice(snapshot)
                        out, gen = th.enter(fd)
                        if out == Outcome.DONE:
                            stats["entered"] += 1
                            for _ in range(rng.randrange(1, 4)):
                                os.fstat(fd)
                                time.sleep(0)
                            if th.leave(fd, gen) == Outcome.CLOSED:
                                stats["closed_by_leave"] += 1
                    else:
                        for e in th.poll(0):
                            stats["events"] += 1
                            if e.kind == 1 and e.events & State.POLL_IN:
                                try:
                                    os.read(e.fd, 4096)
                                except OSError:
                                    pass
                            th.leave(e.fd, e.gen)
                barrier.wait()        # quiescent: the main thread checks
                barrier.wait()        # checked: go on
            for fd in list(mine):
                with lock:
                    shared.remove(fd)
                assert th.delete(fd)
                with lock:
                    peers.append(mine.pop(fd))
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:
            exc.add_note(f"in worker of thread {th.tid}")
            errors.append(exc)
            barrier.abort()

    workers = [threading.Thread(target=worker, args=(th, 7919 * (th.tid + 1)), daemon=True)
               for th in t.threads]
    for w in workers:
        w.start()
    done = False
    try:
        for r in range(rounds):
            barrier.wait()
            converge(t)
            assert_kernel_truth(t, where=f"after concurrent round {r}")
            barrier.wait()
        done = True
    except threading.BrokenBarrierError:
        assert errors, "barrier broken without a worker error"
    finally:
        if not done:
            barrier.abort()
        for w in workers:
            w.join(timeout=30)
    if errors:
        raise errors[0]
    assert not any(w.is_alive() for w in workers)
    converge(t)
    assert_kernel_truth(t, where="all deleted")
    assert t.show_fd() == []
    for th in t.threads:
        assert kernel_regs(th.epfd) == [], th.tid
        assert th.counters()["ctl_err"] == 0, th.counters()
    print(f"\nconcurrent rounds: {stats}")
