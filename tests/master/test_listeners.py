"""Binding and adopting listeners: real sockets on loopback and in temporary
directories."""
from __future__ import annotations

import os
import socket
import stat
import types

import pytest

from sockherd.master.addresses import AddressError
from sockherd.master.listeners import BindError, bind, bind_all

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def listeners():
    made = []
    yield made
    for lst in made:
        lst.close()


def test_tcp_ephemeral_port(listeners):
    lst = bind("127.0.0.1:0", backlog=16)
    listeners.append(lst)
    s = lst.sock
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 0
    assert not os.get_inheritable(s.fileno()) and not s.getblocking()
    port = s.getsockname()[1]
    assert lst.descriptor.address == f"127.0.0.1:{port}" and lst.descriptor.family == "inet"
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass


def test_ipv6_is_v6_only(listeners):
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        lst = bind("[::1]:0")
    except BindError as exc:
        pytest.skip(f"IPv6 loopback unavailable: {exc}")
    listeners.append(lst)
    assert lst.sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1
    assert lst.descriptor.address.startswith("[::1]:")


def test_port_in_use_is_a_clear_error(listeners):
    first = bind("127.0.0.1:0")
    listeners.append(first)
    port = first.sock.getsockname()[1]
    with pytest.raises(BindError, match=rf"bind 127.0.0.1:{port}: cannot listen: Address already in use"):
        bind(f"127.0.0.1:{port}")


def test_unix_mode_and_stale_file_replaced(tmp_path, listeners):
    path = tmp_path / "app.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(path))
    dead.close()                                   # a crashed server's leftover
    lst = bind(f"unix:{path}", unix_mode="0600")
    listeners.append(lst)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert lst.descriptor.address == str(path)
    with socket.socket(socket.AF_UNIX) as c:
        c.connect(str(path))
    lst.close()
    listeners.remove(lst)
    assert not path.exists()


def test_unix_live_server_or_non_socket_is_refused(tmp_path, listeners):
    path = tmp_path / "live.sock"
    live = socket.socket(socket.AF_UNIX)
    live.bind(str(path))
    live.listen()
    try:
        with pytest.raises(BindError, match="another server is listening on it"):
            bind(f"unix:{path}")
        assert path.exists()                       # never removed from under it
    finally:
        live.close()
    plain = tmp_path / "plain"
    plain.write_text("data")
    with pytest.raises(BindError, match="exists and is not a socket"):
        bind(f"unix:{plain}")
    assert plain.read_text() == "data"


def test_close_leaves_a_successors_file_alone(tmp_path, listeners):
    path = tmp_path / "s.sock"
    old = bind(f"unix:{path}")
    os.unlink(path)                                # a successor took the path over
    new = bind(f"unix:{path}")
    listeners.append(new)
    old.close()
    assert path.exists()


def test_inherited_fd(listeners):
    srv = socket.create_server(("127.0.0.1", 0))
    fd = os.dup(srv.fileno())
    srv.close()
    os.set_inheritable(fd, True)
    lst = bind(f"fd://{fd}")
    listeners.append(lst)
    assert lst.sock.fileno() == fd and not os.get_inheritable(fd)
    conn, peer = socket.socketpair()
    try:
        with pytest.raises(BindError, match=rf"fd://{conn.fileno()}: not a listening stream socket"):
            bind(f"fd://{conn.fileno()}")
        assert conn.fileno() >= 0                  # not closed: not ours
    finally:
        conn.close()
        peer.close()
    closed = os.dup(0)
    os.close(closed)
    with pytest.raises(BindError, match="not an open socket"):
        bind(f"fd://{closed}")


def test_bind_all_is_all_or_nothing(tmp_path):
    path = tmp_path / "a.sock"
    taken = bind("127.0.0.1:0")
    try:
        port = taken.sock.getsockname()[1]
        settings = types.SimpleNamespace(bind=[f"unix:{path}", f"127.0.0.1:{port}"], backlog=8,
                                         unix_mode="0660", unix_owner="")
        with pytest.raises(BindError):
            bind_all(settings)
        assert not path.exists()                   # the first one was undone
    finally:
        taken.close()
    with pytest.raises(AddressError):
        bind("nonsense")
