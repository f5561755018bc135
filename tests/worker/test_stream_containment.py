"""Whatever a stream handler raises ends that connection only (issue 20,
finding 1: SystemExit or KeyboardInterrupt from a handler ended the loop
thread: 0/20 echoes after, the raising connection never closed; finding 6:
an exception in on_connect after the client sent data reached it as a
reset). In-process: a real Loop on fdcore, real loopback sockets."""
from __future__ import annotations

import logging
import os
import select
import socket
import time

import pytest

pytestmark = pytest.mark.timeout(60)


class Custom(BaseException):
    """Neither an Exception nor one of Python's own: still contained."""


RAISED = {"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt,
          "GeneratorExit": GeneratorExit, "Custom": Custom, "ValueError": ValueError}


class Raiser:
    """Echoes; b"raise NAME" writes b"partial" then raises NAME."""

    def on_data(self, conn, data):
        if data.startswith(b"raise "):
            conn.write(b"partial")
            raise RAISED[data[6:].decode()]("from the handler")
        conn.write(data)


def recv_all(sock: socket.socket, timeout: float = 10) -> bytes:
    """Everything until the server's FIN; a reset raises."""
    sock.settimeout(timeout)
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def echo(addr, data: bytes = b"ping") -> bytes:
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(data)
        c.settimeout(10)
        return c.recv(100)


@pytest.mark.parametrize("name", list(RAISED))
def test_what_a_handler_raises_closes_its_connection_after_its_output(serve_stream, caplog,
                                                                      name):
    """Finding 1: the raising connection gets what was written, then a FIN;
    the loop thread serves on (--threads 1: its only one); logged once."""
    loop, addr = serve_stream(Raiser, threads=1)
    with caplog.at_level(logging.ERROR, logger="sockherd.worker"):
        with socket.create_connection(addr, timeout=10) as c:
            c.sendall(b"raise " + name.encode())
            assert recv_all(c) == b"partial"
        for i in range(20):
            assert echo(addr, b"ping%d" % i) == b"ping%d" % i
    assert loop.threads_alive == 1 and not loop.ended and not loop.errors
    lines = [r for r in caplog.records if "Raiser.on_data failed" in r.getMessage()]
    assert len(lines) == 1, caplog.text
    assert f"({name})" in lines[0].getMessage()


class LateRefusal:
    """on_connect refuses once the client's first bytes are in."""

    def on_connect(self, conn):
        deadline = time.monotonic() + 5
        while not select.select([conn.fd], [], [], 0.05)[0]:
            assert time.monotonic() < deadline
        conn.write(b"no")
        raise SystemExit("refused")

    def on_data(self, conn, data):
        conn.write(data)


def test_an_on_connect_that_raises_after_the_client_sent_closes_with_a_fin(serve_stream):
    """Finding 6: the client had sent data nobody read; closing over it was
    a reset. Now the input is read first: the client reads b"no", then EOF."""
    loop, addr = serve_stream(LateRefusal, threads=1)
    for _ in range(5):
        with socket.create_connection(addr, timeout=10) as c:
            c.sendall(b"hello" * 1000)
            assert recv_all(c) == b"no"          # a reset would raise here
    assert loop.threads_alive == 1 and not loop.errors


class Killed(BaseException):
    """Stands for a bug of ours that escapes a loop thread's loop."""


def test_a_stream_loop_thread_that_ends_anyway_closes_its_connections_and_tells(serve_stream):
    """The issue-18 safety net holds for stream: a loop thread killed from
    its own mailbox (outside any handler) closes its connections (the
    client sees an end, not a hang) and wakes the main thread (failed_fd),
    which drains and exits to be replaced (bootstrap.py)."""
    loop, addr = serve_stream(Raiser, threads=1)
    c = socket.create_connection(addr, timeout=10)
    c.sendall(b"x")
    assert c.recv(10) == b"x"

    def die():
        raise Killed("on purpose")
    loop._mail[0].append((die, ()))
    loop.table.wake(loop.loop_threads[0].tid)
    assert select.select([loop.failed_fd], [], [], 10)[0], "the main thread is told"
    assert loop.threads_alive == 0
    assert recv_all(c) == b""
    c.close()
    assert [type(e) for e in loop.errors] == [Killed]
    loop.errors.clear()                         # the fixture checks for unexpected ones
    os.eventfd_read(loop.failed_fd)
