"""sd_notify(3)'s sending half (ipc.systemd.notify): one datagram to the
NOTIFY_SOCKET address, a path or an '@' abstract name; errors raised, never
swallowed, and a full receive queue never blocks past the timeout."""
from __future__ import annotations

import os
import socket
import time
import uuid

import pytest

from sockherd.ipc import systemd

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def receiver(tmp_path):
    """receiver(abstract) -> (NOTIFY_SOCKET value, bound datagram socket)."""
    socks = []

    def make(abstract: bool = False):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        socks.append(sock)
        if abstract:
            name = f"sockherd-test-{uuid.uuid4().hex}"
            sock.bind("\0" + name)
            address = "@" + name
        else:
            address = str(tmp_path / "notify.sock")
            sock.bind(address)
        sock.settimeout(5)
        return address, sock

    yield make
    for sock in socks:
        sock.close()


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_one_datagram_to_the_address(receiver, abstract):
    address, sock = receiver(abstract)
    assert systemd.notify("READY=1\nSTATUS=fine\n", address) is True
    assert sock.recv(4096) == b"READY=1\nSTATUS=fine\n"


def test_the_environment_names_the_socket_and_stays(receiver, monkeypatch):
    address, sock = receiver(True)
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    assert systemd.notify("STOPPING=1\n") is True
    assert sock.recv(4096) == b"STOPPING=1\n"
    assert os.environ["NOTIFY_SOCKET"] == address         # never unset: re-exec needs it


def test_no_notify_socket_is_nothing_to_do(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert systemd.notify("READY=1\n") is False
    assert systemd.notify("READY=1\n", "") is False


@pytest.mark.parametrize("address, why", [
    ("relative.sock", "neither an absolute path nor an '@' abstract name"),
    ("@", "neither an absolute path"),
    ("vsock:2:1234", "neither an absolute path"),
    ("/" + "x" * 120, "not a usable socket path"),
    ("@" + "x" * 120, "abstract name longer than 107 bytes"),
])
def test_unusable_addresses_are_refused(address, why):
    with pytest.raises(ValueError, match=why):
        systemd.notify("READY=1\n", address)


def test_nobody_there_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        systemd.notify("READY=1\n", str(tmp_path / "nobody.sock"))
    with pytest.raises(ConnectionRefusedError):
        systemd.notify("READY=1\n", f"@sockherd-test-{uuid.uuid4().hex}")


def test_a_full_queue_fails_after_the_timeout_instead_of_blocking(receiver):
    """systemd not reading (its queue full): each send gives up after its
    timeout with an error; nothing blocks the master's loop for longer."""
    address, sock = receiver(False)
    for _ in range(10_000):                  # net.unix.max_dgram_qlen: 10 by default
        start = time.monotonic()
        try:
            systemd.notify("STATUS=x\n", address, timeout=0.2)
        except OSError as exc:
            took = time.monotonic() - start
            assert isinstance(exc, TimeoutError), exc
            assert 0.15 <= took < 5.0, took
            break
    else:
        pytest.fail("10000 datagrams queued and none refused")
    assert sock.recv(4096) == b"STATUS=x\n"          # read one: there is room again
    assert systemd.notify("STATUS=y\n", address, timeout=0.2) is True
