"""Live listener transfer: a HandoffServer with real listeners (one set large enough to need
several fd batches) and fetch_listeners() as `sockherd run --takeover` will call it."""

import os
import shutil
import socket
import stat
import tempfile
import threading
import uuid

import pytest

from sockherd.ipc import messages as m
from sockherd.ipc.channel import Channel
from sockherd.ipc.errors import HandoffError
from sockherd.ipc.frames import FD_BATCH
from sockherd.ipc.handoff import HandoffServer, fetch_listeners
from sockherd.ipc.listeners import ListenerDescriptor, describe

from ipc_fdcount import open_fd_count, raise_nofile_limit
from ipc_waiting import wait_until


@pytest.fixture
def short_dir():
    # AF_UNIX paths are limited to 108 bytes; pytest's tmp_path can be longer.
    path = tempfile.mkdtemp(prefix="sh-")
    yield path
    shutil.rmtree(path)


@pytest.fixture
def listeners(short_dir):
    raise_nofile_limit(4096)
    socks = []

    def add(sock, name):
        socks.append((describe(sock, name), sock))

    tcp = socket.create_server(("127.0.0.1", 0))
    add(tcp, "web")
    path_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path_sock.bind(os.path.join(short_dir, "app.sock"))
    path_sock.listen()
    add(path_sock, "app")
    for i in range(FD_BATCH + 60):                    # forces two batches and an ACK
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(f"\0sockherd-handoff-{uuid.uuid4().hex}")
        sock.listen()
        add(sock, f"bulk{i}")
    yield socks
    for _, sock in socks:
        sock.close()


@pytest.fixture
def serving(short_dir):
    """Start a HandoffServer in a thread of its own; stopped and closed whatever happens."""
    started = []

    def start(pairs_fn, **kwargs):
        path = os.path.join(short_dir, "handoff")
        calls = []
        server = HandoffServer(path, pairs_fn, on_handed_over=calls.append, **kwargs)
        stop = threading.Event()
        thread = threading.Thread(target=server.serve, args=(120,), kwargs={"until": stop.is_set})
        thread.start()
        started.append((server, stop, thread))
        return server, calls

    yield start
    for server, stop, thread in started:
        stop.set()
        thread.join(30)
        assert not thread.is_alive()
        server.close()


def connect_to(desc: ListenerDescriptor) -> socket.socket:
    if desc.family == "inet":
        host, port = desc.address.rsplit(":", 1)
        return socket.create_connection((host, int(port)), timeout=10)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect("\0" + desc.address[1:] if desc.address.startswith("@") else desc.address)
    return sock


def test_fetch_listeners_end_to_end(serving, listeners):
    server, calls = serving(lambda: [(desc, sock.fileno()) for desc, sock in listeners])
    assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600
    got = fetch_listeners(server.path, timeout=30)
    try:
        assert [desc for desc, _ in got] == [desc for desc, _ in listeners]
        for desc, sock in got:
            # Our copy is the very listener: a connection to its address is ours to accept.
            with connect_to(desc) as client:
                sock.settimeout(10)
                conn, _ = sock.accept()
                with conn:
                    conn.sendall(b"x")
                    assert client.recv(1) == b"x"
            assert not sock.get_inheritable()
    finally:
        for _, sock in got:
            sock.close()
    names = [desc.name for desc, _ in listeners]
    wait_until(lambda: calls, what="the hand-off callback")
    assert calls == [names]
    assert server.handed_over == set(names)


def test_client_that_leaves_midway_hands_nothing_over(serving, listeners):
    server, calls = serving(lambda: [(desc, sock.fileno()) for desc, sock in listeners])
    before = open_fd_count()
    channel = Channel.connect(server.path, timeout=10)
    channel.send(m.HandoffRequest(pid=os.getpid()), timeout=10)
    channel.close()                                  # gone before receiving everything
    wait_until(lambda: open_fd_count() == before, what="the server to drop its session")
    # The server shrugs it off and serves the next client completely.
    got = fetch_listeners(server.path, timeout=30)
    for _, sock in got:
        sock.close()
    wait_until(lambda: calls, what="the hand-off callback")
    assert len(calls) == 1


def test_garbage_client_is_dropped(serving, listeners):
    server, calls = serving(lambda: [(desc, sock.fileno()) for desc, sock in listeners[:2]])
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.settimeout(10)
        raw.connect(server.path)
        raw.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert raw.recv(100) == b""                  # session closed on the protocol error
    got = fetch_listeners(server.path, timeout=30)
    assert len(got) == 2
    for _, sock in got:
        sock.close()


def test_lying_server_is_refused_and_nothing_leaks(serving, listeners):
    desc, sock = listeners[0]
    lie = ListenerDescriptor(desc.name, desc.family, "127.0.0.1:1")
    server, calls = serving(lambda: [(lie, sock.fileno())])
    before = open_fd_count()
    with pytest.raises(HandoffError, match="is bound to 127.0.0.1:.*descriptor says 127.0.0.1:1"):
        fetch_listeners(server.path, timeout=30)
    # The server thread drops its session (and its fd copies) once it sees us gone.
    wait_until(lambda: open_fd_count() == before, what="the server to drop its session")
    assert calls == [] and server.handed_over == set()


def test_unexpected_request_gets_an_error_reply(serving, listeners):
    server, _ = serving(lambda: [])
    with Channel.connect(server.path, timeout=10) as channel:
        channel.send(m.HandoffConfirm(names=["web"]), timeout=10)
        reply = channel.recv(timeout=10)
    assert reply.msg == m.Error(message="unexpected handoff_confirm message")


def test_no_server():
    with pytest.raises(HandoffError, match="cannot connect to /nonexistent/handoff"):
        fetch_listeners("/nonexistent/handoff", timeout=5)
