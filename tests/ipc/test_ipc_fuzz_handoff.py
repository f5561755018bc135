"""Hypothesis against the live listener hand-off: the server fed random frames must keep
serving a well-behaved client afterwards; the client fed random replies must raise an
IPCError subclass (or get listeners, if the garbage happened to be a valid hand-off).
Either way the process holds exactly as many fds after each example as before."""

import os
import shutil
import socket
import tempfile
import threading
from array import array

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from sockherd.ipc import messages as m
from sockherd.ipc.channel import Channel
from sockherd.ipc.errors import IPCError
from sockherd.ipc.frames import encode_frames
from sockherd.ipc.handoff import HandoffServer, fetch_listeners
from sockherd.ipc.listeners import describe

from ipc_fdcount import FD_KINDS, devnull_fds, open_fd_count, open_fd_of_kind
from ipc_streams import stream
from ipc_waiting import wait_until

HANDOFF_FUZZ = settings(max_examples=50, deadline=None, database=None,
                        suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def short_dir():
    # AF_UNIX paths are limited to 108 bytes; pytest's tmp_path can be longer.
    path = tempfile.mkdtemp(prefix="sh-")
    yield path
    shutil.rmtree(path)


@pytest.fixture(scope="module")
def listener(short_dir):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(os.path.join(short_dir, "app.sock"))
    sock.listen()
    yield sock
    sock.close()


@pytest.fixture(scope="module")
def server(short_dir, listener):
    """One server for every example, in a thread of its own: it must outlive them all."""
    server = HandoffServer(os.path.join(short_dir, "handoff"),
                           lambda: [(describe(listener, "app"), listener.fileno())])
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(600,), kwargs={"until": stop.is_set})
    thread.start()
    yield server, thread
    stop.set()
    thread.join(30)
    assert not thread.is_alive()
    server.close()


def send_with_fds(sock: socket.socket, data: bytes, fds) -> None:
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", fds))] if fds else []
    sock.sendmsg([data], ancillary)


def send_all(sock: socket.socket, chunks) -> None:
    """Write (bytes, nfds) chunks with fresh /dev/null fds; stop where the peer hangs up."""
    for data, nfds in chunks:
        fds = devnull_fds(nfds)
        try:
            send_with_fds(sock, data, fds)
        except (BrokenPipeError, ConnectionResetError):
            return
        finally:
            for fd in fds:
                os.close(fd)


@HANDOFF_FUZZ
@given(stream())
def test_server_fed_garbage_keeps_serving(server, listener, chunks):
    server, thread = server
    before = open_fd_count()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.settimeout(10)
        raw.connect(server.path)
        send_all(raw, chunks)
        raw.shutdown(socket.SHUT_WR)
        # Until the server closes the session: it has dealt with all of it. (recv() without
        # room for ancillary data: the kernel drops any fds the server sent along. A
        # session closed with our garbage still unread in it is ECONNRESET for us.)
        try:
            while raw.recv(65536):
                pass
        except ConnectionResetError:
            pass
    assert thread.is_alive()
    # a new instance's request is answered in full (not confirmed: the server
    # serves one takeover, and the next example asks again)
    with Channel.connect(server.path, timeout=10) as channel:
        channel.send(m.HandoffRequest(pid=os.getpid()), timeout=10)
        got = channel.recv(timeout=10)
        got.close_fds()
    assert got.msg == m.HandoffListeners([describe(listener, "app")])
    wait_until(lambda: open_fd_count() == before, timeout=10,
               what="the server to close every session's fds")


@st.composite
def listeners_reply(draw):
    """A HandoffListeners frame whose fds may be anything but the listeners it names."""
    kinds = draw(st.lists(st.sampled_from(FD_KINDS), max_size=4))
    ndescs = max(0, len(kinds) + draw(st.integers(-1, 1)))
    return kinds, ndescs


def answer_once(sock: socket.socket, listener: socket.socket, chunks, reply) -> None:
    """The fake server's side: accept one client, read its request, send the garbage and
    maybe a listeners reply, hang up."""
    conn, _ = sock.accept()
    with conn:
        conn.settimeout(10)
        conn.recv(4096)
        if reply is not None:
            kinds, ndescs = reply
            fds = [open_fd_of_kind(kind, listener) for kind in kinds]
            try:
                msg = m.HandoffListeners([describe(listener, f"l{i}") for i in range(ndescs)])
                (data, batch), = encode_frames(m.encode(msg), fds)
                send_with_fds(conn, data, batch)
            except (BrokenPipeError, ConnectionResetError):
                return
            finally:
                for fd in fds:
                    os.close(fd)
        send_all(conn, chunks)


@pytest.fixture(scope="module")
def fake_server(short_dir):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(os.path.join(short_dir, "fake"))
    sock.listen()
    sock.settimeout(10)
    yield sock
    sock.close()


@HANDOFF_FUZZ
@given(stream(), st.one_of(st.none(), listeners_reply()))
def test_client_fed_garbage_raises_an_ipc_error_and_leaks_nothing(fake_server, listener,
                                                                   chunks, reply):
    before = open_fd_count()
    failed = []

    def run():
        try:
            answer_once(fake_server, listener, chunks, reply)
        except BaseException as exc:   # handed to the test below
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        got = fetch_listeners(fake_server.getsockname(), timeout=10)
    except IPCError:
        pass
    else:
        # Garbage that was a valid hand-off after all: only the real listener gets through.
        for _, sock in got:
            assert sock.getsockname() == listener.getsockname()
            sock.close()
    finally:
        thread.join(30)
    assert not thread.is_alive() and not failed
    assert open_fd_count() == before
