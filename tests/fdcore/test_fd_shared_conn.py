"""Group-shared connections (fdc_insert_shared, issue 21): each protocol step
through the Python binding, on real socketpairs and real epoll instances.

A connection inserted with Thread.insert_shared is registered EPOLLIN |
EPOLLEXCLUSIVE | EPOLLET in the poller of every thread of its mask, the
inserting thread's first and with EPOLLOUT besides; a direction change
re-registers nothing (tests/fdcore/test_fd_shared_direction.py). What worker/native/engine/dispatch.c relies on, step by
step: the registrations (the kernel's own interest lists); the refusal of a
mask without the caller; who gets an arrival when the inserter sleeps, or
does not poll; no sibling woken by a direction change; a delete while a
sibling holds a running bit; one report per arrival (edge-triggered), also
after a DEL + ADD of the registration; no takeover. tests/c/stress_shared.c runs the same
protocol under threads and sanitizers.
"""
import contextlib
import errno
import os
import socket
import threading
import time

import pytest

from sockherd.fdcore import Outcome, Table
from sockherd.fdcore._fdcore import lib

pytestmark = pytest.mark.timeout(60)

OWNER = 0x5EED
EPOLLIN, EPOLLOUT, EPOLLEXCLUSIVE, EPOLLET = 0x1, 0x4, 1 << 28, 1 << 31
EPOLLERR_HUP = 0x18                  # the kernel adds them to every registration
EPOLL_WAIT = {"232", "281"}          # x86_64 epoll_wait, epoll_pwait
SIBLING_WAIT_MS = 300                # a poll that must time out empty


def interest(epfd: int, fd: int) -> tuple[int, int] | None:
    """(events, data) of fd's registration in epoll instance epfd, as the
    kernel has it (/proc/self/fdinfo), or None."""
    with open(f"/proc/self/fdinfo/{epfd}") as f:
        for line in f:
            if line.startswith("tfd:"):
                parts = line.split()
                if int(parts[1]) == fd:
                    return int(parts[3], 16) & ~EPOLLERR_HUP, int(parts[5], 16)
    return None


def asleep(native_ids: list[int]) -> bool:
    """Every thread of native_ids is blocked in epoll_wait (the kernel's
    view, /proc/.../syscall)."""
    for tid in native_ids:
        with open(f"/proc/self/task/{tid}/syscall") as f:
            if f.read().split()[0] not in EPOLL_WAIT:
                return False
    return True


class Poller:
    """One thread of the table polling once in its own OS thread, the
    handler reading nothing: what it got is in .events (held until
    leave())."""

    def __init__(self, th, timeout_ms: int):
        self.th = th
        self.events = None
        self.native = None
        self._t = threading.Thread(target=self._run, args=(timeout_ms,))
        self._t.start()
        deadline = time.monotonic() + 10
        while self.native is None:
            assert time.monotonic() < deadline
            time.sleep(0.001)

    def _run(self, timeout_ms):
        self.native = threading.get_native_id()
        self.events = self.th.poll(timeout_ms)

    def join(self) -> list:
        self._t.join(15)
        assert not self._t.is_alive(), f"thread {self.th.tid} still polling"
        return self.events


def wait_asleep(pollers: list[Poller]) -> None:
    deadline = time.monotonic() + 10
    while not asleep([p.native for p in pollers]):
        assert time.monotonic() < deadline, "the pollers never slept in epoll_wait"
        time.sleep(0.001)


def sibling_gets(th, fd: int, peer: socket.socket) -> list:
    """th (the sibling) sleeps in poll, the inserter not polling; one byte
    arrives: th's report, held (bytes unread)."""
    p = Poller(th, 10_000)
    wait_asleep([p])
    peer.send(b"x")
    got = p.join()
    assert [e.fd for e in got] == [fd], got
    return got


def drain(sock: socket.socket | int) -> bytes:
    fd = sock if isinstance(sock, int) else sock.fileno()
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return out
        if not chunk:
            return out
        out += chunk


@contextlib.contextmanager
def inserted(a: socket.socket, peer: socket.socket, inserter: int = 0):
    """Yields (table, fd): socket a (non-blocking; peer is its other end)
    inserted by thread `inserter` of a new 3-thread group, shared by all
    three; then deleted, the peer and the table closed."""
    table = Table(3, 1)
    a.setblocking(False)
    fd = a.detach()
    try:
        table.threads[inserter].insert_shared(fd, OWNER, 0b111)
        yield table, fd
    finally:
        try:
            if table.dump(fd).tgid:
                table.threads[0].delete(fd)
        finally:
            peer.close()
            table.close()


@pytest.fixture
def shared(request):
    """(table, fd, peer, inserter tid) for a connection inserted by thread
    `inserter` (indirect param, default 0) of a 3-thread group, shared by
    all three."""
    inserter = getattr(request, "param", 0)
    a, peer = socket.socketpair()
    with inserted(a, peer, inserter) as (table, fd):
        yield table, fd, peer, inserter


@pytest.mark.parametrize("shared", [0, 2], indirect=True, ids=["inserter0", "inserter2"])
def test_registered_exclusive_edge_triggered_in_every_poller(shared):
    """The inserter's registration has EPOLLOUT from the start (it is never
    re-registered: a DEL + ADD would lose the affinity), the siblings' not
    (an ADD with EPOLLOUT reports a fresh socket at once and would wake
    each of them at every accept)."""
    table, fd, _peer, ins = shared
    info = table.dump(fd)
    assert info.thread_mask == 0b111 and info.polled_recv == 0b111
    assert info.polled_send == 1 << ins
    assert info.state & lib.FDC_EDGE and info.state & lib.FDC_EXCLUSIVE
    assert info.state & lib.FDC_ACTIVE_R and not info.update_mask and not info.in_shared_list
    for th in table.threads:
        got = interest(th.epfd, fd)
        out = EPOLLOUT if th.tid == ins else 0
        assert got == (EPOLLIN | out | EPOLLEXCLUSIVE | EPOLLET, info.generation << 32 | fd), (
            th.tid, got)


def test_a_subset_registers_only_its_threads():
    with Table(3, 1) as table:
        a, peer = socket.socketpair()
        fd = a.detach()
        try:
            table.threads[2].insert_shared(fd, OWNER, 0b101)
            info = table.dump(fd)
            assert info.thread_mask == 0b101 and info.polled_recv == 0b101
            assert [interest(th.epfd, fd) is not None for th in table.threads] == [
                True, False, True]
        finally:
            table.threads[0].delete(fd)
            peer.close()


@pytest.mark.parametrize("taker", [0, 1, 2])
def test_a_takeover_is_refused_and_changes_nothing(taker):
    """EINVAL for every thread of the group, an owner or not (review
    finding: a non-owner's takeover left the owners' exclusive edge
    registrations, and one asleep swallowed the next arrival:
    tests/c/repro/shared_takeover.c), the registrations as they were."""
    with Table(3, 1) as table:
        a, peer = socket.socketpair()
        fd = a.detach()
        try:
            table.threads[0].insert_shared(fd, OWNER, 0b011)
            before = table.dump(fd)
            with pytest.raises(OSError) as exc:
                table.threads[taker].takeover(fd, OWNER)
            assert exc.value.errno == errno.EINVAL
            after = table.dump(fd)
            assert (after.thread_mask, after.polled_recv, after.state, after.running_mask) == (
                before.thread_mask, before.polled_recv, before.state, 0)
            assert [interest(th.epfd, fd) is not None for th in table.threads] == [
                True, True, False]
        finally:
            table.threads[0].delete(fd)
            peer.close()


@pytest.mark.parametrize("mask", [0b110, 0, 1 << 5])
def test_refused_without_the_callers_bit_and_nothing_lost(mask):
    """EINVAL, the fd neither in the table nor closed, no poller holding it."""
    with Table(3, 1) as table:
        a, peer = socket.socketpair()
        fd = a.detach()
        try:
            with pytest.raises(OSError) as exc:
                table.threads[0].insert_shared(fd, OWNER, mask)
            assert exc.value.errno == errno.EINVAL
            assert table.dump(fd).tgid == 0
            assert all(interest(th.epfd, fd) is None for th in table.threads)
            os.fstat(fd)                          # still open: the caller's
            peer.send(b"x")
            assert os.read(fd, 1) == b"x"
        finally:
            os.close(fd)
            peer.close()


@pytest.mark.parametrize("shared", [0, 2], indirect=True, ids=["inserter0", "inserter2"])
def test_inserter_asleep_gets_the_arrival_and_a_sleeping_sibling_is_not_woken(shared):
    table, fd, peer, ins = shared
    sib = table.threads[1]
    before = sib.counters()
    pollers = [Poller(table.threads[ins], 10_000), Poller(sib, SIBLING_WAIT_MS)]
    wait_asleep(pollers)
    peer.send(b"x")
    got_ins, got_sib = pollers[0].join(), pollers[1].join()
    assert [e.fd for e in got_ins] == [fd] and got_sib == [], (got_ins, got_sib)
    after = sib.counters()
    assert after["poll_io"] == before["poll_io"] and after["wakeups"] == before["wakeups"]
    assert drain(fd) == b"x"
    table.threads[ins].leave(fd, got_ins[0].gen)


def test_inserter_not_polling_a_sleeping_sibling_gets_it(shared):
    """The hand-off: the inserter is busy, the sibling asleep is woken. The
    inserter's instance, before the sleeper's in the wait queue, keeps the
    report in its ready list too: it gets it when it polls, if the bytes
    are still there (why dispatch.c decides among threads with `inside`)."""
    table, fd, peer, _ = shared
    ins, sib = table.threads[0], table.threads[1]
    got = sibling_gets(sib, fd, peer)
    again = ins.poll(0)                       # the bytes are unread
    assert [e.fd for e in again] == [fd]
    assert drain(fd) == b"x"
    assert table.dump(fd).running_mask == 0b011   # two threads inside at once
    assert ins.leave(fd, again[0].gen) == Outcome.DONE
    assert sib.leave(fd, got[0].gen) == Outcome.DONE
    # the edge is spent: nobody is told again
    assert [th.poll(0) for th in table.threads] == [[], [], []]


def test_a_report_read_elsewhere_is_not_handed_again(shared):
    """The other side of the same fact: once a thread read the bytes, the
    kernel checks readiness before reporting, and the stale entry of the
    inserter's ready list yields nothing."""
    table, fd, peer, _ = shared
    sib = table.threads[1]
    got = sibling_gets(sib, fd, peer)
    assert drain(fd) == b"x"
    sib.leave(fd, got[0].gen)
    assert table.threads[0].poll(0) == []


def test_a_direction_change_wakes_no_sibling(shared):
    table, fd, _peer, _ = shared
    me, sib = table.threads[0], table.threads[1]
    before = sib.counters()
    p = Poller(sib, SIBLING_WAIT_MS)
    wait_asleep([p])
    me.want_send(fd)                          # main acts as thread 0
    assert p.join() == []
    assert sib.counters()["wakeups"] == before["wakeups"]
    info = table.dump(fd)
    assert info.update_mask & 0b110           # theirs, applied when they pass
    me.update_pass()
    assert table.dump(fd).polled_send & 0b001
    got = me.poll(0)                          # the ADD reports what is there
    assert [(e.fd, e.events & lib.FDC_POLL_OUT) for e in got] == [(fd, lib.FDC_POLL_OUT)]
    me.leave(fd, got[0].gen)
    for th in table.threads[1:]:
        th.update_pass()
    info = table.dump(fd)
    assert info.polled_send == 0b111 and info.polled_recv == 0b111 and not info.update_mask
    for th in table.threads:
        events, _ = interest(th.epfd, fd)
        assert events == EPOLLIN | EPOLLOUT | EPOLLEXCLUSIVE | EPOLLET, (th.tid, hex(events))


def test_the_same_change_on_a_co_owned_fd_wakes_the_siblings():
    """The contrast, so the test above can fail: a plain co-owned fd's
    change wakes every other owner."""
    with Table(2, 1) as table:
        a, peer = socket.socketpair()
        fd = a.detach()
        try:
            table.insert(fd, OWNER, thread_mask=0b11, accepted=True)
            table.threads[0].want_recv(fd)
            sib = table.threads[1]
            for th in table.threads:
                th.poll(0)                     # registered, the wake-up consumed
            before = sib.counters()["wakeups"]
            p = Poller(sib, 10_000)
            wait_asleep([p])
            table.threads[0].want_send(fd)
            p.join()
            assert sib.counters()["wakeups"] == before + 1
        finally:
            sib.leave_all()
            table.threads[0].delete(fd)
            peer.close()


def test_delete_while_a_sibling_holds_a_running_bit_closes_at_its_leave(shared):
    table, fd, peer, _ = shared
    me, sib = table.threads[0], table.threads[1]
    gen = sibling_gets(sib, fd, peer)[0].gen
    assert me.delete(fd) is False             # deferred: the sibling is inside
    os.fstat(fd)                              # not closed under it
    assert drain(fd) == b"x"
    assert sib.leave(fd, gen) == Outcome.CLOSED
    with pytest.raises(OSError) as exc:
        os.fstat(fd)
    assert exc.value.errno == errno.EBADF
    assert table.dump(fd).tgid == 0 and table.released(fd, gen)


def test_delete_with_two_runners_closes_at_the_last_leave(shared):
    table, fd, _peer, _ = shared
    t0, t1, t2 = table.threads
    (o0, gen), (o1, _) = t0.enter(fd), t1.enter(fd)
    assert o0 == o1 == Outcome.DONE and table.dump(fd).running_mask == 0b011
    assert t2.delete(fd) is False
    assert t0.leave(fd, gen) == Outcome.MIGRATED
    os.fstat(fd)
    assert t1.leave(fd, gen) == Outcome.CLOSED
    with pytest.raises(OSError):
        os.fstat(fd)


def one_report_per_arrival(table, fd, peer, th) -> None:
    """th alone polls: each arrival is reported once, and a report left
    unread is not repeated (level-triggered would repeat it)."""
    for n in range(3):
        peer.send(b"y")
        got = th.poll(0)
        assert [e.fd for e in got] == [fd], (n, got)
        th.leave(fd, got[0].gen)
        assert th.poll(0) == [], f"arrival {n} reported twice: level-triggered?"
    assert drain(fd) == b"yyy"


def test_edge_triggered_one_report_per_arrival(shared):
    table, fd, peer, _ = shared
    one_report_per_arrival(table, fd, peer, table.threads[0])


def test_still_edge_triggered_after_a_pass_re_adds_it(shared):
    """A sibling's first pass with send wanted DEL + ADDs its entry with
    EPOLLOUT: the new registration is edge-triggered too (update_fd adds
    EPOLLET for FDC_EDGE), and kept when send is stopped again."""
    table, fd, peer, _ = shared
    me, th = table.threads[0], table.threads[1]
    me.want_send(fd)
    th.update_pass()
    me.stop_send(fd)
    th.update_pass()
    events, _ = interest(th.epfd, fd)
    assert events == EPOLLIN | EPOLLOUT | EPOLLEXCLUSIVE | EPOLLET, hex(events)
    th.poll(0)                                # the ADD's own report, if any
    th.leave_all()
    one_report_per_arrival(table, fd, peer, th)


def test_requeue_keeps_a_shared_connection_edge_triggered(shared):
    table, fd, _peer, _ = shared
    th = table.threads[0]
    outcome, gen = th.enter(fd)
    assert outcome == Outcome.DONE
    try:
        assert th.requeue(fd) is True
    finally:
        th.leave(fd, gen)
    events, _ = interest(th.epfd, fd)
    assert events & EPOLLET, hex(events)


def test_affinity_survives_a_direction_change(shared):
    """The finding of the issue-21 review (was a strict xfail): a direction
    change made each pass DEL + ADD its exclusive registration (the kernel
    refuses MOD), which put the inserter's at the tail of the file's wait
    queue; after one want_send / stop_send (a response that did not fit in
    one write) its siblings came first and took every arrival while it
    slept too, for the connection's life. Now nothing is re-registered."""
    table, fd, peer, _ = shared
    ins, sib = table.threads[0], table.threads[1]
    for change in (ins.want_send, ins.stop_send, ins.stop_recv, ins.want_recv):
        change(fd)
        ins.poll(0)                           # its pass, and the ADD's report
        ins.leave_all()
    for th in table.threads[1:]:
        th.update_pass()
    pollers = [Poller(ins, 3000), Poller(sib, SIBLING_WAIT_MS)]
    wait_asleep(pollers)
    peer.send(b"x")
    got_sib, got_ins = pollers[1].join(), pollers[0].join()
    sib.leave_all()
    ins.leave_all()
    assert got_sib == [] and [e.fd for e in got_ins] == [fd], (got_ins, got_sib)
