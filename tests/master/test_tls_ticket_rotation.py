"""Session-ticket keys are rotated (issue 35 §28), on a real master with
two workers.

Finding: the ticket keys were made once and kept for the master's life,
so a ticket (and on TLS 1.3 the chain of tickets each resumption gives)
stayed good as long as the master ran, and whoever obtained the keys
could decrypt every session ever resumed with them (no forward secrecy).

Now, every `ssl_ticket_key_rotation` seconds, the master's secret is
ratcheted one way and new keys derived (worker/native/conn/conn_tls_tickets.c):
the current key issues, the previous one still decrypts. So a ticket
resumes across one rotation (on either worker: both count the epochs on
the host's monotonic clock, as the test does here to place its
connections), and after two it is a full handshake, still served."""
from __future__ import annotations

import socket
import ssl
import time

import pytest

from test_run import master, wait_for  # noqa: F401 (fixture)
from tls_support import make_pki, read_response

pytestmark = pytest.mark.timeout(120)

R = 5                                   # the rotation (the setting's least)

APP = """
def app(environ, start_response):
    body = environ["SSL_SESSION_RESUMED"].encode()
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]
"""

VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


def epoch() -> int:
    return int(time.monotonic()) // R


def into_epoch(e: int, margin: float = 0.7) -> None:
    """Sleeps until `margin` seconds into epoch e."""
    time.sleep(max(0.0, e * R + margin - time.monotonic()))


def get(port: int, ctx: ssl.SSLContext, session=None):
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    with ctx.wrap_socket(raw, server_hostname="127.0.0.1", session=session) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        _, body = read_response(s)
        return body.decode(), s.session_reused, s.session


@pytest.fixture
def served(master, tmp_path):
    (tmp_path / "rotapp.py").write_text(APP)
    pki = make_pki(tmp_path / "pki")
    m = master("rotapp:app", "-w", "2", "--certfile", str(pki.cert), "--keyfile", str(pki.key),
               "--ssl-ticket-key-rotation", str(R))
    return m, pki


def ticket(m, ctx):
    """A session taken early in an epoch: (its epoch, the session)."""
    into_epoch(epoch() + 1)
    e = epoch()
    body, reused, session = get(m.port, ctx)
    assert body == "Initial" and not reused and epoch() == e
    return e, session


@pytest.mark.parametrize("version", VERSIONS)
def test_a_ticket_resumes_across_one_rotation_on_every_worker(served, version):
    m, pki = served
    ctx = pki.context(maximum_version=VERSIONS[version])
    e, session = ticket(m, ctx)
    into_epoch(e + 1)
    # both workers (the kernel spreads the connections) resume it
    answers = [get(m.port, ctx, session)[:2] for _ in range(8)]
    assert epoch() == e + 1, "the test's connections ran into the next rotation"
    assert answers == [("Resumed", True)] * 8, answers


@pytest.mark.parametrize("version", VERSIONS)
def test_a_ticket_two_rotations_old_is_a_full_handshake(served, version):
    m, pki = served
    ctx = pki.context(maximum_version=VERSIONS[version])
    e, session = ticket(m, ctx)
    into_epoch(e + 2)
    answers = [get(m.port, ctx, session)[:2] for _ in range(4)]
    assert answers == [("Initial", False)] * 4, answers
