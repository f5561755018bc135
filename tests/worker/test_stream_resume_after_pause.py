"""A stream connection whose reading was paused, then resumed, hears its
client again (the TSan stress failure of tests/c/common.c:399, seed
3302437362: "kernel events 0x2018 vs polled r=1"). Pausing leaves the fd in
epoll for hang-ups alone (EPOLLRDHUP, no EPOLLIN: fd-t.h WATCH_HUP);
resume_reading calls want_recv then stop_hup before the thread's next
update pass, and that pass saw "recv wanted, recv polled, no hang-up watch"
and kept the registration as it was: without EPOLLIN. Whatever the client
sent after the resume was never reported, and the connection hung.
In-process: a real Loop on fdcore, real loopback sockets."""
from __future__ import annotations

import socket

import pytest

pytestmark = pytest.mark.timeout(60)


class PauseThenResume:
    """Pauses at connect; resumes on a timer and says so; echoes upper-cased."""

    def on_connect(self, conn):
        conn.pause_reading()
        conn.set_timer(0.3)

    def on_timeout(self, conn):
        conn.resume_reading()
        conn.write(b"resumed\n")

    def on_data(self, conn, data):
        conn.write(data.upper())


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        if not chunk:
            break
        got += chunk
    return got


@pytest.mark.parametrize("threads", [1, 2])
def test_input_sent_after_reading_resumes_is_delivered(serve_stream, threads):
    """The client waits for the resume, then sends: its bytes come back
    upper-cased (before the fix: recv timed out, nothing was polled for)."""
    loop, addr = serve_stream(PauseThenResume, threads=threads)
    clients = [socket.create_connection(addr, timeout=10) for _ in range(4)]
    for c in clients:
        assert recv_exactly(c, 8) == b"resumed\n"
    for i, c in enumerate(clients):
        msg = f"ping {i}".encode()
        c.sendall(msg)
        assert recv_exactly(c, len(msg)) == msg.upper(), f"client {i}: no echo after resume"
    for c in clients:
        c.close()
