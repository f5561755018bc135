"""Closed-loop HTTP clients for the tests that change a serving master
under load (reload, upgrade, a certificate's rotation): each thread sends
`GET /` until stopped, on a new connection per request (fresh) or on one
kept alive (kept: a connection the server closes with `Connection: close`
between requests is opened again, as a keep-alive client does: that is no
failure). Every other outcome is a failure, kept with its reason: a
drain answers with Connection: close before it closes a kept-alive
connection, so any reset or EOF counts."""
from __future__ import annotations

import http.client
import threading
from contextlib import contextmanager

from test_run import wait_for


class LoopClients:
    """Threads of `kinds` (True: fresh, False: kept) until stop();
    connect() gives an unopened connection. A subclass's check() looks at
    a 200's body and what seen() took from the connection before the
    answer was read (a drain's Connection: close makes http.client drop
    the socket with the answer)."""

    def __init__(self, connect, kinds: list[bool]):
        self.ok = 0
        self.failures: list[str] = []
        self._connect = connect
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(fresh,), daemon=True)
                         for fresh in kinds]
        for t in self._threads:
            t.start()

    def seen(self, conn: http.client.HTTPConnection):
        return None

    def check(self, body: bytes, seen) -> str | None:
        """Why a 200 with this body is a failure, or None (it is counted ok)."""
        return None

    def _run(self, fresh: bool) -> None:
        kind = "fresh" if fresh else "kept"
        conn = None
        try:
            while not self._stop.is_set():
                if conn is None:
                    conn = self._connect()
                try:
                    conn.request("GET", "/")
                    seen = self.seen(conn)
                    r = conn.getresponse()
                    body = r.read()
                except Exception as exc:  # noqa: BLE001 - counted, that is the test
                    self.failures.append(f"{kind}: {exc!r}")
                    conn.close()
                    conn = None
                    continue
                why = f"status {r.status}" if r.status != 200 else self.check(body, seen)
                if why:
                    self.failures.append(f"{kind}: {why}")
                else:
                    self.ok += 1
                if fresh or r.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = None
        finally:
            if conn is not None:
                conn.close()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


@contextmanager
def under_load(clients: LoopClients, answers: int, timeout: float = 20):
    """`answers` answers before the block and as many after it; the
    clients stopped whatever happens, and not one failure."""
    try:
        wait_for(lambda: clients.ok > answers, timeout, "traffic")
        yield clients
        before = clients.ok
        wait_for(lambda: clients.ok > before + answers, timeout, "traffic after")
    finally:
        clients.stop()
    assert clients.failures == [], clients.failures[:5]
