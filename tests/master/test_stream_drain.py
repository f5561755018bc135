"""Drains a stream protocol can take part in (issue 20, finding 5: writes
and timers were not activity, so 10 connections receiving a tick every
0.2 s were closed 0.01 s after TERM; handlers got no notice that a drain
began, so busy sessions were cut at hard_stop_after, each losing its last
message; and a worker that hit the drain deadline was logged "drained").
A real master and worker on loopback: a push protocol across TERM, an
echo protocol across a reload (HUP)."""
from __future__ import annotations

import re
import signal
import socket
import threading
import time

import pytest

from test_run import children, gone, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

APPS = """
class Ticker:
    '''A server-push protocol: a tick every 0.2 s, whatever the client says.'''
    def on_connect(self, conn):
        self.n = 0
        conn.set_timer(0.2)
    def on_data(self, conn, data):
        pass
    def on_timeout(self, conn):
        self.n += 1
        conn.write(b"tick %d\\n" % self.n)
        conn.set_timer(0.2)

class PoliteTicker(Ticker):
    '''The same, saying goodbye when the worker drains.'''
    def on_drain(self, conn):
        conn.write(b"bye\\n")
        conn.close()

class LineEcho:
    '''Echoes lines; at a drain, answers "bye" (in place of the next
    answer if a line is half in) and closes.'''
    def on_connect(self, conn):
        self.buf = b""
    def on_data(self, conn, data):
        self.buf += data
        while b"\\n" in self.buf:
            line, self.buf = self.buf.split(b"\\n", 1)
            conn.write(line + b"\\n")
    def on_drain(self, conn):
        conn.write(b"bye\\n")
        conn.close()
"""


def read_lines(sock: socket.socket, into: list, done: threading.Event) -> None:
    """Collects (time, line) until the server's FIN; a reset is recorded."""
    buf = b""
    try:
        while chunk := sock.recv(4096):
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                into.append((time.monotonic(), line))
    except OSError as exc:
        into.append((time.monotonic(), repr(exc).encode()))
    finally:
        done.set()


def tick_clients(m, n: int):
    socks, lines, ends = [], [], []
    for _ in range(n):
        s = m.connect()
        s.settimeout(60)
        got, end = [], threading.Event()
        threading.Thread(target=read_lines, args=(s, got, end), daemon=True).start()
        socks.append(s)
        lines.append(got)
        ends.append(end)
    for got in lines:
        wait_for(lambda: len(got) >= 2, 10, "ticks")
    return socks, lines, ends


def test_a_push_protocol_is_served_until_the_drain_deadline_which_is_reported(master,
                                                                               tmp_path):
    """Ticks are activity: TERM with idle_grace 0.3 does not cut 10 ticking
    connections; they are served up to hard_stop_after (3 s), then cut; the
    worker logs how many it cut and the master says it hit the deadline."""
    (tmp_path / "protos.py").write_text(APPS)
    m = master("protos:Ticker", "--interface", "stream", "-w", "1", "--idle-grace", "0.3",
               "--hard-stop-after", "3", ready=1)
    pid = children(m.proc.pid)[0]
    socks, lines, ends = tick_clients(m, 10)
    term = time.monotonic()
    m.proc.send_signal(signal.SIGTERM)
    for end in ends:
        assert end.wait(30), "cut at the deadline"
    for got in lines:
        after = [t - term for t, line in got if line.startswith(b"tick")]
        assert after and max(after) > 2.0, f"ticks stopped {max(after):.2f} s after TERM"
        assert not any(line.startswith(b"ConnectionReset") for _, line in got)
    m.wait_log(rf"\[worker {pid}\] WARNING drain deadline reached with 10 connection\(s\) "
               r"still open")
    m.wait_log(rf"exited with status 75 \(hit the drain deadline\), pid {pid}")
    assert m.proc.wait(timeout=30) == 0
    for s in socks:
        s.close()


def test_a_push_protocol_that_takes_part_says_goodbye_and_the_drain_ends_early(master,
                                                                               tmp_path):
    """on_drain: each connection gets its goodbye then a FIN well before
    hard_stop_after, and the worker exits drained."""
    (tmp_path / "protos.py").write_text(APPS)
    m = master("protos:PoliteTicker", "--interface", "stream", "-w", "1", "--idle-grace",
               "0.3", "--hard-stop-after", "20", ready=1)
    pid = children(m.proc.pid)[0]
    socks, lines, ends = tick_clients(m, 10)
    term = time.monotonic()
    m.proc.send_signal(signal.SIGTERM)
    for end in ends:
        assert end.wait(10)
    assert time.monotonic() - term < 5
    for got in lines:
        assert got[-1][1] == b"bye", got[-3:]
    m.wait_log(rf"exited with status 0 \(drained\), pid {pid}")
    assert m.proc.wait(timeout=30) == 0
    for s in socks:
        s.close()


def test_an_echo_protocol_across_a_reload_loses_no_answered_message(master, tmp_path):
    """Busy echo sessions across HUP: each gets every answer up to its
    goodbye (at most the one line in flight is answered by "bye" instead),
    closes with a FIN, and the old worker exits drained long before
    hard_stop_after; new sessions are served by the new generation."""
    (tmp_path / "protos.py").write_text(APPS)
    m = master("protos:LineEcho", "--interface", "stream", "-w", "1", "--idle-grace", "0.3",
               "--hard-stop-after", "20", ready=1)
    old = children(m.proc.pid)[0]
    results, progress = [], []

    def session():
        s = m.connect()
        s.settimeout(30)
        sent, answers, buf = [], [], b""
        progress.append(answers)
        try:
            while True:
                msg = b"message %d" % len(sent)
                s.sendall(msg + b"\n")
                sent.append(msg)
                while b"\n" not in buf:
                    chunk = s.recv(4096)
                    if not chunk:
                        results.append((sent, answers, "eof before an answer"))
                        return
                    buf += chunk
                line, buf = buf.split(b"\n", 1)
                answers.append(line)
                if line == b"bye":
                    rest = s.recv(4096)
                    results.append((sent, answers, "fin" if rest == b"" else rest))
                    return
        except OSError as exc:
            results.append((sent, answers, repr(exc)))
        finally:
            s.close()

    threads = [threading.Thread(target=session) for _ in range(4)]
    for t in threads:
        t.start()
    wait_for(lambda: len(progress) == 4 and all(len(a) > 10 for a in progress), 20,
             "4 sessions under way")
    hup = time.monotonic()
    m.proc.send_signal(signal.SIGHUP)
    m.wait_log(r"reload: generation \d+ serving")
    for t in threads:
        t.join(30)
    m.wait_log(rf"exited with status 0 \(drained\), pid {old}")
    assert time.monotonic() - hup < 10
    assert len(results) == 4
    for sent, answers, how in results:
        assert how == "fin", (how, answers[-3:])
        assert answers[-1] == b"bye"
        assert answers[:-1] == sent[:len(answers) - 1]
        assert len(sent) - (len(answers) - 1) <= 1
        assert len(answers) > 10
    with m.connect() as c:
        c.sendall(b"after\n")
        assert c.recv(100) == b"after\n"
