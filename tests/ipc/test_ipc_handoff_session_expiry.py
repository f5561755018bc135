"""A hand-off server session whose client stalls (connected, asked, then
neither reads nor closes) holds duplicates of the listeners in its outbox:
they are closed once the hand-off timeout passed, and never for longer."""
import os
import threading
import time

import pytest

from sockherd.ipc import handoff
from sockherd.ipc import messages as m
from sockherd.ipc.channel import Channel
from sockherd.ipc.handoff import HandoffServer

from ipc_fdcount import open_fd_count
from ipc_waiting import wait_until
from test_ipc_handoff import listeners, short_dir  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(60)


def test_the_client_and_the_server_share_one_hand_off_timeout():
    """Defect: the server's session lifetime (10 s) and the client's
    hand-off timeout were two unrelated literals."""
    import inspect

    assert inspect.signature(HandoffServer).parameters["session_timeout"].default \
        == handoff.HANDOFF_TIMEOUT
    assert inspect.signature(handoff.fetch_listeners_from).parameters["timeout"].default \
        == handoff.HANDOFF_TIMEOUT


def test_a_stalled_clients_session_releases_the_listener_copies_at_the_timeout(short_dir,
                                                                                 listeners):
    """Defect: nothing tested that a session past its timeout is dropped
    and its listener duplicates (the fd batches still owed) closed."""
    timeout = 1.0
    server = HandoffServer(os.path.join(short_dir, "handoff"),
                           lambda: [(d, s.fileno()) for d, s in listeners],
                           session_timeout=timeout)
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(30,), kwargs={"until": stop.is_set})
    thread.start()
    client = None
    try:
        before = open_fd_count()
        client = Channel.connect(server.path, timeout=10)
        asked = time.monotonic()
        client.send(m.HandoffRequest(pid=os.getpid()), timeout=10)
        # our socket, the session's, and the copies of the batch not yet acked
        wait_until(lambda: open_fd_count() > before + 2, 10, "the session's copies")
        wait_until(lambda: open_fd_count() == before + 1, 10, "the copies released")
        took = time.monotonic() - asked
        assert timeout - 0.1 <= took <= timeout + 1.0, took
    finally:
        if client is not None:
            client.close()
        stop.set()
        thread.join(30)
        server.close()
