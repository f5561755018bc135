"""A loop thread that ends anyway (a bug of ours: whatever the app raises is
contained, test_app_containment.py) is not left silent (issue 18 §1: loop
threads died with nobody noticing, their connections waiting forever and
`loop.errors` never read). The thread is killed on purpose here: a
BaseException posted to its own mailbox, which the loop runs as its own
code, outside any app boundary."""
from __future__ import annotations

import os
import select
import socket
import time

import pytest

from sockherd.worker import report

pytestmark = pytest.mark.timeout(60)


class Killed(BaseException):
    """Stands for a bug of ours that escapes a loop thread's loop."""


def which_thread(environ, start_response):
    body = b"%d" % environ["sockherd.loop"].local.th.tid
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [body]


def ask(sock: socket.socket) -> bytes:
    """One keep-alive request; the body (the serving thread's tid), or b""
    if the connection ended."""
    sock.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    got = b""
    while b"\r\n\r\n" not in got or not got.split(b"\r\n\r\n", 1)[1]:
        chunk = sock.recv(4096)
        if not chunk:
            return b""
        got += chunk
    return got.split(b"\r\n\r\n", 1)[1]


def readable(fd: int, timeout: float) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def kill(loop, pos: int) -> None:
    """Ends loop thread pos from inside its loop: its mailbox runs on it."""
    def die():
        raise Killed("killed on purpose")
    loop._mail[pos].append((die, ()))
    loop.table.wake(loop.loop_threads[pos].tid)


def test_an_ended_loop_thread_closes_its_connections_and_tells_the_worker(serve_wsgi):
    """Issue 18 §1: a loop thread that ended left its connections open with
    no timer (the client waited forever) and nobody read loop.errors. Now
    its connections close, failed_fd tells the main thread, and the report
    counts the live threads."""
    loop, addr = serve_wsgi(which_thread, threads=2)
    by_tid: dict[int, socket.socket] = {}
    spare = []
    deadline = time.monotonic() + 10
    while len(by_tid) < 2:                      # a kept-alive connection on each thread
        assert time.monotonic() < deadline, "connections on both threads"
        s = socket.create_connection(addr, timeout=5)
        tid = int(ask(s))
        if tid in by_tid:
            spare.append(s)
        else:
            by_tid[tid] = s
    try:
        victim = loop.loop_threads[0]
        assert report.answer(loop, "proc")["threads_alive"] == 2
        kill(loop, 0)
        assert readable(loop.failed_fd, 10), "the worker's main thread is told"
        assert loop.threads_alive == 1 and loop.ended == {0}
        assert report.answer(loop, "proc")["threads_alive"] == 1
        assert any(isinstance(e, Killed) for e in loop.errors)
        # the dead thread's connection ends (not left waiting forever) ...
        assert ask(by_tid[victim.tid]) == b""
        # ... the other thread's serves on
        other = loop.loop_threads[1].tid
        assert ask(by_tid[other]) == b"%d" % other
        os.eventfd_read(loop.failed_fd)
    finally:
        for s in [*by_tid.values(), *spare]:
            s.close()
        loop.errors.clear()                     # expected here: not the fixture's failure


@pytest.mark.parametrize("call", ["stop", "drain"])
def test_the_app_cannot_stop_or_drain_the_loop_from_a_loop_thread(serve_wsgi, call):
    """Found while trying to end a loop thread from an app: environ's
    "sockherd.loop" is the Loop, and its stop() called from the app set the
    stop flag before failing to join its own thread: every loop thread then
    left its loop normally, with no error, and the worker answered nothing
    more while its main thread and the master saw nothing wrong. Now both
    refuse a loop thread's call: the app's error, a 500."""
    def app(environ, start_response):
        if environ["PATH_INFO"] == "/bad":
            loop = environ["sockherd.loop"]
            loop.stop() if call == "stop" else loop.drain(0.1)
        return which_thread(environ, start_response)

    loop, addr = serve_wsgi(app, threads=1)
    with socket.create_connection(addr, timeout=5) as s:
        s.sendall(b"GET /bad HTTP/1.1\r\nHost: h\r\n\r\n")
        got = b""
        while chunk := s.recv(4096):
            got += chunk
        assert got.startswith(b"HTTP/1.1 500 "), got
    for _ in range(3):
        with socket.create_connection(addr, timeout=5) as s:
            assert ask(s) == b"%d" % loop.loop_threads[0].tid
    assert loop.threads_alive == 1 and not loop.draining


@pytest.mark.parametrize("when", ["posted after it ended", "in its mail as it ends"])
def test_a_connection_taken_at_drain_goes_to_a_live_loop_thread(serve_wsgi, when):
    """Found by a CI run: at drain the main thread takes what is queued on a
    deleted listener and posts each connection to a loop thread not in app
    code; a thread that had ended counted as idle, so the connection sat in
    a dead thread's mail, and the worker waited out the whole drain
    deadline (30 s) before refusing it. Now a connection goes to a live
    thread, and one in a thread's mail as it ends is passed on."""
    loop, addr = serve_wsgi(which_thread, threads=2)
    other = loop.loop_threads[1].tid
    with socket.create_server(("127.0.0.1", 0)) as lsock, \
            socket.create_connection(lsock.getsockname(), timeout=5) as client:
        fd, _ = lsock._accept()
        if when == "posted after it ended":
            kill(loop, 0)
            assert readable(loop.failed_fd, 10)
            loop._post_accepted(fd)
        else:
            def die():
                raise Killed("killed on purpose")
            with loop._posted_lock:          # both in thread 0's mail, die first
                loop._posted[fd] = time.monotonic()
                loop._mail[0].append((die, ()))
                loop._mail[0].append((loop._adopt_posted, (0, fd)))
            loop.table.wake(loop.loop_threads[0].tid)
            assert readable(loop.failed_fd, 10)
        try:
            assert ask(client) == b"%d" % other, "served by the live thread"
            assert not loop._posted
        finally:
            os.eventfd_read(loop.failed_fd)
            loop.errors.clear()
