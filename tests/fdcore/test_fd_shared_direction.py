"""A group-shared connection's direction changes (fdc_insert_shared, issue 21):
its registration is made once and never narrowed, so a change costs no
epoll_ctl and keeps the inserting thread first in the file's wait queue
(the affinity: test_fd_shared_conn.py::test_affinity_survives_a_direction_change).

What that asks of fdcore, each pinned here on real sockets and real epoll
instances: reports of a direction nobody wants are not handed out but kept
(FDC_KEPT_R / FDC_KEPT_W) and replayed to the thread whose verb wants the
direction again, since an edge-triggered report never comes twice; the
finding this file reproduces is the ordering "a flush gets EAGAIN, the
writable edge arrives and is consumed while send is not wanted yet, then
want_send": without the replay the response stalls for ever. A round of
reports that were all kept does not hand the caller an empty poll.
"""
import os
import socket
import time

import pytest

from sockherd.fdcore import Table
from sockherd.fdcore._fdcore import lib
from test_fd_shared_conn import (
    EPOLLET, EPOLLEXCLUSIVE, EPOLLIN, EPOLLOUT, OWNER, Poller, drain, inserted, interest,
    wait_asleep,
)

pytestmark = pytest.mark.timeout(60)

CTL = ("ctl_add", "ctl_del", "ctl_mod", "ctl_err")


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """(server end, client end) of a loopback TCP connection, both
    non-blocking."""
    with socket.socket() as lsock:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)
        client = socket.create_connection(lsock.getsockname())
        server, _ = lsock.accept()
    server.setblocking(False)
    client.setblocking(False)
    return server, client


@pytest.fixture(params=["tcp", "unix"])
def conn(request):
    """(table, fd, peer) for a connection inserted by thread 0 of a 3-thread
    group, shared by all three; thread 0's ADD report (writable) consumed."""
    a, peer = tcp_pair() if request.param == "tcp" else socket.socketpair()
    peer.setblocking(False)
    with inserted(a, peer) as (table, fd):
        assert table.threads[0].poll(0) == []          # its ADD report: kept
        assert table.dump(fd).state & lib.FDC_KEPT_W
        yield table, fd, peer


def fill(fd: int) -> int:
    """Writes until the kernel says EAGAIN; returns the bytes written."""
    n = 0
    chunk = b"z" * 65536
    while True:
        try:
            n += os.write(fd, chunk)
        except BlockingIOError:
            return n


def read_exactly(peer: socket.socket, n: int) -> None:
    deadline = time.monotonic() + 10
    got = 0
    while got < n:
        assert time.monotonic() < deadline, f"peer read {got} of {n}"
        try:
            got += len(peer.recv(1 << 20))
        except BlockingIOError:
            time.sleep(0.001)


def out_reports(th, fd: int) -> list:
    got = th.poll(0)
    th.leave_all()
    return [e for e in got if e.fd == fd and e.events & lib.FDC_POLL_OUT]


def ctl_counts(table) -> list[tuple[int, ...]]:
    return [tuple(th.counters()[k] for k in CTL) for th in table.threads]


@pytest.mark.parametrize("changer", [0, 1], ids=["inserter", "sibling"])
def test_eagain_then_edge_then_want_send_gets_its_report(conn, changer):
    """The finding: a flush fills the socket (EAGAIN), the peer drains it,
    the writable edge reaches the inserter's poller while send is not yet
    wanted (kept), and only then does the handler want send. The kernel
    will not report it again: fdcore replays it to the wanting thread."""
    table, fd, peer = conn
    ins, me = table.threads[0], table.threads[changer]
    n = fill(fd)
    assert out_reports(ins, fd) == []                  # nothing yet: full
    read_exactly(peer, n)                              # room again: the edge
    assert out_reports(ins, fd) == []                  # not wanted: kept
    assert table.dump(fd).state & lib.FDC_KEPT_W
    me.want_send(fd)
    state = table.dump(fd).state
    assert state & lib.FDC_ACTIVE_W and not state & lib.FDC_KEPT_W
    got = out_reports(me, fd)
    assert len(got) == 1, "the writable edge consumed before want_send was lost"
    # once (a sibling that adds EPOLLOUT at its pass is told by its ADD)
    assert ins.poll(0) == [] and me.poll(0) == []


def test_want_send_without_a_kept_edge_waits_for_the_kernel(conn):
    """No replay when no edge was kept: a want after EAGAIN is told when
    room comes back, by the kernel, once."""
    table, fd, peer = conn
    ins = table.threads[0]
    ins.want_send(fd)                                  # replays the ADD's edge
    assert len(out_reports(ins, fd)) == 1
    n = fill(fd)
    assert out_reports(ins, fd) == []                  # full, wanted: nothing
    read_exactly(peer, n)
    deadline = time.monotonic() + 5
    got = []
    while not got:
        assert time.monotonic() < deadline, "no writable report after the drain"
        got = out_reports(ins, fd)
    assert not table.dump(fd).state & lib.FDC_KEPT_W


def test_an_arrival_while_reading_is_paused_is_replayed_at_want_recv(conn):
    """stop_recv (a parked response, output past its high-water mark) no
    longer takes EPOLLIN out of the registration: an arrival meanwhile is
    reported, not handed out, kept, and replayed by want_recv."""
    table, fd, peer = conn
    ins = table.threads[0]
    ins.stop_recv(fd)
    peer.send(b"x")
    assert ins.poll(0) == []
    assert table.dump(fd).state & lib.FDC_KEPT_R
    ins.want_recv(fd)
    got = ins.poll(0)
    ins.leave_all()
    assert [(e.fd, e.events & lib.FDC_POLL_IN) for e in got] == [(fd, lib.FDC_POLL_IN)]
    assert drain(fd) == b"x"


def test_a_non_owner_want_leaves_the_replay_to_an_owner():
    """A thread of another group wants send: it cannot hold the fd, so the
    owners' update passes take the kept edge, and they are woken for it."""
    with Table(3, 2) as table:                        # group 1: tids 0, 1
        a, peer = socket.socketpair()
        fd = a.detach()
        try:
            owner, other = table.threads[0], table.threads[2]
            owner.insert_shared(fd, OWNER, 0b11)
            assert owner.poll(0) == []                 # the ADD's edge, kept
            before = owner.counters()["wakeups"]
            other.want_send(fd)
            assert table.dump(fd).state & lib.FDC_KEPT_W    # left for the owners
            got = owner.poll(0)
            owner.leave_all()
            assert [(e.fd, e.events & lib.FDC_POLL_OUT) for e in got] == [
                (fd, lib.FDC_POLL_OUT)]
            assert owner.counters()["wakeups"] == before + 1
            assert not table.dump(fd).state & lib.FDC_KEPT_W
        finally:
            table.threads[0].delete(fd)
            peer.close()


def test_a_direction_change_makes_no_epoll_ctl_and_no_update(conn):
    """Once each thread has its registration (a sibling adds EPOLLOUT the
    first time it passes while send is wanted), no change of direction
    makes an epoll_ctl call in any thread, programs an update or puts the
    fd on the group's list; the inserter's registration never changes."""
    table, fd, _peer = conn
    ins = table.threads[0]
    ins.want_send(fd)
    for th in table.threads:
        th.update_pass()
    for th in table.threads:
        th.poll(0)
        th.leave_all()
    info = table.dump(fd)
    assert info.polled_send == 0b111 and info.polled_recv == 0b111
    before = ctl_counts(table)
    regs = [interest(th.epfd, fd) for th in table.threads]
    for change in (ins.stop_send, ins.want_send, ins.stop_recv, ins.want_recv,
                   ins.stop_send, table.threads[2].want_send, table.threads[1].stop_send):
        change(fd)
        info = table.dump(fd)
        assert not info.update_mask and not info.in_shared_list, change
        for th in table.threads:
            th.poll(0)
            th.leave_all()
    assert ctl_counts(table) == before
    assert [interest(th.epfd, fd) for th in table.threads] == regs
    assert regs[0][0] == EPOLLIN | EPOLLOUT | EPOLLEXCLUSIVE | EPOLLET


def test_the_inserter_never_re_registers():
    """Counted from the insert on: the inserting thread makes one ADD for
    the connection, and no other epoll_ctl for it, through every direction
    change (the affinity's condition)."""
    with Table(2, 1) as table:
        a, peer = socket.socketpair()
        fd = a.detach()
        ins = table.threads[0]
        try:
            before = ins.counters()
            ins.insert_shared(fd, OWNER, 0b11)
            for change in (ins.want_send, ins.stop_recv, ins.stop_send, ins.want_recv):
                change(fd)
                ins.poll(0)
                ins.leave_all()
            after = ins.counters()
            # its own ADD and the sibling's, made by the inserter
            assert after["ctl_add"] - before["ctl_add"] == 2
            assert (after["ctl_del"], after["ctl_mod"]) == (before["ctl_del"], before["ctl_mod"])
        finally:
            ins.delete(fd)
            peer.close()


def test_a_round_of_kept_edges_is_not_an_empty_poll():
    """An AF_UNIX peer's every read reports the socket writable to the
    inserter (registered EPOLLOUT for good): a poll that got only such
    reports waits on for what is left of its timeout instead of returning
    empty-handed, and counts no empty wake-up."""
    with Table(2, 1) as table:
        a, peer = socket.socketpair()
        fd = a.detach()
        ins = table.threads[0]
        try:
            ins.insert_shared(fd, OWNER, 0b11)
            os.write(fd, b"r" * 1000)
            before = ins.counters()["wake_nowork"]
            t0 = time.monotonic()
            p = Poller(ins, 400)                       # the ADD's edge: kept, waits on
            wait_asleep([p])
            assert peer.recv(1000)                     # a writable edge: kept, waits on
            assert p.join() == []
            elapsed = time.monotonic() - t0
            assert 0.35 < elapsed < 2.0, elapsed       # its own timeout, not twice it
            assert ins.counters()["wake_nowork"] == before
            assert table.dump(fd).state & lib.FDC_KEPT_W
        finally:
            ins.delete(fd)
            peer.close()
