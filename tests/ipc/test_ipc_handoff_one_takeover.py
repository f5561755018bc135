"""The hand-off server's bounds (issue 19, findings 4 and 9) from the
client's side: one takeover at a time (refused while one is under way, and
while the instance that took the listeners lives; free again once it died),
sessions beyond the bound told "busy", and a client's fds never taken."""
import os
import socket
import subprocess
import sys
from array import array

import pytest

from sockherd.ipc import messages as m
from sockherd.ipc.channel import Channel
from sockherd.ipc.errors import HandoffError
from sockherd.ipc.frames import HEADER, KIND_MSG, MAGIC, VERSION
from sockherd.ipc.handoff import fetch_listeners

from ipc_fdcount import devnull_fds, open_fd_count
from ipc_waiting import wait_until
from test_ipc_handoff import listeners, serving, short_dir  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(60)


def _pairs(listeners):
    return lambda: [(desc, sock.fileno()) for desc, sock in listeners[:2]]


def _ask(path: str) -> Channel:
    """A client that asked and got the listeners, and has not confirmed."""
    ch = Channel.connect(path, timeout=10)
    ch.send(m.HandoffRequest(pid=os.getpid()), timeout=10)
    got = ch.recv(timeout=10)
    got.close_fds()
    assert isinstance(got.msg, m.HandoffListeners), got.msg
    return ch


def test_a_second_request_while_one_is_under_way_is_refused(serving, listeners):
    server, calls = serving(_pairs(listeners))
    with _ask(server.path):
        with pytest.raises(HandoffError, match=rf"refused: a takeover by pid {os.getpid()} "
                                               "is under way; one at a time"):
            fetch_listeners(server.path, timeout=10)
        # the refused session is gone by the time its client reads why
        assert len(server.poll_fds()) == 2, server.poll_fds()     # ours, still under way
    # the first left without confirming: nothing was handed over, the next may
    wait_until(lambda: len(server.poll_fds()) == 1, what="the sessions ended")
    got = fetch_listeners(server.path, timeout=10)
    for _, sock in got:
        sock.close()
    wait_until(lambda: calls, what="the hand-off callback")


def test_a_request_after_a_takeover_is_refused_while_its_taker_lives(serving, listeners):
    server, _ = serving(_pairs(listeners))
    for _, sock in fetch_listeners(server.path, timeout=10):
        sock.close()
    with pytest.raises(HandoffError, match=rf"refused: the listeners were handed over to "
                                           rf"pid {os.getpid()} already"):
        fetch_listeners(server.path, timeout=10)


def test_a_taker_that_died_frees_the_listeners_for_the_next(serving, listeners):
    server, calls = serving(_pairs(listeners))
    # another process takes them over and exits (a takeover whose workers failed)
    subprocess.run([sys.executable, "-c", "import sys; from sockherd.ipc.handoff import "
                    "fetch_listeners; fetch_listeners(sys.argv[1], timeout=10)", server.path],
                   check=True, timeout=30)
    wait_until(lambda: calls, what="the first hand-off")
    for _, sock in fetch_listeners(server.path, timeout=10):
        sock.close()
    wait_until(lambda: len(calls) == 2, what="the second hand-off")
    assert server.handed_to == os.getpid()


def test_a_session_beyond_the_bound_is_told_busy(serving, listeners):
    refused = []
    server, _ = serving(_pairs(listeners), on_refused=lambda pid, why: refused.append(why))
    held = [Channel.connect(server.path, timeout=10) for _ in range(2)]
    try:
        wait_until(lambda: len(server.poll_fds()) == 3, what="two sessions")
        with pytest.raises(HandoffError, match=r"refused: hand-off busy: 2 sessions under "
                                               r"way \(at most 2\); try again"):
            fetch_listeners(server.path, timeout=10)
    finally:
        for ch in held:
            ch.close()
    # the server logs the refusal after the reply went out: the client may
    # see its error first (a CI run found the list still empty)
    wait_until(lambda: any(why.startswith("hand-off busy") for why in refused),
               what="the refusal reported")


def test_fds_from_a_client_never_enter_the_servers_table(serving, listeners):
    refused = []
    server, _ = serving(_pairs(listeners), on_refused=lambda pid, why: refused.append(why))
    before = open_fd_count()
    payload = m.encode(m.HandoffRequest(pid=os.getpid()))
    fds = devnull_fds(200)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.settimeout(10)
            raw.connect(server.path)
            wait_until(lambda: len(server.poll_fds()) == 2, what="the session")
            with_fds = open_fd_count()
            raw.sendmsg([HEADER.pack(MAGIC, VERSION, KIND_MSG, len(fds), len(payload))
                         + payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", fds))])
            seen = max(open_fd_count() for _ in range(200))
            assert raw.recv(100) == b""          # the session is dropped
    finally:
        for fd in fds:
            os.close(fd)
    # the server (a thread of this process) never held one of them
    assert seen <= with_fds, (with_fds, seen)
    wait_until(lambda: open_fd_count() == before, what="the session closed")
    assert refused == ["session dropped: peer sent fds on a channel that takes none "
                       "(the kernel discarded them)"], refused
