"""Live listener transfer: a HandoffServer with real listeners (one set large enough to need
several fd batches) and fetch_listeners() as `sockherd run --takeover` will call it."""

import os
import resource
import select
import shutil
import socket
import stat
import tempfile
import threading
import uuid
from array import array

import pytest

from sockherd.ipc import messages as m
from sockherd.ipc.channel import Channel
from sockherd.ipc.errors import HandoffError, PeerClosed
from sockherd.ipc.frames import FD_BATCH, HEADER, KIND_MSG, MAGIC, VERSION, encode_frames
from sockherd.ipc.handoff import HandoffServer, fetch_listeners
from sockherd.ipc.listeners import ListenerDescriptor, describe

from ipc_fdcount import devnull_fds, open_fd_count, raise_nofile_limit
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
        calls, pids = [], []
        server = HandoffServer(path, pairs_fn, **kwargs, on_handed_over=lambda names, pid: (
            calls.append(names), pids.append(pid)))
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
    assert server.handed_to == os.getpid()           # SO_PEERCRED: this process took them
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


# -- hostile peers -------------------------------------------------------------------------

def frame(payload: bytes, nfds: int = 0) -> bytes:
    """A well-formed message frame around any payload, announcing nfds fds."""
    return HEADER.pack(MAGIC, VERSION, KIND_MSG, nfds, len(payload)) + payload


INVALID_UTF8 = b"\x81\xa4type\xa1\xff"                      # {"type": "\xff"}
DEEP = b"\x82\xa4type\xafhandoff_request\xa3pid" + b"\x91" * 2048 + b"\x01"


def send_raw(sock: socket.socket, data: bytes, fds=()) -> None:
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", fds))] if fds else []
    sock.sendmsg([data], ancillary)


@pytest.mark.parametrize("data, nfds", [
    (frame(INVALID_UTF8), 0),                                     # the review's 21 bytes
    (frame(DEEP), 0),
    (frame(m.encode(m.HandoffRequest(pid=1)), 2), 2),             # fds on a message without
    (frame(m.encode(m.HandoffRequest(pid=1)), 3), 2),             # fewer fds than announced
    (frame(INVALID_UTF8, 1)[:15], 1),                             # truncated, then EOF
    (b"\x00" * 64, 0),
], ids=["invalid-utf8", "deep", "fds-on-request", "fds-missing", "truncated", "zeros"])
def test_server_survives_a_hostile_client(serving, listeners, data, nfds):
    server, calls = serving(lambda: [(desc, sock.fileno()) for desc, sock in listeners[:2]])
    before = open_fd_count()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.settimeout(10)
        raw.connect(server.path)
        fds = devnull_fds(nfds)
        try:
            send_raw(raw, data, fds)
        finally:
            for fd in fds:
                os.close(fd)
        raw.shutdown(socket.SHUT_WR)
        assert raw.recv(100) == b""                  # the server dropped the session...
    wait_until(lambda: open_fd_count() == before, what="the server to close the session's fds")
    got = fetch_listeners(server.path, timeout=30)   # ...and serves the next client in full
    assert [desc for desc, _ in got] == [desc for desc, _ in listeners[:2]]
    for _, sock in got:
        sock.close()


@pytest.fixture
def path_listener(short_dir):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(os.path.join(short_dir, "app.sock"))
    sock.listen()
    yield sock
    sock.close()


@pytest.fixture
def fake_server(short_dir):
    """A hand-off "server" that answers one client with the raw units (bytes, fds) it is
    given, then closes: the replies fetch_listeners() must survive. The fds it sends are
    its own (closed once sent)."""
    path = os.path.join(short_dir, "fake")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    listener.settimeout(30)
    threads = []

    def start(units):
        def run():
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(10)
                conn.recv(4096)                       # the request, whatever it says
                try:
                    for data, fds in units:
                        send_raw(conn, data, fds)
                except OSError:
                    pass                              # the client gave up first: fine
                finally:
                    for _, fds in units:
                        for fd in fds:
                            os.close(fd)
        thread = threading.Thread(target=run)
        thread.start()
        threads.append(thread)
        return path

    yield start
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()
    listener.close()


def listeners_reply(descs, fds):
    return encode_frames(m.encode(m.HandoffListeners(list(descs))), fds)


HOSTILE_REPLIES = {
    "invalid-utf8": (lambda _: [(frame(INVALID_UTF8), [])],
                     "invalid UTF-8 in a string"),
    "deep": (lambda _: [(frame(DEEP), [])], "nests deeper than 32 levels"),
    "o_path": (lambda listener: listeners_reply(
        [describe(listener, "app")],
        [os.open(listener.getsockname(), os.O_PATH | os.O_CLOEXEC)]),
        "is an O_PATH reference to a socket .*, not an open socket"),
    "eventfd": (lambda listener: listeners_reply([describe(listener, "app")],
                                                 [os.eventfd(0, os.EFD_CLOEXEC)]),
                r"is an anonymous inode \(anon_inode:\[eventfd\]\), not a socket"),
    "directory": (lambda listener: listeners_reply(
        [describe(listener, "app")],
        [os.open(os.path.dirname(listener.getsockname()), os.O_RDONLY | os.O_CLOEXEC)]),
        "is a directory .*, not a socket"),
    "one-good-one-bad": (lambda listener: listeners_reply(
        [describe(listener, "app"), describe(listener, "app2")],
        [os.dup(listener.fileno()), os.eventfd(0, os.EFD_CLOEXEC)]),
        "listener 'app2': fd .* not a socket"),
    "no-fds": (lambda listener: listeners_reply([describe(listener, "app")], []),
               "handoff_listeners message carries 0 fds, expects 1"),
    "fds-on-error": (lambda _: encode_frames(m.encode(m.Error("no")), devnull_fds(3)),
                     "error message carries 3 fds, expects 0"),
    "fds-missing": (lambda _: [(frame(m.encode(m.HandoffListeners([])), 3), devnull_fds(2))],
                    "frame header announces 3 fds, received 2"),
    "truncated": (lambda _: [(frame(m.encode(m.HandoffListeners([])))[:-3], [])],
                  "peer closed the channel mid-frame"),
    "silence": (lambda _: [], "peer closed the channel"),
    "refusal": (lambda _: encode_frames(m.encode(m.Error("busy")), []), "refused: busy"),
}


@pytest.mark.parametrize("case", HOSTILE_REPLIES)
def test_client_turns_a_hostile_reply_into_handoff_error_and_leaks_nothing(
        fake_server, path_listener, case):
    make_units, message = HOSTILE_REPLIES[case]
    before = open_fd_count()
    path = fake_server(make_units(path_listener))
    with pytest.raises(HandoffError, match=message):
        fetch_listeners(path, timeout=30)
    wait_until(lambda: open_fd_count() == before, what="every received fd to be closed")


def test_server_survives_running_out_of_fds(short_dir, listeners):
    # accept() failing with EMFILE (a client flood, or the master's own fds) must not end
    # the serve loop: the connection waits in the backlog until fds are free again.
    # Driven by hand, without a thread, so the fd limit is low for this one call only.
    with HandoffServer(os.path.join(short_dir, "handoff"),
                       lambda: [(desc, sock.fileno()) for desc, sock in listeners[:1]]) as server:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(server.path)
            lowest_free = os.dup(0)
            os.close(lowest_free)
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
            try:
                server.handle(server.fileno(), select.POLLIN)      # accept(): EMFILE
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            assert server.poll_fds() == [(server.fileno(), select.POLLIN)]
            server.handle(server.fileno(), select.POLLIN)          # now it gets its session
            assert len(server.poll_fds()) == 2


def test_a_failing_owner_callback_propagates_but_closes_the_session(short_dir):
    # Not the client's fault, so the owner sees the exception; the session goes anyway.
    def broken_listeners():
        raise RuntimeError("listener table is gone")

    with HandoffServer(os.path.join(short_dir, "handoff"), broken_listeners) as server:
        with Channel.connect(server.path, timeout=10) as client:
            client.send(m.HandoffRequest(pid=os.getpid()), timeout=10)
            server.handle(server.fileno(), select.POLLIN)
            (session_fd, _), = server.poll_fds()[1:]
            with pytest.raises(RuntimeError, match="listener table is gone"):
                server.handle(session_fd, select.POLLIN)
            assert server.poll_fds() == [(server.fileno(), select.POLLIN)]
            with pytest.raises(PeerClosed):
                client.recv(timeout=10)
