"""The spill queue of per-request dispatch (worker/native/engine/dispatch.c): the
rest of a loop thread's batch that ran past SPILL_AFTER (2 ms: the app
blocks) is queued on the engine for the group. On an in-process worker of
one group of two loop threads, real sockets: both threads are first held
inside the app, so the requests sent then reach every poller of the group
(the kernel offers an exclusive report to each poller with no sleeper) and
the first thread let go takes them in one batch.

Review finding (issue 21 review, dispatch_spill / conn_close_now): a
queued entry held its connection until a loop thread ran it; one still
queued when the loop stopped (each run of the queue ends once it ran past
SPILL_AFTER) was never run, and as a connection references its
engine (and the engine its loop and app) while the engine's queue
references the connection through an object the garbage collector does not
track, the whole engine was never freed."""
from __future__ import annotations

import gc
import socket
import threading
import time
import weakref

import pytest

from sockherd.fdcore import Table
from sockherd.worker.loop import Loop
from sockherd.worker.wsgi import make_handler
from test_http_parser_and_wsgi_framing import wait_for

pytestmark = pytest.mark.timeout(60)


class Blocking:
    """An app whose request ?NAME waits for events[NAME] (entered[NAME]
    set first) and then another 10 ms, so the batch it is in runs past
    SPILL_AFTER; any other query answers at once. Its body: the query and
    the thread."""

    def __init__(self, *names: str):
        self.events = {n: threading.Event() for n in names}
        self.entered = {n: threading.Event() for n in names}
        self.thread: dict[str, str] = {}
        self.order: list[str] = []             # the queries, as the app was called

    def __call__(self, environ, start_response):
        q = environ["QUERY_STRING"]
        self.thread[q] = threading.current_thread().name
        self.order.append(q)
        if q in self.events:
            self.entered[q].set()
            self.events[q].wait(20)
            time.sleep(0.01)
        body = f"{q} {self.thread[q]}".encode()
        start_response("200 OK", [("Content-Length", str(len(body)))])
        return [body]

    def release(self) -> None:
        for e in self.events.values():
            e.set()


def ask(s: socket.socket, q: str) -> None:
    s.sendall(b"GET /?%s HTTP/1.1\r\nHost: h\r\n\r\n" % q.encode())


def spill_setup(loop, addr, app: Blocking, socks: dict,
                then: tuple[tuple[str, str], ...] = (("c1", "c1"), ("c2", "c2"))) -> None:
    """On a two-thread loop serving app: both threads inside the app
    (requests ?a and ?b), then `then` sent, (connection, query) in order
    (by default ?c1 and ?c2 on two more connections): the first thread let
    go (a's) takes them in one batch and, ?c1 blocking, spills the rest.
    The connections go into socks, by name."""
    assert loop.engine.dispatch
    names = ["a", "b", *dict.fromkeys(n for n, _ in then if n not in ("a", "b"))]
    socks.update({n: socket.create_connection(addr, timeout=10) for n in names})
    assert wait_for(lambda: loop.engine.count == len(names)), "the connections in the engine"
    ask(socks["a"], "a")
    assert wait_for(app.entered["a"].is_set), "a inside the app"
    ask(socks["b"], "b")
    assert wait_for(app.entered["b"].is_set), "b inside the app"
    assert app.thread["a"] != app.thread["b"]
    # both threads busy: each report lands in both pollers' ready lists
    for name, q in then:
        ask(socks[name], q)
    app.events["a"].set()
    assert wait_for(app.entered["c1"].is_set), "c1 inside the app"
    assert app.thread["c1"] == app.thread["a"]


@pytest.fixture
def spilled(serve_wsgi):
    """start(then=...) -> (loop, app, sockets): spill_setup on a loop of
    serve_wsgi's, the app let go and the sockets closed at the end."""
    made = []

    def start(**kw):
        app = Blocking("a", "b", "c1")
        loop, addr = serve_wsgi(app, threads=2)
        socks: dict = {}
        made.append((app, socks))
        spill_setup(loop, addr, app, socks, **kw)
        return loop, app, socks

    yield start
    for app, socks in made:
        app.release()
        for s in socks.values():
            s.close()


def test_a_spilled_report_is_served(spilled):
    """The spilled ?c2 is answered while ?b still blocks its thread (by
    the thread that spilled it, at its next turn: the only one free)."""
    loop, app, socks = spilled()
    app.events["c1"].set()
    socks["c2"].settimeout(5)
    got = socks["c2"].recv(1000)
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(f"c2 {app.thread['a']}".encode()), got
    assert not app.events["b"].is_set()


def _stopped_with_a_spilled_entry():
    app = Blocking("a", "b", "c1", "c2", "c3")
    table = Table(2, 1)
    loop = Loop(table, make_handler(app, {"threads": 2}))
    srv = socket.create_server(("127.0.0.1", 0), backlog=64)
    addr = srv.getsockname()
    loop.add_listener(srv)
    loop.start()
    socks: dict = {}
    try:
        spill_setup(loop, addr, app, socks,
                    then=(("c1", "c1"), ("c2", "c2"), ("c3", "c3"), ("c4", "c4")))
    except BaseException:
        app.release()
        loop.stop()
        table.close()
        raise
    stopper = threading.Thread(target=loop.stop)
    try:
        # the loop stops while ?c1 runs: its thread spills the rest and
        # runs ?c2 from the queue; the other one, let go, runs ?c3 from it;
        # each blocks past SPILL_AFTER, so each run stops there, ?c4 stays
        # queued, and both threads see the stop and end
        stopper.start()
        assert wait_for(loop._stop.is_set), "the stop"
        app.events["c1"].set()
        assert wait_for(app.entered["c2"].is_set), "c2 run from the queue"
        app.events["b"].set()
        assert wait_for(app.entered["c3"].is_set), "c3 run from the queue"
    finally:
        app.release()
        stopper.join(20)
        for s in socks.values():
            s.close()
    assert not stopper.is_alive()
    assert "c4" not in app.thread, "c4 was served: nothing was left queued"
    table.close()
    assert not loop.errors, loop.errors
    assert loop.engine.count == 0
    return weakref.ref(loop)


def test_an_entry_queued_at_the_stop_does_not_keep_the_engine():
    """Stopped with ?c4 still queued: once the loop is dropped, its engine,
    loop and app are freed (before the fix the queue's reference to the
    closed connection kept them all)."""
    ref = _stopped_with_a_spilled_entry()
    gc.collect()
    assert ref() is None, "the stopped loop is still alive"


def test_a_report_spilled_while_its_connection_is_inside_keeps_the_order(spilled):
    """?b2 is pipelined on b while b's thread is inside the app for ?b;
    its report, in the other thread's batch behind the blocking ?c1, is
    spilled and run from the queue while b is still inside: it is only
    recorded there, and b's thread answers ?b2 after ?b, on the wire in
    that order."""
    loop, app, socks = spilled(then=(("c1", "c1"), ("b", "b2")))
    spiller_th = next(th for th in loop.loop_threads
                      if app.thread["a"] == f"sockherd-{th.tid}")
    spiller = spiller_th.tid
    app.events["c1"].set()
    socks["c1"].settimeout(5)
    assert socks["c1"].recv(1000).endswith(f"c1 {app.thread['a']}".encode())
    # a whole turn of the spiller begun after the one that answered
    # ?c1 and spilled (the queue runs first thing in a turn); woken,
    # as it sleeps once the queue is run
    # (counted by its polls: a turn of a thread with siblings polls once
    # or twice, so four more polls are two more turns at least)
    seen = spiller_th.counters()["loops"]

    def turned() -> bool:
        loop.table.wake(spiller)
        return spiller_th.counters()["loops"] >= seen + 4

    assert wait_for(turned), "a whole turn of the spiller"
    assert not app.events["b"].is_set()
    app.events["b"].set()
    socks["b"].settimeout(5)
    out = b""
    while out.count(b"HTTP/1.1 200") < 2 or not out.endswith(app.thread["b"].encode()):
        chunk = socks["b"].recv(65536)
        assert chunk, out
        out += chunk
    bodies = [part.split(b"\r\n\r\n", 1)[1] for part in out.split(b"HTTP/1.1 ")[1:]]
    assert bodies == [f"b {app.thread['b']}".encode(), f"b2 {app.thread['b']}".encode()]


def answers(s: socket.socket, n: int) -> list[bytes]:
    """The first words of the bodies of the next n responses on s (each
    with a Content-Length)."""
    s.settimeout(5)
    buf, bodies = b"", []
    while len(bodies) < n:
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            assert chunk, (bodies, buf)
            buf += chunk
        head, _, buf = buf.partition(b"\r\n\r\n")
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        while len(buf) < length:
            chunk = s.recv(65536)
            assert chunk, (bodies, buf)
            buf += chunk
        bodies.append(buf[:length].split()[0])
        buf = buf[length:]
    assert not buf, buf
    return bodies


def test_copies_merged_into_queued_entries_are_served_once_in_their_places(serve_wsgi):
    """Merging in O(1) (inkept, the spill queue): the first thread let go
    takes ?c1 .. ?c4 in one batch; ?c1 blocks, so ?c2 .. ?c4 are queued,
    and ?c2, taken from the queue, blocks too: ?c3 and ?c4 wait there,
    ?c3b is pipelined on c3 meanwhile. The other thread, let go, finds
    the copies of c1 .. c4 its poller kept: the group has queued work, so
    they join the queue, c3's and c4's merged into their entries. The
    queue runs oldest first: ?c3 and ?c3b (one read), then ?c4, each
    answered once, all while ?c2 still blocks."""
    app = Blocking("a", "b", "c1", "c2")
    loop, addr = serve_wsgi(app, threads=2)
    socks: dict = {}
    try:
        spill_setup(loop, addr, app, socks,
                    then=(("c1", "c1"), ("c2", "c2"), ("c3", "c3"), ("c4", "c4")))
        app.events["c1"].set()
        assert wait_for(app.entered["c2"].is_set), "c2 run from the queue"
        assert app.thread["c2"] == app.thread["a"]
        ask(socks["c3"], "c3b")
        app.events["b"].set()
        assert answers(socks["c3"], 2) == [b"c3", b"c3b"]
        assert answers(socks["c4"], 1) == [b"c4"]
        assert not app.events["c2"].is_set()
        app.events["c2"].set()
        assert answers(socks["c2"], 1) == [b"c2"]
        assert answers(socks["c1"], 1) == [b"c1"]
        assert app.order == ["a", "b", "c1", "c2", "c3", "c3b", "c4"], app.order
    finally:
        app.release()
        for s in socks.values():
            s.close()
