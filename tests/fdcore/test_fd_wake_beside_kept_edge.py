"""fdc_wake is never swallowed by a poll round of kept edges (review of
fdcore's kept edges, finding 1).

fdc_poll waits again after a round whose fd reports were all an FDC_EDGE
fd's edges kept for a direction nobody wants (poller.c, fdc_poll and
poll_round's kept_only). A wake-up (fdc_wake: the eventfd token) read in
that same round is not an fd report, so the round still counted as "only
kept edges": the eventfd was drained and the thread went back to sleep for
the rest of its timeout. The dispatch's spill hands a queue to a sibling
with exactly such a wake-up (and a worker's stop uses one), and the edge
beside it is an everyday one: the ADD of a connection the thread just
accepted reports the fresh socket writable to it (kept: KEPT_W), and an
AF_UNIX peer's every read does too.
"""
import socket
import time

import pytest

from sockherd.fdcore._fdcore import lib
from test_fd_shared_conn import inserted

pytestmark = pytest.mark.timeout(60)

TIMEOUT_MS = 5000


@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_a_wake_beside_a_kept_edge_returns_the_poll(kind):
    """The inserter's ADD report (writable, not wanted: kept) and a wake-up
    are both ready when it next polls: the poll returns at once, as it
    does for a wake-up alone, instead of waiting out its timeout."""
    if kind == "tcp":
        with socket.socket() as lsock:
            lsock.bind(("127.0.0.1", 0))
            lsock.listen(1)
            peer = socket.create_connection(lsock.getsockname())
            a, _ = lsock.accept()
    else:
        a, peer = socket.socketpair()
    with inserted(a, peer) as (table, fd):
        th = table.threads[0]
        before = th.counters()["wakeups"]
        table.wake(0)
        t0 = time.monotonic()
        assert th.poll(TIMEOUT_MS) == []
        took = time.monotonic() - t0
        # the edge was read in that round, and kept (not handed out)
        assert table.dump(fd).state & lib.FDC_KEPT_W
        assert th.counters()["wakeups"] == before + 1
        assert took < TIMEOUT_MS / 1000 / 2, f"woken thread slept {took:.2f}s"
