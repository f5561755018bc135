"""A stream handler that closes while its peer is still sending (a
goodbye, a refusal, a drain's "bye"): the peer reads the handler's last
bytes and then a FIN, never a reset (a local CI run of stop 42: test_stream_drain's
echo sessions got "bye" and then ECONNRESET once in four runs). The close
read the unread input and then closed the fd: a byte that came between
the two made close() a reset on the wire (RFC 1122 4.2.2.13), and a
reset with no FIN before it loses what the peer had not read yet. The
FIN must go first (shutdown), so a reset after it, if any, finds the
peer's input already ended.

A real master and worker on loopback; each client floods the server with
bytes in a thread of its own while it reads."""
from __future__ import annotations

import socket
import threading

import pytest

from test_run import master  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

APPS = """
class Goodbye:
    '''Answers the first bytes with "bye" and closes.'''
    def on_data(self, conn, data):
        if not conn.closed:
            conn.write(b"bye\\n")
            conn.close()
"""


def flood(sock: socket.socket, stop: threading.Event) -> None:
    chunk = b"x" * (256 << 10)
    try:
        while not stop.is_set():
            sock.send(chunk)
    except OSError:
        pass                              # the server closed: expected


def session(port: int) -> str:
    """How the server's side ended for one flooding client: "fin" after
    b"bye\\n", else what was read or raised."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    stop = threading.Event()
    sender = threading.Thread(target=flood, args=(s, stop), daemon=True)
    sender.start()
    got = b""
    try:
        while chunk := s.recv(4096):
            got += chunk
        return "fin" if got == b"bye\n" else f"fin after {got!r}"
    except OSError as exc:
        return f"{exc!r} after {got!r}"
    finally:
        stop.set()
        sender.join(10)
        s.close()


def test_a_close_over_a_peer_still_sending_is_a_fin(master, tmp_path):
    (tmp_path / "protos.py").write_text(APPS)
    m = master("protos:Goodbye", "--interface", "stream", "-w", "1", "--threads", "2", ready=1)
    ends: list[str] = []

    def client():
        for _ in range(40):
            ends.append(session(m.port))

    clients = [threading.Thread(target=client) for _ in range(4)]
    for t in clients:
        t.start()
    for t in clients:
        t.join(60)
    assert len(ends) == 160
    assert ends == ["fin"] * len(ends), [e for e in ends if e != "fin"][:5]
