"""Seed 004 end to end: a listener also held by another process, and
listeners bound to some threads only (notes A.10, A.11, E/T5).

An epoll registration is keyed by (open file description, fd number) and
only goes away by itself with the *last* reference to the description. A
listener inherited by another process (here: a helper subprocess that got it
through pass_fds) therefore stays registered in our epoll instances after our
close() unless we DEL it first, which is what the CLONED flag is for, and the
other process's traffic keeps waking our threads for a number we no longer
own (HAProxy 561319bd1 / seed 004: old workers woken at the new worker's
accept rate).
"""
from __future__ import annotations

import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sockherd.fdcore.table import Table

pytestmark = pytest.mark.timeout(90)

HELPER = Path(__file__).with_name("accept_peer.py")
WAKE_TOKEN = 0xFFFFFFFFFFFFFFFF
EPOLLEXCLUSIVE = 0x10000000
_TFD = re.compile(r"^tfd:\s*(\d+)\s+events:\s*([0-9a-fA-F]+)\s+data:\s*([0-9a-fA-F]+)", re.M)
FLAT = ("poll_io", "poll_drop_fd", "poll_skip_fd", "poll_stale", "wake_nowork", "wakeups",
        "accepted", "accept_empty")


def open_fdinfo(epfd: int) -> str:
    with open(f"/proc/self/fdinfo/{epfd}") as f:
        return f.read()


def kernel_fds(epfd: int) -> list[int]:
    """fd numbers registered in epoll instance epfd (minus the wake-up fd)."""
    return [int(m[1]) for m in _TFD.finditer(open_fdinfo(epfd)) if int(m[3], 16) != WAKE_TOKEN]


def listed_in(t: Table, fd: int) -> list[int]:
    return [th.tid for th in t.threads if fd in kernel_fds(th.epfd)]


def wait_until(pred, timeout: float, what: str, step: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    ev = threading.Event()
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        ev.wait(step)


def make_listener(backlog: int = 1024) -> tuple[int, int]:
    """A non-blocking listener on 127.0.0.1: (fd, port); the caller owns fd."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(backlog)
    s.setblocking(False)
    port = s.getsockname()[1]
    return s.detach(), port


# ---------------------------------------------------------------------------
# fixtures


class Peer:
    """The helper process holding the listener too."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def stop(self, timeout: float = 20) -> int:
        """Closes its stdin (communicate does), reaps it; returns how many connections it accepted."""
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, (self.proc.returncode, out, err)
        m = re.search(rb"accepted (\d+)", out)
        assert m, (out, err)
        return int(m[1])


@pytest.fixture
def peers():
    """Spawns accept_peer.py holding a listener; every one is reaped."""
    started: list[subprocess.Popen] = []

    def spawn(lfd: int, mode: str, seconds: float = 80, *, scm: bool = False) -> Peer:
        """The listener goes to the child through pass_fds, or with scm=True
        over a unix socketpair (SCM_RIGHTS), as a live hand-off would."""
        if not scm:
            p = subprocess.Popen([sys.executable, str(HELPER), str(lfd), mode, str(seconds)],
                                 pass_fds=(lfd,), stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            started.append(p)
        else:
            here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            with here, there:
                p = subprocess.Popen([sys.executable, str(HELPER), f"scm:{there.fileno()}", mode,
                                      str(seconds)], pass_fds=(there.fileno(),),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
                started.append(p)
                socket.send_fds(here, [b"L"], [lfd])
        r, _, _ = select.select([p.stdout], [], [], 30)
        assert r, "helper did not start"
        line = p.stdout.readline()
        assert line == b"ready\n", (line, p.poll())
        return Peer(p)

    yield spawn
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=20)
        for stream in (p.stdin, p.stdout, p.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def clients():
    """Client sockets of a test, closed at teardown."""
    socks: list[socket.socket] = []
    yield socks
    for s in socks:
        s.close()


# ---------------------------------------------------------------------------
# seed 004: the listener held by another process


def register_everywhere(t: Table, layout: str, lfd: int, *, cloned: bool,
                        exclusive: bool = False) -> dict[int, int]:
    """Inserts the listener for every thread, wants recv, runs a poll pass on
    each thread and checks the kernel lists it. Returns {tgid: fd}."""
    if layout == "1x4":
        # not cloned: the caller must say the listener is its alone (sole), or
        # the table marks it CLONED anyway (issue 6)
        t.insert(lfd, 77, tgid=1, thread_mask=0b1111, cloned=cloned, sole=not cloned,
                 exclusive=exclusive)
        fds = {1: lfd}
    else:
        assert cloned
        fds = t.insert_listener(lfd, 77, {1: 0b11, 2: 0b11})
    for tgid, fd in fds.items():
        t.threads[t.group_base(tgid)].want_recv(fd)
    for th in t.threads:
        for e in th.poll(0):
            th.leave(e.fd, e.gen)
    for tgid, fd in fds.items():
        assert listed_in(t, fd) == [th.tid for th in t.threads if th.tgid == tgid]
    return fds


def poll_rounds(t: Table, min_rounds: int, until=None, timeout: float = 60) -> int:
    """poll(20) on each thread, round robin, at least min_rounds rounds and
    until `until()` holds. Returns the number of rounds (calls per thread)."""
    deadline = time.monotonic() + timeout
    rounds = 0
    while rounds < min_rounds or (until is not None and not until()):
        assert time.monotonic() < deadline, "poll rounds did not finish in time"
        for th in t.threads:
            for e in th.poll(20):
                th.leave(e.fd, e.gen)
        rounds += 1
    return rounds


def flood(port: int, n: int, done: list, errors: list) -> None:
    """n sequential connections, each waiting for the peer's answer."""
    try:
        for _ in range(n):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
                buf = b""
                while not buf.endswith(b"\n"):
                    chunk = c.recv(16)
                    if not chunk:
                        break
                    buf += chunk
                if buf == b"ok\n":
                    done.append(1)
    except BaseException as exc:
        errors.append(exc)


@pytest.mark.parametrize("layout,scm", [("1x4", False), ("2x2", False), ("1x4", True)],
                         ids=["1x4", "2x2", "1x4-scm_rights"])
def test_cloned_listener_deleted_here_never_wakes_us_under_flood(tables, peers, layout, scm):
    lfd, port = make_listener()
    peer = peers(lfd, "accept", scm=scm)
    t = tables(4, 1 if layout == "1x4" else 2)
    fds = register_everywhere(t, layout, lfd, cloned=True)

    # delete here (the group-2 number from a thread of group 1: cross-group)
    for fd in fds.values():
        assert t.threads[0].delete(fd) is True
        assert t.dump(fd).tgid == 0
    for th in t.threads:
        assert kernel_fds(th.epfd) == [], (th.tid, kernel_fds(th.epfd))
    poll_rounds(t, 1)                      # drain wake-ups programmed earlier
    before = [th.counters() for th in t.threads]

    done: list = []
    errors: list = []
    client = threading.Thread(target=flood, args=(port, 200, done, errors), daemon=True)
    client.start()
    try:
        rounds = poll_rounds(t, 5, until=lambda: not client.is_alive())
    finally:
        client.join(timeout=30)
    assert not client.is_alive()
    assert not errors, errors
    assert len(done) == 200                # the other process kept serving
    after = [th.counters() for th in t.threads]
    for th, b, a in zip(t.threads, before, after):
        assert a["loops"] - b["loops"] == rounds, (th.tid, b, a)
        for name in FLAT:
            assert a[name] == b[name], (th.tid, name, b, a)
        assert kernel_fds(th.epfd) == []
    assert peer.stop() == 200


@pytest.mark.parametrize("cloned,exclusive", [(True, False), (True, True), (False, False)],
                         ids=["cloned", "cloned-exclusive", "not-cloned"])
def test_pending_connection_on_inherited_listener(tables, peers, clients, cloned, exclusive):
    """Deterministic form: the other process holds the listener but does not
    accept, a connection stays queued, the listener stays readable (level
    triggered). With CLONED our threads never hear of it again; without it,
    every single poll of every thread is a stale wake-up."""
    lfd, port = make_listener()
    peer = peers(lfd, "hold")
    t = tables(4, 1)
    register_everywhere(t, "1x4", lfd, cloned=cloned, exclusive=exclusive)
    assert t.threads[1].delete(lfd) is True
    poll_rounds(t, 1)
    clients.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    before = [th.counters() for th in t.threads]
    rounds = poll_rounds(t, 5)
    after = [th.counters() for th in t.threads]
    for th, b, a in zip(t.threads, before, after):
        assert a["loops"] - b["loops"] == rounds
        if cloned:
            assert kernel_fds(th.epfd) == []
            for name in FLAT:
                assert a[name] == b[name], (th.tid, name, b, a)
        else:
            # seed 004's bug: the registration outlived our close() because
            # the file description is still open in the other process, and
            # the queued connection wakes every thread on every loop for an
            # fd number we no longer own (only the generation filter keeps
            # it from being delivered as an event)
            assert lfd in kernel_fds(th.epfd)
            assert a["poll_stale"] - b["poll_stale"] == rounds, (th.tid, b, a)
            assert a["wake_nowork"] - b["wake_nowork"] == rounds, (th.tid, b, a)
            assert a["poll_io"] - b["poll_io"] == rounds, (th.tid, b, a)
    assert peer.stop() == 0


@pytest.mark.parametrize("cloned", [True, False], ids=["cloned", "not-cloned"])
def test_pending_connection_on_listener_kept_by_a_dup(tables, clients, cloned):
    """Same with the other holder a dup() in this very process (notes A.11:
    dup'ed, forked and transferred fds are all 'cloned')."""
    lfd, port = make_listener()
    keep = os.dup(lfd)
    try:
        t = tables(2, 1)
        t.insert(lfd, 78, tgid=1, thread_mask=0b11, cloned=cloned, sole=not cloned)
        t.threads[0].want_recv(lfd)
        poll_rounds(t, 1)
        assert listed_in(t, lfd) == [0, 1]
        assert t.threads[0].delete(lfd) is True
        clients.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        before = [th.counters() for th in t.threads]
        rounds = poll_rounds(t, 5)
        after = [th.counters() for th in t.threads]
        for th, b, a in zip(t.threads, before, after):
            if cloned:
                assert kernel_fds(th.epfd) == []
                for name in FLAT:
                    assert a[name] == b[name], (th.tid, name, b, a)
            else:
                # the dup keeps the description, hence our registration, alive
                assert lfd in kernel_fds(th.epfd)
                assert a["poll_stale"] - b["poll_stale"] == rounds, (th.tid, b, a)
    finally:
        os.close(keep)


def test_uncloned_delete_leaves_kernel_registration(tables, peers):
    """Negative control, why CLONED matters: inserted without it, the
    listener is closed here but the kernel keeps it registered in every
    epoll instance of this process while the other process holds it."""
    lfd, port = make_listener()
    peer = peers(lfd, "accept")
    t = tables(4, 1)
    register_everywhere(t, "1x4", lfd, cloned=False)
    assert t.threads[0].delete(lfd) is True
    info = t.dump(lfd)
    assert info.tgid == 0 and info.polled_recv == 0   # we believe it gone...
    # ...the kernel does not: this is seed 004's bug, reproduced on purpose
    assert listed_in(t, lfd) == [0, 1, 2, 3]
    poll_rounds(t, 1)
    before = [th.counters() for th in t.threads]
    done: list = []
    errors: list = []
    client = threading.Thread(target=flood, args=(port, 200, done, errors), daemon=True)
    client.start()
    try:
        rounds = poll_rounds(t, 5, until=lambda: not client.is_alive())
    finally:
        client.join(timeout=30)
    assert not errors, errors
    assert len(done) == 200
    after = [th.counters() for th in t.threads]
    stale = [a["poll_stale"] - b["poll_stale"] for b, a in zip(before, after)]
    # how often the other process's accepts woke us depends on scheduling:
    # shown, not asserted (the pending-connection test asserts it exactly)
    print(f"\nuncloned listener, 200 connections served elsewhere, {rounds} poll rounds: "
          f"stale wake-ups per thread {stale}")
    for th in t.threads:
        assert lfd in kernel_fds(th.epfd)       # still there after the flood
    assert peer.stop() == 200
    # once the other holder is gone, the last reference goes and so does
    # the registration
    for th in t.threads:
        assert lfd not in kernel_fds(th.epfd)


# ---------------------------------------------------------------------------
# listeners bound to some threads (seed 004's original symptom), real threads


class Pollers:
    """One OS thread per context, each looping poll(50) / accept / leave."""

    def __init__(self, t: Table, lfd: int):
        self.t = t
        self.lfd = lfd
        self.stop_flag = threading.Event()
        self.polls = [0] * len(t.threads)
        self.ports: list[int] = []
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(th,), daemon=True)
                        for th in t.threads]

    def _run(self, th) -> None:
        try:
            while not self.stop_flag.is_set():
                evs = th.poll(50)
                self.polls[th.tid] += 1
                for e in evs:
                    try:
                        if e.fd == self.lfd:
                            for c in th.accept(self.lfd):
                                s = socket.socket(fileno=c)
                                try:
                                    self.ports.append(s.getpeername()[1])
                                finally:
                                    s.close()
                    finally:
                        th.leave(e.fd, e.gen)
        except BaseException as exc:
            self.errors.append(exc)

    def start(self) -> None:
        for x in self.threads:
            x.start()

    def stop(self) -> None:
        self.stop_flag.set()
        for th in self.t.threads:
            self.t.wake(th.tid)
        for x in self.threads:
            x.join(timeout=30)
        assert not any(x.is_alive() for x in self.threads), "a poller thread did not stop"


@pytest.fixture
def pollers(tables):
    """Pollers factory; stopped (and joined) before the tables are freed."""
    made: list[Pollers] = []

    def make(t: Table, lfd: int) -> Pollers:
        p = Pollers(t, lfd)
        made.append(p)
        p.start()
        return p

    yield make
    for p in made:
        if not p.stop_flag.is_set():
            p.stop()


def connect_many(port: int, n: int, clients: list[socket.socket]) -> list[int]:
    """Opens n connections from a client thread; returns their local ports."""
    ports: list[int] = []
    errors: list[BaseException] = []

    def run():
        try:
            for _ in range(n):
                c = socket.create_connection(("127.0.0.1", port), timeout=10)
                clients.append(c)
                ports.append(c.getsockname()[1])
        except BaseException as exc:
            errors.append(exc)

    x = threading.Thread(target=run, daemon=True)
    x.start()
    x.join(timeout=60)
    assert not x.is_alive() and not errors, errors
    return ports


N_CONNS = 300


def test_listener_on_one_thread_wakes_only_that_thread(tables, pollers, clients):
    t = tables(4, 1)
    lfd, port = make_listener()
    t.insert(lfd, 5, tgid=1, thread_mask=1 << 0)
    t.threads[0].want_recv(lfd)
    p = pollers(t, lfd)
    client_ports = connect_many(port, N_CONNS, clients)
    wait_until(lambda: len(p.ports) >= N_CONNS, 60, "all connections accepted")
    quiet = [th.counters() for th in t.threads]
    polls_then = list(p.polls)
    p.stop()
    assert not p.errors, p.errors
    assert sorted(p.ports) == sorted(client_ports)
    final = [th.counters() for th in t.threads]
    assert final[0]["accepted"] == N_CONNS
    assert listed_in(t, lfd) == [0]          # only thread 0's instance has it
    for tid in (1, 2, 3):
        q, f = quiet[tid], final[tid]
        # before the stop wake-up: never woken at all
        assert q["poll_io"] == 0, (tid, q)
        assert q["loops"] <= polls_then[tid] + 1, (tid, q, polls_then)
        # after: only our wake-up, and loops == its own poll calls
        assert f["poll_io"] == f["wakeups"], (tid, f)
        assert f["loops"] == p.polls[tid], (tid, f, p.polls)
        for name in ("accepted", "accept_empty", "wake_nowork", "poll_stale",
                     "poll_drop_fd", "poll_skip_fd"):
            assert f[name] == 0, (tid, name, f)
    print(f"\nlistener on thread 0 of 4: accepted {[c['accepted'] for c in final]}, "
          f"loops {[c['loops'] for c in final]}, poll_io {[c['poll_io'] for c in final]}")


@pytest.mark.parametrize("exclusive", [False, True], ids=["shared", "exclusive"])
def test_shared_listener_accepts_each_connection_once(tables, pollers, clients, exclusive):
    t = tables(4, 1)
    lfd, port = make_listener()
    t.insert(lfd, 5, tgid=1, thread_mask=0b1111, exclusive=exclusive)
    t.threads[0].want_recv(lfd)
    p = pollers(t, lfd)
    client_ports = connect_many(port, N_CONNS, clients)
    wait_until(lambda: len(p.ports) >= N_CONNS, 60, "all connections accepted")
    p.stop()
    assert not p.errors, p.errors
    assert len(p.ports) == N_CONNS
    assert sorted(p.ports) == sorted(client_ports)    # each accepted exactly once
    final = [th.counters() for th in t.threads]
    accepted = [c["accepted"] for c in final]
    empty = [c["accept_empty"] for c in final]
    nowork = [c["wake_nowork"] for c in final]
    assert sum(accepted) == N_CONNS
    for c in final:
        assert c["poll_stale"] == 0 and c["ctl_err"] == 0, c
    for th in t.threads:
        (ev,) = [int(m[2], 16) for m in _TFD.finditer(open_fdinfo(th.epfd))
                 if int(m[1]) == lfd]
        assert bool(ev & EPOLLEXCLUSIVE) == exclusive, hex(ev)
    if exclusive:
        assert sum(empty) <= sum(accepted), (empty, accepted)
    print(f"\n{'EXCLUSIVE' if exclusive else 'shared'} listener on 4 threads, {N_CONNS} "
          f"connections: accepted {accepted} (sum {sum(accepted)}), accept_empty {empty} "
          f"(sum {sum(empty)}), wake_nowork {nowork}, "
          f"loops {[c['loops'] for c in final]}")
