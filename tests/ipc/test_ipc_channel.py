"""Channels over real socketpairs: every message type, with 0, 1 and 1000+ fds, blocking
and from a poll loop, and peers that misbehave at the socket level."""

import os
import select
import socket
import struct
import threading
import time
import uuid
from array import array

import msgspec
import pytest

from sockherd.ipc import messages as m
from sockherd.ipc.channel import Channel
from sockherd.ipc.errors import (ChannelTimeout, ListenerMismatch, MessageError, PeerClosed,
                                 ProtocolError)
from sockherd.ipc.frames import ACK_FRAME, FD_BATCH, HEADER, KIND_MSG, MAGIC, VERSION
from sockherd.ipc.listeners import ListenerDescriptor, adopt, describe

from ipc_fdcount import devnull_fds, is_open, open_fd_count, open_fd_of_kind, raise_nofile_limit

MANY = 1000


@pytest.fixture(autouse=True)
def no_fd_leak():
    raise_nofile_limit(8 * MANY)
    before = open_fd_count()
    yield
    assert open_fd_count() == before


@pytest.fixture
def pair():
    a, b = Channel.pair()
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def listeners(request):
    """n listening abstract unix sockets (no files, no ports to collide on)."""
    made = []

    def make(n):
        for i in range(n):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            made.append(sock)
            sock.bind(f"\0sockherd-test-{uuid.uuid4().hex}-{i}")
            sock.listen(1)
        return made[-n:] if n else []

    yield make
    for sock in made:
        sock.close()


def in_thread(fn, *args, **kwargs):
    """Run fn in a thread; join() re-raises its exception. For the side of a blocking
    exchange that must run concurrently (ACKs between fd batches need a reader)."""
    result = {}

    def run():
        try:
            result["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the joining test
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()

    def join(timeout=30):
        thread.join(timeout)
        assert not thread.is_alive(), "helper thread hung"
        if "error" in result:
            raise result["error"]
        return result.get("value")

    return join


def pump(channels, until, timeout=30.0):
    """A miniature master loop: poll every channel, flush the writable, read the readable,
    until until() is true."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "poll loop made no progress"
        poller = select.poll()
        by_fd = {}
        for ch in channels:
            by_fd[ch.fileno()] = ch
            poller.register(ch, select.POLLIN | (select.POLLOUT if ch.wants_write else 0))
        for fd, revents in poller.poll(100):
            ch = by_fd[fd]
            if revents & select.POLLOUT:
                ch.flush()
            if revents & select.POLLIN:
                ch.read_available()


PLAIN = [
    m.Ready(pid=1234),
    m.FailedBeforeReady(reason="ImportError: no module named 'app'"),
    m.Heartbeat(seq=7, sent_at=12.5),
    m.Drain(deadline=99.25),
    m.Stop(),
    m.StatsRequest(request_id=3),
    m.StatsReply(request_id=3, stats={"accepted": 10, "load": 0.5}),
    m.Error(message="unknown message type 'foo'"),
    m.HandoffRequest(pid=42),
    m.HandoffConfirm(names=["web", "admin"]),
]


def with_listeners(kind, descs):
    if kind == "assignment":
        return m.Assignment(generation=3, worker_index=1,
                            config={"threads": 4, "groups": [1, 2], "app": {"x": None}},
                            app="tests.app:application", listeners=descs)
    return m.HandoffListeners(listeners=descs)


@pytest.mark.parametrize("msg", PLAIN, ids=lambda msg: type(msg).__name__)
def test_plain_message_round_trip(pair, msg):
    a, b = pair
    a.send(msg)
    got = b.recv(timeout=10)
    assert got.msg == msg and got.fds == []


@pytest.mark.parametrize("nfds", [1, MANY])
@pytest.mark.parametrize("msg", PLAIN, ids=lambda msg: type(msg).__name__)
def test_plain_message_with_fds_is_refused_and_fds_closed(pair, msg, nfds):
    a, b = pair
    fds = devnull_fds(nfds)
    try:
        join = in_thread(a.send, msg, fds, timeout=30)
        with pytest.raises(MessageError, match=f"carries {nfds} fds, expects 0"):
            b.recv(timeout=30)
        join()
    finally:
        for fd in fds:
            os.close(fd)
    # The framing is intact: the channel carries on.
    a.send(m.Stop())
    assert b.recv(timeout=10).msg == m.Stop()


@pytest.mark.parametrize("nfds", [0, 1, MANY])
@pytest.mark.parametrize("kind", ["assignment", "handoff_listeners"])
def test_listener_message_round_trip_blocking(pair, listeners, kind, nfds):
    a, b = pair
    socks = listeners(nfds)
    msg = with_listeners(kind, [describe(s, f"l{i}") for i, s in enumerate(socks)])
    join = in_thread(a.send, msg, [s.fileno() for s in socks], timeout=30)
    got = b.recv(timeout=30)
    join()
    assert got.msg == msg and len(got.fds) == nfds
    adopted = adopt(got.msg.listeners, got.fds)      # each fd really is its listener
    assert [s.getsockname() for s in adopted] == [s.getsockname() for s in socks]
    for sock in adopted:
        assert sock.get_inheritable() is False       # MSG_CMSG_CLOEXEC
        sock.close()


def test_listener_message_round_trip_from_poll_loop(pair, listeners):
    a, b = pair
    socks = listeners(MANY + 7)
    msg = with_listeners("assignment", [describe(s, f"l{i}") for i, s in enumerate(socks)])
    a.post(msg, [s.fileno() for s in socks])
    # post() took duplicates: the master may close its own copies at once.
    for sock in socks:
        sock.close()
    got = []
    pump([a, b], until=lambda: got.append(b.next_message()) or got[-1] is not None)
    received = got[-1]
    assert received.msg == msg and len(received.fds) == MANY + 7
    for sock in adopt(received.msg.listeners, received.fds):
        sock.close()
    assert not a.wants_write


def test_both_peers_send_large_fd_sets_at_once(pair, listeners):
    # Each side waits for the other's ACK while owing one: our ACKs must jump the queue.
    a, b = pair
    socks = listeners(600)
    msg = with_listeners("handoff_listeners", [describe(s, f"l{i}") for i, s in enumerate(socks)])
    fds = [s.fileno() for s in socks]
    a.post(msg, fds)
    b.post(msg, fds)
    inbox = {a: [], b: []}

    def both_received():
        for ch in (a, b):
            got = ch.next_message()
            if got is not None:
                inbox[ch].append(got)
        return inbox[a] and inbox[b]

    pump([a, b], until=both_received)
    for got in (inbox[a][0], inbox[b][0]):
        assert got.msg == msg
        got.close_fds()


def test_large_payload_survives_partial_writes(pair):
    a, b = pair
    msg = m.Assignment(generation=1, worker_index=0, config={"blob": "x" * 5_000_000},
                       app="a:b")
    a.post(msg)
    assert a.wants_write                               # far more than a socket buffer
    got = []
    pump([a, b], until=lambda: got.append(b.next_message()) or got[-1] is not None)
    assert got[-1].msg == msg
    join = in_thread(a.send, msg, timeout=30)          # and the blocking way
    assert b.recv(timeout=30).msg == msg
    join()


def test_malformed_messages_get_precise_errors_and_the_channel_survives(pair):
    a, b = pair
    raw = a.socket
    for body, text in [
        ({"type": "foo"}, "unknown message type 'foo'"),
        ({"type": "assignment", "generation": "3"}, "field `$.generation`: "),
        ({"type": "stop", "now": True}, "unknown field `now`"),
    ]:
        payload = msgspec.msgpack.encode(body)
        raw.sendall(HEADER.pack(MAGIC, VERSION, KIND_MSG, 0, len(payload)) + payload)
        with pytest.raises(MessageError) as info:
            b.recv(timeout=10)
        # our words (ipc/wording.py), whichever msgspec words the reason after them
        assert str(info.value) == text or (text.endswith(": ")
                                           and str(info.value).startswith(text)), info.value
    a.send(m.Ready(pid=1))
    assert b.recv(timeout=10).msg == m.Ready(pid=1)


def test_more_than_one_batch_in_one_sendmsg_is_ctrunc():
    a, b = socket.socketpair()
    channel = Channel(b)
    fds = devnull_fds(FD_BATCH + 1)
    try:
        a.sendmsg([HEADER.pack(MAGIC, VERSION, KIND_MSG, len(fds), 0)],
                  [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", fds))])
        with pytest.raises(ProtocolError, match="MSG_CTRUNC"):
            channel.recv(timeout=10)
    finally:
        for fd in fds:
            os.close(fd)
        a.close()
        channel.close()


def test_fewer_fds_than_announced(pair):
    a, b = pair
    fds = devnull_fds(2)
    a.socket.sendmsg([HEADER.pack(MAGIC, VERSION, KIND_MSG, 3, 0)],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", fds))])
    for fd in fds:
        os.close(fd)
    with pytest.raises(ProtocolError, match="^frame header announces 3 fds, received 2$"):
        b.recv(timeout=10)


def test_peer_dies_mid_frame(pair):
    a, b = pair
    fds = devnull_fds(1)
    a.socket.sendmsg([HEADER.pack(MAGIC, VERSION, KIND_MSG, 1, 100) + b"partial"],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", fds))])
    os.close(fds[0])
    a.socket.close()
    with pytest.raises(ProtocolError, match="mid-frame: got 7 of 100 payload bytes"):
        b.recv(timeout=10)


def test_peer_closes_between_frames(pair):
    a, b = pair
    a.send(m.Stop())
    a.socket.close()
    assert b.recv(timeout=10).msg == m.Stop()
    with pytest.raises(PeerClosed):
        b.recv(timeout=10)


def test_peer_dies_while_we_wait_for_an_ack(pair):
    a, b = pair
    fds = devnull_fds(FD_BATCH + 1)
    try:
        # b reads nothing and closes: a's second batch never gets its ACK.
        join = in_thread(a.send, m.HandoffListeners([]), fds, timeout=30)
        deadline = time.monotonic() + 10
        while not select.select([b.socket], [], [], 0.05)[0]:
            assert time.monotonic() < deadline
        b.socket.close()
        with pytest.raises(PeerClosed):
            join()
    finally:
        for fd in fds:
            os.close(fd)


def leave(sock: socket.socket, how: str) -> None:
    if how == "close":
        sock.close()
    else:
        sock.shutdown(socket.SHUT_RD if how == "shut_rd" else socket.SHUT_WR)


def call_until_it_raises(channel: Channel, path: str) -> None:
    """Drive one of the channel's entry points the way its users do, until it raises."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if path == "recv":
            channel.recv(timeout=10)
        elif path == "read_available":
            select.select([channel], [], [], 1)
            channel.read_available()
        elif path == "send":
            channel.send(m.Stop(), timeout=10)
        else:
            channel.post(m.Stop())
    raise AssertionError(f"{path} never raised")


# (entry point, how the peer leaves, whether we had read and acked its first batch). Left
# out: the combinations where nothing is wrong yet (a peer that shut down only its write
# side still reads what we send; one that only stopped reading after our ACK may still
# send its next batch).
MID_BATCH = [(path, how, False) for path in ["recv", "read_available"]
             for how in ["shut_rd", "shut_wr", "close"]]
MID_BATCH += [(path, how, acked) for path in ["send", "post"]
              for how in ["shut_rd", "close"] for acked in [False, True]]
MID_BATCH += [(path, "close", True) for path in ["recv", "read_available"]]


@pytest.mark.parametrize("path, how, acked", MID_BATCH)
def test_peer_gone_mid_batch_closes_every_fd_received_before_raising(path, how, acked):
    # errors.py: an error is raised only after the fds of the bad input are closed; here
    # the FD_BATCH fds of a message that can no longer complete, before close(), not at it.
    raw, ours = socket.socketpair()
    channel = Channel(ours)
    try:
        before = open_fd_count()
        fds = devnull_fds(FD_BATCH)
        try:
            raw.sendmsg([HEADER.pack(MAGIC, VERSION, KIND_MSG, FD_BATCH + 5, 0)],
                        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", fds))])
        finally:
            for fd in fds:
                os.close(fd)
        if acked:
            assert channel.read_available() == 0
            assert raw.recv(len(ACK_FRAME)) == ACK_FRAME
        leave(raw, how)
        if how == "close":
            before -= 1
        with pytest.raises(ProtocolError, match="^peer closed the channel mid-frame: "
                                                "5 fds of a message still to come$"):
            call_until_it_raises(channel, path)
        assert open_fd_count() == before
        with pytest.raises(ProtocolError, match="already failed"):
            channel.recv(timeout=10)
    finally:
        channel.close()
        raw.close()


def test_recv_times_out(pair):
    _, b = pair
    with pytest.raises(ChannelTimeout):
        b.recv(timeout=0.05)


def test_non_stream_socket_is_refused():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with a, b, pytest.raises(ValueError, match="stream socket"):
        Channel(a)


# -- listener descriptors ------------------------------------------------------------------

def test_descriptor_mismatch_is_refused_and_every_fd_closed(listeners):
    good, other = listeners(2)
    desc = describe(good, "web")
    fds = [os.dup(good.fileno()), os.dup(other.fileno())]
    with pytest.raises(ListenerMismatch, match=r"listener 'api': fd \d+ is bound to @sockherd"):
        adopt([desc, ListenerDescriptor("api", "unix", desc.address)], fds)
    assert not any(is_open(fd) for fd in fds)


@pytest.mark.parametrize("case, message", [
    ("pipe", r"is a pipe \(pipe:\[\d+\]\), not a socket"),
    ("not_listening", "is not listening"),
    ("dgram", "is a dgram socket, descriptor says stream"),
    ("inet", "is an inet socket, descriptor says unix"),
    ("count", "1 listener descriptors but 2 fds"),
])
def test_descriptor_checks(case, message):
    desc = ListenerDescriptor("web", "unix", "@nowhere")
    if case == "pipe":
        r, w = os.pipe()
        os.close(w)
        fds = [r]
    elif case == "not_listening":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(f"\0sockherd-test-{uuid.uuid4().hex}")
        fds = [sock.detach()]
    elif case == "dgram":
        fds = [socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).detach()]
    elif case == "inet":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        fds = [sock.detach()]
    else:
        fds = devnull_fds(2)
    with pytest.raises(ListenerMismatch, match=message):
        adopt([desc], fds)
    assert not any(is_open(fd) for fd in fds)




NOT_SOCKETS = {
    "o_path_socket": r"is an O_PATH reference to a socket \(/tmp/sh-\w+/l.sock\), "
                     "not an open socket",
    "o_path_file": r"is an O_PATH reference to a regular file \(/.*ipc_fdcount.py\), "
                   "not a socket",
    "o_path_dir": r"is an O_PATH reference to a directory \(/tmp/sh-\w+\), not a socket",
    "file": r"is a regular file \(/.*ipc_fdcount.py\), not a socket",
    "dir": r"is a directory \(/tmp/sh-\w+\), not a socket",
    "pipe": r"is a pipe \(pipe:\[\d+\]\), not a socket",
    "eventfd": r"is an anonymous inode \(anon_inode:\[eventfd\]\), not a socket",
    "chardev": r"is a character device \(/dev/null\), not a socket",
    "closed": r"is not open \(Bad file descriptor\)",
}


@pytest.mark.parametrize("kind", NOT_SOCKETS)
def test_adopt_refuses_every_kind_of_non_socket_and_closes_every_fd(path_listener, kind):
    desc = describe(path_listener, "app")
    good = open_fd_of_kind("listener", path_listener)
    bad = open_fd_of_kind(kind, path_listener)
    fds = [good, bad] if kind != "closed" else [good]
    descs = [desc, desc]
    with pytest.raises(ListenerMismatch, match=rf"^listener 'app': fd {bad} {NOT_SOCKETS[kind]}$"):
        adopt(descs, [good, bad])
    assert not any(is_open(fd) for fd in fds)


def test_descriptor_of_tcp_listener():
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    with sock:
        try:
            sock.bind(("::1", 0))
        except OSError as exc:
            pytest.skip(f"no IPv6 loopback here: {exc}")
        sock.listen()
        desc = describe(sock, "v6", {"backlog": 128, "reuseport": False})
        assert desc.address == f"[::1]:{sock.getsockname()[1]}"
        assert desc.family == "inet6" and desc.options == {"backlog": 128, "reuseport": False}
        got, = adopt([desc], [os.dup(sock.fileno())])
        got.close()


def test_unexpected_ack_is_a_protocol_error(pair):
    a, b = pair
    a.socket.sendall(ACK_FRAME)
    with pytest.raises(ProtocolError, match="unexpected ack frame"):
        b.recv(timeout=10)
    # No waiting on a dead channel: the failure is reported at once.
    with pytest.raises(ProtocolError, match="channel already failed: unexpected ack"):
        b.recv()


def test_send_that_timed_out_completes_later_with_its_own_fd_copies(pair, listeners):
    a, b = pair
    socks = listeners(FD_BATCH + 3)
    msg = with_listeners("assignment", [describe(s, f"l{i}") for i, s in enumerate(socks)])
    with pytest.raises(ChannelTimeout):
        a.send(msg, [s.fileno() for s in socks], timeout=0.05)   # nobody reads: no ACK
    for sock in socks:
        sock.close()                       # the caller's copies: the queued message has its own
    got = []
    pump([a, b], until=lambda: got.append(b.next_message()) or got[-1] is not None)
    for sock in adopt(got[-1].msg.listeners, got[-1].fds):
        sock.close()


def test_channel_from_inherited_fd():
    a, b = socket.socketpair()
    b.set_inheritable(True)
    with Channel(a) as ours, Channel.from_fd(b.detach()) as theirs:
        assert not theirs.socket.get_inheritable()
        ours.send(m.Stop())
        assert theirs.recv(timeout=10).msg == m.Stop()
