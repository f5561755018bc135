"""Review of the balance between workers (worker/gate.py, worker/board.py,
their use in worker/loop.py, commit 38b6497): ways a connection is left in
the accept queue with nobody polling and no check pending.

In-process Loop over a real fdcore Table and real loopback sockets. The
board is a real Board; slot 1 plays "the other worker": it reads 0
connections and never accepts (a worker busy in a slow handler, or hung),
so the worker under test (slot 0) becomes ahead after 3 connections and
the only thing that can serve the next one is its own timer (the TCP_INFO
accept-queue check). The control test shows that check works in the
simple case; the two others (comments "Was:") failed before the fixes in
worker/gate.py (every distinct listener's queue checked, and a late check
run by any loop thread).
"""
from __future__ import annotations

import socket
import threading
import time

import pytest

from sockherd.fdcore import Table
from sockherd.worker.board import Board
from sockherd.worker.gate import BALANCE
from sockherd.worker.loop import Loop

pytestmark = pytest.mark.timeout(120)

RELEASE = threading.Event()        # set by the fixture at teardown


class Tid:
    """Replies with the serving loop thread's tid; b"block" blocks that
    thread (in app code) until RELEASE."""
    def on_data(self, conn, data):
        if data == b"block":
            conn.write(b"%d" % conn.th.tid)
            RELEASE.wait(20)
            return
        conn.write(b"%d" % conn.th.tid)


@pytest.fixture
def rig():
    made = []
    RELEASE.clear()

    def make(threads=1, groups=1, listeners=1):
        table = Table(threads, groups)
        loop = Loop(table, Tid, takeover_after=0.3)
        board = Board.create()
        board.slots[0] = 0
        board.slots[1] = 0                 # the other worker: serving, 0 conns, never accepts
        loop.gate.board, loop.gate.index, loop.gate.upto = board, 0, 2
        addrs = []
        for _ in range(listeners):
            srv = socket.create_server(("127.0.0.1", 0), backlog=128)
            addrs.append(srv.getsockname())
            loop.add_listener(srv)
        made.append((loop, table, board))
        loop.start()
        return loop, addrs

    yield make
    RELEASE.set()
    for loop, table, board in made:
        loop.stop()
        table.close()
        board.close()


def ask(addr, payload=b"?", timeout=10.0):
    """A new connection to addr; sends payload, returns (socket, reply, seconds)."""
    t0 = time.monotonic()
    c = socket.create_connection(addr, timeout=timeout)
    c.sendall(payload)
    try:
        reply = c.recv(100)
    except TimeoutError:
        reply = b"<timeout>"
    return c, reply, time.monotonic() - t0


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def become_ahead(loop, addr, held):
    """Three connections, then a fourth accepted while ahead: the gate turns
    the balance off (stops polling) on the thread that accepted it, which
    becomes the ticker. Returns that fourth connection."""
    for _ in range(3):
        c, r, _ = ask(addr)
        held.append(c)
        assert r.isdigit(), r
    c, r, _ = ask(addr)
    held.append(c)
    assert r.isdigit(), r
    wait_for(lambda: BALANCE in loop.gate.reasons, 5, "the balance off")
    assert loop.gate._ticker == int(r)
    return c


def test_held_the_worker_ahead_serves_what_nobody_else_takes(rig):
    """Control: one TCP listener, the ticker free: the accept-queue check
    resumes polling within a few ms and serves the connection."""
    loop, (addr,) = rig(threads=2)
    held = []
    try:
        become_ahead(loop, addr, held)
        for _ in range(5):
            c, r, waited = ask(addr, timeout=5)
            held.append(c)
            assert r.isdigit() and waited < 1.0, (r, waited)
    finally:
        for c in held:
            c.close()


# Was: finding 1: the accept-queue check reads only the first listener (gate._accept_queue
# returns on the first fd); a connection on any other listener (a second bind, or
# [::]:port's IPv4 twin) is stranded (fixed; this test failed before).
def test_a_connection_on_the_second_listener_is_not_stranded(rig):
    loop, addrs = rig(threads=1, listeners=2)
    held = []
    try:
        # which listener the check reads: the first fd of the set
        first = next(iter(list(loop.listeners)))
        s = socket.socket(fileno=first)
        try:
            checked = s.getsockname()
        finally:
            s.detach()
        other = next(a for a in addrs if a != checked)
        become_ahead(loop, checked, held)
        c, r, waited = ask(other, timeout=3)
        held.append(c)
        assert r.isdigit() and waited < 1.0, f"served {r!r} after {waited:.2f}s"
    finally:
        for c in held:
            c.close()


# Was: finding 2: only the thread that turned the balance off runs the check
# (gate._ticker); while it is in a slow handler the worker's idle threads neither poll the
# listener nor check the queue: stranded (fixed; this test failed before).
def test_a_busy_ticker_thread_does_not_strand_connections(rig):
    loop, (addr,) = rig(threads=2)
    held = []
    try:
        fourth = become_ahead(loop, addr, held)
        fourth.sendall(b"block")               # the ticker thread is now in app code
        time.sleep(0.2)
        assert BALANCE in loop.gate.reasons     # still ahead: not polling
        c, r, waited = ask(addr, timeout=3)
        held.append(c)
        assert r.isdigit() and waited < 1.0, f"served {r!r} after {waited:.2f}s (idle sibling)"
    finally:
        RELEASE.set()
        for c in held:
            c.close()


# Was: a loop thread died with EBADF (the multi-host benchmark, an upgrade's drain): the
# gate's accept-queue check made a socket object of a listener fd that a draining
# thread had deleted, and so closed, since the listener set was read.
def test_the_queue_check_survives_a_listener_closed_under_it(rig):
    import os

    loop, _ = rig(threads=1)
    closed = os.open("/dev/null", os.O_RDONLY)
    os.close(closed)                            # a number that is no open fd now
    loop.listeners.add(closed)
    try:
        assert loop.gate._accept_queue() is None
    finally:
        loop.listeners.discard(closed)
