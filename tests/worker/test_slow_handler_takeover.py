"""Review of the slow-handler takeover (worker/loop.py: the watchdog thread,
_ask_relief, _take_from): interleavings that break it, and regressions for
what held.

In-process Loop over a real fdcore Table, real loopback sockets, real loop
threads. Most tests pin a listener to one loop thread (`pinned_listener`,
the same insert as Loop.add_listener with one thread in the mask) so the
test knows which thread owns which connection: the victim V is always
loop thread 0, its idle sibling S is thread 1 of the same group. What the
tests show does not depend on the pinning; it only makes the owner known.

Each finding's test failed on the code reviewed (commit f9d0fa7 and its
follow-ups) and passes since the fix (worker/relief.py, the entering
dispatch, context-taking Connection verbs); the others are regressions for
what held.
"""
from __future__ import annotations

import os
import random
import select
import socket
import sys
import threading
import time

import pytest

from sockherd.fdcore import State, Table
from sockherd.worker.loop import Loop
from sockherd.worker.loop_core import KIND_LISTENER
from sockherd.worker.stream import HIGH_WATER

pytestmark = pytest.mark.timeout(60)


# ---- helpers -------------------------------------------------------------------

def pinned_listener(loop: Loop, th) -> tuple:
    """A listener served by loop thread context `th` only (before start())."""
    srv = socket.create_server(("127.0.0.1", 0), backlog=128)
    addr = srv.getsockname()
    srv.setblocking(False)
    fds = loop.table.insert_listener(srv.detach(), next(loop._cookies), {th.tgid: th.bit},
                                     kind=KIND_LISTENER, exclusive=True)
    for fd in fds.values():
        loop.listeners.add(fd)
        th.want_recv(fd)
    return addr


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.005)


def recv_exact(sock: socket.socket, n: int, timeout: float = 10.0) -> bytes:
    """Up to n bytes; fewer on EOF; b'<reset>' / b'<timeout>' appended on
    a reset / when nothing more came within timeout."""
    sock.settimeout(timeout)
    out = b""
    while len(out) < n:
        try:
            chunk = sock.recv(min(n - len(out), 1 << 20))
        except ConnectionResetError:
            return out + b"<reset>"
        except TimeoutError:
            return out + b"<timeout>"
        if not chunk:
            break
        out += chunk
    return out


def _called_from(frame, name: str, depth: int = 4) -> bool:
    for _ in range(depth):
        frame = frame.f_back
        if frame is None:
            return False
        if frame.f_code.co_name == name:
            return True
    return False


def recv_ready(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def connect(addr) -> socket.socket:
    return socket.create_connection(addr, timeout=10)


def hello(c: socket.socket, name: bytes) -> None:
    """Registers the connection under `name` (see Hub) and waits for the ack,
    so the server has accepted and handled it and it is idle again."""
    c.sendall(b"name:" + name)
    assert recv_exact(c, 2) == b"ok"


def task_stat(native_id: int) -> tuple[int, float]:
    """(voluntary context switches, CPU seconds) of one thread of ours."""
    with open(f"/proc/self/task/{native_id}/status") as f:
        vol = next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt"))
    with open(f"/proc/self/task/{native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return vol, cpu


def watchdog_thread(loop: Loop) -> threading.Thread:
    return next(t for t in loop._threads if t.name == "sockherd-watchdog")


def thread_tid() -> int:
    """The fdcore tid of the calling loop thread (threads are named sockherd-<tid>)."""
    name = threading.current_thread().name
    return int(name.rsplit("-", 1)[1]) if name.startswith("sockherd-") else -1


@pytest.fixture
def rig():
    """rig(handler, pins=(0,), threads=2, groups=1, takeover_after=0.3, start=True)
    -> (loop, [addr per pinned thread]). rig.gates: events set before stop."""
    made = []
    gates: list[threading.Event] = []

    def make(handler, pins=(0,), threads=2, groups=1, takeover_after=0.3, start=True, **kw):
        table = Table(threads, groups)
        loop = Loop(table, handler, takeover_after=takeover_after, **kw)
        made.append((loop, table))
        addrs = [pinned_listener(loop, loop.loop_threads[i]) for i in pins]
        if start:
            loop.start()
        return loop, addrs

    make.gates = gates
    yield make
    for g in gates:
        g.set()
    for loop, table in made:
        if not loop._stop.is_set():
            loop.stop()
        table.close()


class Hub:
    """A small app with the patterns the tests need.

    name:<n>   registers the connection as Hub.reg[n], answers ok
    block      sets Hub.event(<n>-in), waits Hub.event(<n>-go) (10 s at most),
               answers unblocked; <n> is this connection's name
    nap        sets Hub.event(<n>-in), sleeps 0.15 s, answers napped
    anything else is echoed. Every call is recorded in Hub.calls as
    (name, loop thread tid, data); a call while another call of the same
    connection runs is recorded in Hub.overlap.
    """

    reg: dict = {}
    ev: dict = {}
    calls: list = []
    overlap: list = []
    gates: list = []

    def __init__(self):
        self.name = b"?"
        self.inside = 0

    def on_data(self, conn, data):
        self.inside += 1
        try:
            if self.inside > 1:
                Hub.overlap.append(self.name)
            Hub.calls.append((self.name, thread_tid(), data))
            if data.startswith(b"name:"):
                self.name = data[5:]
                Hub.reg[self.name] = conn
                conn.write(b"ok")
            elif data == b"block":
                Hub.event(self.name + b"-in").set()
                Hub.event(self.name + b"-go").wait(10)
                conn.write(b"unblocked")
            elif data == b"nap":
                Hub.event(self.name + b"-in").set()
                time.sleep(0.15)
                conn.write(b"napped")
            else:
                conn.write(data)
        finally:
            self.inside -= 1

    @staticmethod
    def event(key: bytes) -> threading.Event:
        e = Hub.ev.get(key)
        if e is None:
            e = Hub.ev.setdefault(key, threading.Event())
            if key.endswith(b"-go"):
                Hub.gates.append(e)
        return e

    @staticmethod
    def reset(rig) -> None:
        Hub.reg, Hub.ev, Hub.calls, Hub.overlap = {}, {}, [], []
        Hub.gates = rig.gates             # every -go event is set at teardown


# ---- finding 1: a connection taken over while its on_connect runs -------------

# Was: finding 1: _accept runs on_connect (and the _sync after it) without a running bit
# on the new fd, while the connection is already in loop.conns with c.th the accepting
# thread; a slow on_connect makes that thread 'stuck', and the sibling's _take_from takes
# the very connection whose on_connect runs (fdc_takeover sees running_mask 0): the
# sibling runs on_data concurrently with on_connect, and the victim then uses the
# sibling's Thread context from its own OS thread (fixed; this test failed before the
# fix).
def test_no_takeover_of_a_connection_whose_on_connect_runs(rig):
    log = []
    release = threading.Event()
    rig.gates.append(release)

    class Greeter:
        connecting = False

        def on_connect(self, conn):
            self.connecting = True
            release.wait(1.5)            # connect-time work: an auth or geo lookup
            conn.write(b"hello\n")
            log.append(("connect-end", thread_tid(), conn.th.tid))
            self.connecting = False

        def on_data(self, conn, data):
            log.append(("data", thread_tid(), self.connecting))
            conn.write(b"got:" + data)

    loop, [addr] = rig(Greeter)
    with connect(addr) as c:
        c.sendall(b"x")                  # the client speaks first (HTTP, TLS)
        got = recv_exact(c, len(b"hello\ngot:x"))
    assert not [e for e in log if e[0] == "data" and e[2]], \
        f"on_data ran while on_connect was still running: {log}"
    ends = [e for e in log if e[0] == "connect-end"]
    assert ends and ends[0][1] == ends[0][2], \
        f"on_connect's thread now drives another thread's fdcore context: {ends}"
    assert got == b"hello\ngot:x"


# ---- finding 2: the rest of an accept batch waits behind a slow on_connect ----

# Was: finding 2: _accept inserts and on_connect's the accepted fds one by one; while one
# on_connect is slow, the other fds of the same accept batch (up to accept_batch=64) are
# neither in the table nor in loop.conns, so no takeover can move them and their clients
# wait for the slow on_connect (fixed; this test failed before the fix).
def test_rest_of_accept_batch_not_stuck_behind_a_slow_on_connect(rig):
    first = []
    lock = threading.Lock()
    release = threading.Event()
    rig.gates.append(release)

    class SlowFirst:
        def on_connect(self, conn):
            with lock:
                mine = not first
                first.append(conn.fd)
            if mine:
                release.wait(2.0)

        def on_data(self, conn, data):
            conn.write(data)

    loop, [addr] = rig(SlowFirst, start=False)
    clients = [connect(addr) for _ in range(4)]  # all in the accept queue: one batch
    try:
        for c in clients[1:]:
            c.sendall(b"ping")
        loop.start()
        t0 = time.monotonic()
        for c in clients[1:]:
            assert recv_exact(c, 4) == b"ping"
        elapsed = time.monotonic() - t0
    finally:
        for c in clients:
            c.close()
    assert elapsed < 0.3 + 0.9, f"served {elapsed:.2f}s late: stuck behind one on_connect"


# ---- finding 3: the stuck handler's own references become cross-thread --------

# Was: finding 3: a handler stuck on V keeps references to V's other connections (a room,
# a pub/sub, a proxy pair). After S takes one over, conn.th is S's context; V's handler
# closing it calls S.delete from V's OS thread, which ORs and then clears S's own running
# bit: the core closes the fd while S is inside its handler (I4), and the number can be
# reused under S (fixed; this test failed before the fix).
def test_stuck_handler_closing_a_connection_taken_meanwhile(rig):
    Hub.reset(rig)
    done = threading.Event()
    z_in, z_go = threading.Event(), threading.Event()
    rig.gates.append(z_go)

    class Room(Hub):
        def on_data(self, conn, data):
            if data == b"kick":                 # P: slow, then kicks Z out of the room
                Hub.event(b"P-in").set()
                Hub.event(b"P-go").wait(10)
                Hub.reg[b"Z"].close()
                done.set()
            elif data == b"slow":               # Z: its handler is running on S
                z_in.set()
                z_go.wait(10)
                conn.write(b"late")
            else:
                super().on_data(conn, data)

    loop, [addr] = rig(Room)
    p, z = connect(addr), connect(addr)
    try:
        hello(p, b"P")
        hello(z, b"Z")
        zconn = Hub.reg[b"Z"]
        zfd, cookie = zconn.fd, zconn.cookie
        p.sendall(b"kick")
        assert Hub.event(b"P-in").wait(5)
        z.sendall(b"slow")
        assert z_in.wait(5), "Z was not taken over"
        assert zconn.th is not Hub.reg[b"P"].th
        Hub.event(b"P-go").set()
        assert done.wait(5)
        info = loop.table.dump(zfd)
        # S is still inside Z's handler: the close must wait for its leave
        still_open = info.tgid != 0 and info.owner == cookie
        z_go.set()
    finally:
        p.close()
        z.close()
    assert still_open, f"fd {zfd} closed while its owner was inside its handler: {info}"


# ---- finding 4: drain closes a connection with a request waiting --------------

# Was: finding 4: _take_from does not refresh conn.last_active, and the taker runs
# _drain_step before its next poll: while draining, a connection taken because a request
# is waiting is closed at once as 'idle' (its last handled event is older than idle_grace
# only because its thread was stuck), the request unread: reset (fixed; this test failed
# before the fix).
def test_connection_taken_while_draining_is_served_not_closed_as_idle(rig):
    Hub.reset(rig)
    loop, [addr] = rig(Hub, takeover_after=0.5)
    p, z = connect(addr), connect(addr)
    try:
        hello(p, b"P")
        hello(z, b"Z")                      # Z's last activity: now
        p.sendall(b"block")
        assert Hub.event(b"P-in").wait(5)
        loop.drain(idle_grace=0.3)
        z.sendall(b"req")                   # well within the grace of Z's last activity
        got = recv_exact(z, 3, timeout=5)
    finally:
        Hub.event(b"P-go").set()
        p.close()
        z.close()
    assert got == b"req", f"Z got {got!r} instead of its reply"


# Was: finding 4 (no idle sibling): a thread back from a handler longer than idle_grace
# runs _drain_step before polling, and closes connections whose requests arrived while it
# was stuck (last_active is only refreshed by a handled event): reset (fixed; this test
# failed before the fix).
def test_thread_back_from_slow_handler_does_not_drain_close_pending_requests(rig):
    Hub.reset(rig)
    loop, [addr_v, addr_s] = rig(Hub, pins=(0, 1), takeover_after=0.3)
    p, z, q = connect(addr_v), connect(addr_v), connect(addr_s)
    try:
        hello(p, b"P")
        hello(z, b"Z")
        hello(q, b"Q")
        q.sendall(b"block")                 # S is stuck too: nobody can relieve V
        assert Hub.event(b"Q-in").wait(5)
        p.sendall(b"block")
        assert Hub.event(b"P-in").wait(5)
        loop.drain(idle_grace=0.3)
        z.sendall(b"req")                   # within the grace of Z's last activity
        time.sleep(1.0)
        Hub.event(b"P-go").set()            # V comes back after 1 s
        got = recv_exact(z, 3, timeout=5)
    finally:
        Hub.event(b"P-go").set()
        Hub.event(b"Q-go").set()
        for c in (p, z, q):
            c.close()
    assert got == b"req", f"Z got {got!r} instead of its reply"


# ---- finding 5: a slow on_close during a drain is not watched -----------------

# Was: finding 5: _drain_step closes idle connections (on_close, an app handler) with the
# thread's busy stamp at 0: a slow on_close there is invisible to the watchdog, and the
# thread's other clients wait for it (fixed; this test failed before the fix).
def test_slow_on_close_in_drain_is_watched(rig):
    Hub.reset(rig)
    release = threading.Event()
    rig.gates.append(release)

    class SlowClose(Hub):
        def on_close(self, conn):
            if self.name == b"I":
                release.wait(2.0)           # session clean-up in a database

    loop, [addr] = rig(SlowClose)
    i, z = connect(addr), connect(addr)
    try:
        hello(i, b"I")
        time.sleep(0.5)                     # I idle for longer than the grace
        hello(z, b"Z")                      # Z active
        loop.drain(idle_grace=0.3)
        time.sleep(0.05)
        t0 = time.monotonic()
        z.sendall(b"req")
        got = recv_exact(z, 3, timeout=5)
        elapsed = time.monotonic() - t0
    finally:
        release.set()
        i.close()
        z.close()
    assert got == b"req"
    assert elapsed < 0.3 + 0.9, f"Z answered after {elapsed:.2f}s, behind an on_close"


# ---- finding 6: an exception in _take_from kills the loop thread --------------

# Was: finding 6: _take_from is not isolated: once takeover() succeeded, a close of the
# connection from elsewhere (here the stuck handler's own reference, as in finding 3; or
# finding 1's on_connect) between _sync's closed check and its fdcore verb makes
# stop_recv/want_recv raise EBADF, which ends the taker's _run for good: its connections
# are never served again, only loop.errors knows (fixed; this test failed before the fix).
def test_take_from_survives_a_concurrent_close(rig):
    Hub.reset(rig)
    at_sync, closed = threading.Event(), threading.Event()
    rig.gates.extend([at_sync, closed])
    target = {}

    def profiler(frame, event, arg):
        # the taker, inside the _sync that follows its takeover, right after
        # the closed check: the close from the old thread lands here
        if event == "call" and frame.f_code.co_name == "_reading" and not at_sync.is_set():
            conn = frame.f_locals.get("self")
            if conn is not None and conn is target.get("conn") and thread_tid() == 1 \
                    and _called_from(frame, "take_from"):
                at_sync.set()
                closed.wait(5)

    class Room(Hub):
        def on_data(self, conn, data):
            if data == b"kick":                  # P: slow, then kicks Z
                Hub.event(b"P-in").set()
                at_sync.wait(5)
                Hub.reg[b"Z"].close()
                closed.set()
            else:
                super().on_data(conn, data)

    threading.setprofile(profiler)
    try:
        loop, [addr] = rig(Room)
        p, z, w = connect(addr), connect(addr), connect(addr)
        try:
            hello(p, b"P")
            hello(z, b"Z")
            hello(w, b"W")
            target["conn"] = Hub.reg[b"Z"]
            p.sendall(b"kick")
            assert Hub.event(b"P-in").wait(5)
            z.sendall(b"x")                      # Z has work waiting: it is taken
            assert closed.wait(10), "the takeover of Z did not reach _sync"
            time.sleep(0.2)
            # the taker must keep serving (W is V's; V is back, or S takes it)
            w.sendall(b"still")
            assert recv_exact(w, 5) == b"still"
        finally:
            for c in (p, z, w):
                c.close()
        assert not loop.errors, loop.errors
        assert all(t.is_alive() for t in loop._threads)
    finally:
        threading.setprofile(None)


# ---- finding 7: events in the stuck handler's batch cannot move ---------------

# Was: finding 7 (documented in _take_from, but it defeats the purpose under load):
# connections whose events came in the same poll batch as the stuck handler's are held
# (running bit) until the batch is left, so the core refuses their takeover (EBUSY): the
# client ready at the same moment as the slow one waits for it (fixed; this test failed
# before the fix).
def test_connection_in_the_stuck_batch_is_relieved(rig):
    Hub.reset(rig)
    loop, [addr] = rig(Hub)
    n, p, z = connect(addr), connect(addr), connect(addr)
    try:
        hello(n, b"N")
        hello(p, b"P")
        hello(z, b"Z")
        n.sendall(b"nap")                   # V busy 0.15 s (less than takeover_after)
        assert Hub.event(b"N-in").wait(5)
        p.sendall(b"block")                 # both ready before V polls again:
        time.sleep(0.01)
        t0 = time.monotonic()
        z.sendall(b"ping")                  # one batch, P first
        got = recv_exact(z, 4, timeout=3)
        elapsed = time.monotonic() - t0
        assert recv_exact(n, 6) == b"napped"
    finally:
        Hub.event(b"P-go").set()
        for c in (n, p, z):
            c.close()
    assert got == b"ping"
    assert elapsed < 0.3 + 0.9, f"Z answered after {elapsed:.2f}s, behind P's handler"


# ---- finding 8: stop() twice writes to a closed (reusable) fd -----------------

# Was: finding 8: stop() writes the watchdog's eventfd outside the drained_fd >= 0 guard
# that makes the rest of stop() idempotent: a second stop() writes 8 bytes to whatever the
# closed number holds now (fixed; this test failed before the fix).
def test_second_stop_does_not_write_to_a_reused_fd_number(rig):
    loop, _ = rig(Hub)
    wfd = loop.relief._fd
    loop.stop()
    r, w = os.pipe()                        # the free number is reused at once
    opened = {r, w}
    if wfd == r:                            # keep the read end elsewhere
        r = os.dup(r)
        opened.add(r)
    if wfd != w:
        os.dup2(w, wfd)                     # wfd: the write end of our pipe now
        opened.add(wfd)
    try:
        os.set_blocking(r, False)
        try:
            loop.stop()
        except OSError:
            pass
        try:
            leaked = os.read(r, 64)
        except BlockingIOError:
            leaked = b""
    finally:
        for fd in opened:
            os.close(fd)
    assert leaked == b"", f"the second stop() wrote {leaked!r} into fd {wfd}"


# ---- what held: regressions ------------------------------------------------------

def test_takeover_moves_waiting_connections_and_no_handler_runs_twice(rig):
    """V stuck: Z is served by S within takeover_after plus slack; after V
    returns (stale reports for Z in its epoll), every message of Z is handled
    exactly once, on S, never by two threads at once."""
    Hub.reset(rig)
    loop, [addr] = rig(Hub)
    p, z = connect(addr), connect(addr)
    try:
        hello(p, b"P")
        hello(z, b"Z")
        p.sendall(b"block")
        assert Hub.event(b"P-in").wait(5)
        t0 = time.monotonic()
        z.sendall(b"a")
        assert recv_exact(z, 1) == b"a"
        assert time.monotonic() - t0 < 0.3 + 0.9
        zconn = Hub.reg[b"Z"]
        assert zconn.th is loop.loop_threads[1]
        for i in range(5):                  # more of Z while V is still stuck
            z.sendall(b"b%d" % i)
            assert recv_exact(z, 2) == b"b%d" % i
        Hub.event(b"P-go").set()
        assert recv_exact(p, 9) == b"unblocked"
        for i in range(20):                 # V is back: Z stays with S
            z.sendall(b"c%02d" % i)
            assert recv_exact(z, 3) == b"c%02d" % i
    finally:
        Hub.event(b"P-go").set()
        p.close()
        z.close()
    zcalls = [c for c in Hub.calls if c[0] == b"Z" and not c[2].startswith(b"name:")]
    assert [c[2] for c in zcalls] == [b"a"] + [b"b%d" % i for i in range(5)] + \
        [b"c%02d" % i for i in range(20)]
    assert {c[1] for c in zcalls} == {1}
    assert not Hub.overlap
    assert sum(loop.takeovers) >= 1
    assert not loop.errors


def test_pending_output_and_paused_reading_survive_a_takeover(rig):
    """Z has 16 MB of pending output (past HIGH_WATER: reading paused) when V
    gets stuck; the client then reads: S takes Z on POLLOUT, the output
    drains whole while V is still stuck, reading stays paused until below
    LOW_WATER and then resumes."""
    Hub.reset(rig)
    big = os.urandom(16 << 20)
    pend = {}

    class Big(Hub):
        def on_data(self, conn, data):
            if data == b"big":
                conn.write(big)
                pend["after"] = conn.pending
            else:
                super().on_data(conn, data)

    loop, [addr] = rig(Big)
    p, z = connect(addr), connect(addr)
    try:
        hello(p, b"P")
        hello(z, b"Z")
        zconn = Hub.reg[b"Z"]
        z.sendall(b"big")
        wait_for(lambda: "after" in pend, 5, "the big write")
        assert pend["after"] > HIGH_WATER
        p.sendall(b"block")
        assert Hub.event(b"P-in").wait(5)
        time.sleep(0.5)                          # V stuck past takeover_after
        z.sendall(b"more")                       # arrives while reading is paused
        wait_for(lambda: zconn.th is loop.loop_threads[1], 5, "the takeover of Z")
        time.sleep(0.1)
        info = loop.table.dump(zconn.fd)
        assert not info.state & State.ACTIVE_R, "reading resumed while past HIGH_WATER"
        got = recv_exact(z, len(big), timeout=20)
        assert got == big
        assert recv_exact(z, 4) == b"more"       # resumed below LOW_WATER
        assert not recv_ready(p), "V came back before the output drained"
    finally:
        Hub.event(b"P-go").set()
        p.close()
        z.close()
    assert not loop.errors


def test_watchdog_sleeps_without_timeout_when_idle(rig):
    Hub.reset(rig)
    loop, [addr] = rig(Hub, takeover_after=0.1)
    with connect(addr) as c:
        for i in range(20):
            c.sendall(b"x%02d" % i)
            assert recv_exact(c, 3) == b"x%02d" % i
        wd = watchdog_thread(loop)
        time.sleep(0.5)                      # a quiet period: the watchdog goes to sleep
        v0, cpu0 = task_stat(wd.native_id)
        loops0 = [th.counters()["loops"] for th in loop.loop_threads]
        time.sleep(1.0)
        v1, cpu1 = task_stat(wd.native_id)
        loops1 = [th.counters()["loops"] for th in loop.loop_threads]
    assert v1 - v0 == 0, f"watchdog woke {v1 - v0} times while idle"
    assert loops1 == loops0
    assert not loop.errors


def test_watchdog_wakeups_bounded_while_stuck_with_no_idle_sibling(rig):
    """Both threads stuck for 2 s, period 0.2: the watchdog re-checks every
    half period (about 10 wake-ups a second), no spinning."""
    Hub.reset(rig)
    loop, [a0, a1] = rig(Hub, pins=(0, 1), takeover_after=0.2)
    p, q = connect(a0), connect(a1)
    try:
        hello(p, b"P")
        hello(q, b"Q")
        p.sendall(b"block")
        q.sendall(b"block")
        assert Hub.event(b"P-in").wait(5) and Hub.event(b"Q-in").wait(5)
        wd = watchdog_thread(loop)
        time.sleep(0.3)
        v0, cpu0 = task_stat(wd.native_id)
        time.sleep(1.5)
        v1, cpu1 = task_stat(wd.native_id)
    finally:
        Hub.event(b"P-go").set()
        Hub.event(b"Q-go").set()
        p.close()
        q.close()
    assert v1 - v0 <= 40, f"{v1 - v0} watchdog wake-ups in 1.5 s"
    assert cpu1 - cpu0 <= 0.15
    assert not loop.errors


def test_watchdog_never_misses_a_stuck_handler_under_preemption(rig):
    """Lost wake-up hunt (Dekker between _watch_asleep and _busy): rounds of
    noise traffic from several client threads (more threads than cores, tiny
    GIL switch interval), pauses around the watchdog's period so it is caught
    in every state (asleep, timed sleep, awake), then a stuck handler: the
    waiting client is always relieved in time."""
    Hub.reset(rig)
    period = 0.15
    loop, [addr] = rig(Hub, threads=3, takeover_after=period)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    stop = threading.Event()
    noise_err = []

    def noise():
        try:
            with connect(addr) as c:
                while not stop.is_set():
                    c.sendall(b"nz")
                    if recv_exact(c, 2, timeout=20) != b"nz":
                        noise_err.append("bad echo")
                        return
                    time.sleep(random.random() * period)
        except OSError as exc:
            noise_err.append(exc)

    def spin():
        end = time.monotonic() + 40
        while not stop.is_set() and time.monotonic() < end:
            pass

    helpers = [threading.Thread(target=noise, daemon=True) for _ in range(3)]
    helpers += [threading.Thread(target=spin, daemon=True) for _ in range(2)]
    for t in helpers:
        t.start()
    try:
        rng = random.Random(1234)
        worst = 0.0
        for rnd in range(25):
            p, z = connect(addr), connect(addr)
            try:
                name_p, name_z = b"P%d" % rnd, b"Z%d" % rnd
                hello(p, name_p)
                hello(z, name_z)
                time.sleep(rng.choice([0, period / 3, period, 1.5 * period, 2.5 * period]))
                p.sendall(b"block")
                assert Hub.event(name_p + b"-in").wait(5)
                t0 = time.monotonic()
                z.sendall(b"zz")
                got = recv_exact(z, 2, timeout=5)
                worst = max(worst, time.monotonic() - t0)
                assert got == b"zz"
            finally:
                Hub.event(name_p + b"-go").set()
                p.close()
                z.close()
    finally:
        stop.set()
        sys.setswitchinterval(old)
        for t in helpers:
            t.join(10)
    # P and Z may land on the same thread or not; either way Z waits at most
    # about one period plus scheduling slack
    assert worst < period + 1.5, f"a waiting client was relieved only after {worst:.2f}s"
    assert not noise_err, noise_err
    assert not loop.errors
