"""Output flow control of the stream interface (issue 20, finding 3: output
a handler wrote on its own was buffered without bound, 5 non-reading
clients took a worker from 23 MB to 561 MB, and a handler had no callback
saying the buffer drained). pause_writing/resume_writing at the high and
low water marks; the hard per-connection limit (stream_output_limit).
In-process: a real Loop on fdcore, real loopback sockets."""
from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from sockherd.worker.stream import HIGH_WATER, LOW_WATER
from test_stream_input_end import wait_for

pytestmark = pytest.mark.timeout(60)

CHUNK = 64 << 10


class Pusher:
    """Pushes CHUNK every 5 ms while not paused (a server-push protocol
    honouring pause_writing); records what flow control told it."""
    log: list = []
    peak = [0]

    def on_connect(self, conn):
        self.paused = False
        conn.set_timer(0.005)

    def on_data(self, conn, data):
        pass

    def pause_writing(self, conn):
        assert not self.paused
        self.paused = True
        self.log.append(("pause", conn.pending))

    def resume_writing(self, conn):
        assert self.paused
        self.paused = False
        self.log.append(("resume", conn.pending))

    def on_timeout(self, conn):
        if not self.paused:
            conn.write(b"x" * CHUNK)
            Pusher.peak[0] = max(Pusher.peak[0], conn.pending)
        conn.set_timer(0.005)


def test_pause_writing_and_resume_writing_follow_the_water_marks(serve_stream):
    """A client that does not read: pause_writing once the buffer passes
    HIGH_WATER, and a handler that honours it never buffers much more; once
    the client reads, resume_writing at LOW_WATER or below."""
    loop, addr = serve_stream(Pusher, threads=1)
    c = socket.create_connection(addr, timeout=10)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    wait_for(lambda: Pusher.log, 10, "pause_writing")
    time.sleep(0.5)                      # pushing on, paused: nothing more is buffered
    assert Pusher.log[0][0] == "pause" and Pusher.log[0][1] > HIGH_WATER
    assert Pusher.peak[0] <= HIGH_WATER + CHUNK, Pusher.peak[0]
    c.settimeout(10)
    got = 0
    deadline = time.monotonic() + 10
    while not any(what == "resume" for what, _ in Pusher.log):
        assert time.monotonic() < deadline, "resume_writing"
        got += len(c.recv(1 << 20))
    resumed = next(n for what, n in Pusher.log if what == "resume")
    assert resumed <= LOW_WATER
    assert Pusher.peak[0] <= HIGH_WATER + CHUNK, Pusher.peak[0]
    c.close()


class Flooder:
    """Ignores flow control: 1 MiB every 5 ms to a client that never reads."""
    closed = threading.Event()
    peak = [0]

    def on_connect(self, conn):
        conn.set_timer(0.005)

    def on_data(self, conn, data):
        pass

    def on_timeout(self, conn):
        conn.write(b"y" * (1 << 20))
        Flooder.peak[0] = max(Flooder.peak[0], conn.pending)
        conn.set_timer(0.005)

    def on_close(self, conn):
        Flooder.closed.set()


def test_output_past_the_hard_limit_closes_the_connection_with_a_log_line(serve_stream,
                                                                          caplog):
    """A handler ignoring pause_writing: its connection is closed once more
    than stream_output_limit waits, never buffered further."""
    limit = 4 << 20
    loop, addr = serve_stream(Flooder, threads=1, output_limit=limit)
    c = socket.create_connection(addr, timeout=10)
    with caplog.at_level(logging.WARNING, logger="sockherd.worker"):
        assert Flooder.closed.wait(10), "closed at the limit"
    assert "past stream_output_limit (4194304): closing it" in caplog.text
    assert Flooder.peak[0] <= limit
    # (only ours: on a shared machine a stray client may find our port)
    assert c.getsockname() not in [x.peer for x in list(loop.conns.values())]
    c.close()
