"""Hand-off: this master gives its listeners to a new instance (`run --takeover`).

The hand-off socket (the handoff_socket setting) is served from the master's
loop by ipc.handoff's server: its sessions come and go, and their fds are
kept in the loop's selector here (`sync`). A takeover serves its own only
once it serves (a takeover that failed must leave the old instance's in
place): the loop calls `serve` then.

Short of fds (fewer than fdbudget's hand-off floor free: one read may bring
FD_BATCH of them), nothing of the hand-off is watched, so nothing is
accepted or read; `short` tells the loop to look again within a second.
"""
from __future__ import annotations

import logging
import selectors
import time

from sockherd.master.fdbudget import BUDGET

log = logging.getLogger("sockherd.master")

LOG_EVERY = 60.0         # refused clients: one line, then a count at most this often


class Handoff:
    def __init__(self, sel: selectors.BaseSelector):
        self.sel = sel
        self.server = None                   # ipc.handoff.HandoffServer, once served
        self.fds: set[int] = set()
        self.short = False                   # too few fds free: not watched
        self._refusals = 0                   # not logged yet (LOG_EVERY)
        self._logged_at = -LOG_EVERY

    def serve(self, path: str, listeners) -> None:
        """Serves the hand-off socket at path (none if ""); listeners() ->
        the listeners to give, at the time they are asked for."""
        from sockherd.ipc.handoff import HandoffServer

        if not path:
            return

        def handed_over(names: list[str], pid: int) -> None:
            # the new instance holds these sockets now: our close must not
            # remove a unix socket's file while it holds them too
            for lst in listeners():
                if lst.descriptor.name in names:
                    lst.handed_to = pid
            log.info("hand-off: %d listener(s) given to a new instance; it will tell us to "
                     "drain once it serves", len(names))

        try:
            self.server = HandoffServer(
                path, lambda: [(lst.descriptor, lst.sock.fileno()) for lst in listeners()],
                on_handed_over=handed_over, on_refused=self._refused)
        except OSError as exc:
            log.error("hand-off socket %s: %s; no takeover possible", path, exc.strerror or exc)
            return
        log.info("hand-off socket %s: a new instance may take the listeners over", path)

    def _refused(self, pid: int, why: str) -> None:
        """A client refused or dropped (ipc.handoff): one line, not one per
        client of a flood."""
        self._refusals += 1
        now = time.monotonic()
        if now - self._logged_at < LOG_EVERY:
            return
        more = f" ({self._refusals - 1} more since the last such line)" \
            if self._refusals > 1 else ""
        log.warning("hand-off: refused %s: %s%s", f"pid {pid}" if pid else "a client", why,
                    more)
        self._refusals, self._logged_at = 0, now

    def sync(self) -> None:
        """The hand-off server's fds in the selector (its sessions come and go)."""
        h = self.server
        if h is None:
            return
        h.expire()
        want = {fd: mask for fd, mask in h.poll_fds()}
        if self._short_of_fds():
            want = {}
        for fd in self.fds - set(want):
            try:
                self.sel.unregister(fd)
            except (KeyError, ValueError):
                pass
        for fd, mask in want.items():
            events = (selectors.EVENT_READ if mask & 1 else 0) | \
                (selectors.EVENT_WRITE if mask & 4 else 0)
            try:
                self.sel.modify(fd, events or selectors.EVENT_READ, ("handoff", fd))
            except KeyError:
                self.sel.register(fd, events or selectors.EVENT_READ, ("handoff", fd))
        self.fds = set(want)

    def _short_of_fds(self) -> bool:
        floor = BUDGET.floors().handoff
        short = not BUDGET.free_at_least(floor)
        if short != self.short:
            self.short = short
            if short:
                log.warning("hand-off: fewer than %d fds free: not accepting nor reading "
                            "until there are", floor)
            else:
                log.info("hand-off: served again (fds free)")
        return short

    def session_open(self) -> bool:
        """A session is open (beside the listening fd): its expiry bounds the wait."""
        return len(self.fds) > 1

    def handle(self, fd: int, mask: int) -> None:
        self.server.handle(fd, (1 if mask & selectors.EVENT_READ else 0)
                           | (4 if mask & selectors.EVENT_WRITE else 0))
        BUDGET.stale()                       # a read may have brought FD_BATCH fds
        # a session it ended closed its fd: out of the selector now, before
        # anything can get that number again
        self.sync()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
