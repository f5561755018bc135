"""A stream handler cannot end a loop thread through a timer's length or
its own constructor (issue 20's review). Found on a real `sockherd run --threads 1`:

- `conn.set_timer(float("nan"))`, `float("inf")`, `1e300` or a 30-day timer
  (2.6e9 ms: more than poll's 32-bit timeout) ended the loop thread in its
  poll-timeout arithmetic (ValueError / OverflowError, outside any handler):
  "loop thread 0 ended", the worker replaced, every connection on it cut;
- a handler class whose __init__ raises (on every second connection here)
  ended the loop thread in _register, its client reset.

A real master and worker on loopback; after each, the same worker (same
pid, no "loop thread ... ended") still echoes."""
from __future__ import annotations

import socket

import pytest

from test_run import children, master  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

APPS = """
class Timed:
    '''b"timer X" sets a timer of float(X) seconds and answers ok; else echoes.'''
    def on_data(self, conn, data):
        if data.startswith(b"timer "):
            conn.set_timer(float(data[6:]))
            conn.write(b"ok")
        else:
            conn.write(data)
    def on_timeout(self, conn):
        conn.write(b"timeout")

class Picky:
    '''Refuses to be made for every second connection.'''
    made = 0
    def __init__(self):
        Picky.made += 1
        if Picky.made % 2 == 0:
            raise SystemExit("not this one")
    def on_data(self, conn, data):
        conn.write(data)
"""


def recv_all(sock: socket.socket) -> bytes:
    """Everything until the server's FIN (a reset raises)."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def echo(m, data: bytes = b"ping") -> bytes:
    with m.connect() as c:
        c.sendall(data)
        return c.recv(100)


def serve(master, tmp_path, app: str):
    (tmp_path / "protos.py").write_text(APPS)
    m = master(f"protos:{app}", "--interface", "stream", "-w", "1", "--threads", "1", ready=1)
    return m, children(m.proc.pid)[0]


def same_worker_serves(m, pid: int) -> None:
    for i in range(10):
        assert echo(m, b"ping%d" % i) == b"ping%d" % i
    assert children(m.proc.pid) == [pid], m.text()
    assert "loop thread" not in m.text(), m.text()


@pytest.mark.parametrize("seconds", ["nan", "inf", "-inf"])
def test_a_timer_of_no_length_ends_its_connection_only(master, tmp_path, seconds):
    """NaN and infinite lengths are refused (ValueError, raised in the
    handler: contained, that connection closed with a FIN); the loop thread
    serves on."""
    m, pid = serve(master, tmp_path, "Timed")
    with m.connect() as c:
        c.sendall(b"timer " + seconds.encode())
        assert recv_all(c) == b""
    m.wait_log(r"Timed\.on_data failed \(ValueError\)")
    same_worker_serves(m, pid)


def test_a_timer_longer_than_a_poll_can_wait_is_kept(master, tmp_path):
    """30 days, and 1e300 s (as good as never): accepted, not fired, the
    connection stays open and served; a short timer set later on another
    connection still fires on time."""
    m, pid = serve(master, tmp_path, "Timed")
    long = []
    for seconds in (b"2592000", b"1e300"):
        c = m.connect()
        long.append(c)
        c.sendall(b"timer " + seconds)
        assert c.recv(10) == b"ok"
    with m.connect() as c:
        c.sendall(b"timer 0.2")
        assert c.recv(10) == b"ok"
        assert c.recv(10) == b"timeout"
    for c in long:
        c.sendall(b"still")
        assert c.recv(10) == b"still"
        c.close()
    same_worker_serves(m, pid)


def test_a_handler_that_cannot_be_made_closes_its_connection_only(master, tmp_path):
    """Every second connection's handler raises SystemExit in __init__:
    that client sees a close (a FIN, not a reset: its input read first),
    the error is logged, the others are served by the same loop thread."""
    m, pid = serve(master, tmp_path, "Picky")
    answers = []
    for i in range(8):
        with m.connect() as c:
            c.sendall(b"hello%d" % i)
            answers.append(recv_all(c) if i % 2 else c.recv(100))
    assert answers[0::2] == [b"hello%d" % i for i in range(0, 8, 2)]
    assert answers[1::2] == [b""] * 4
    m.wait_log(r"stream handler Picky\(\) failed \(SystemExit\)", count=4)
    assert children(m.proc.pid) == [pid], m.text()
    assert "loop thread" not in m.text(), m.text()
