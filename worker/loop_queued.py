"""A drain's queued connections: what waits on a deleted listener's
backlog is accepted (from a dup kept until the delete is complete) and
handed to a loop thread, or refused with a 503 at the drain's deadline,
so none is stranded behind a slow handler or reset by the worker's exit.
drain() (loop_drain.py) starts it; a loop thread that ends (loop_turn.py)
passes its posted connections on. Calls loop_accept.py (_register) and
loop_core.py only.
"""
from __future__ import annotations

import email.utils
import os
import select
import socket
import time

from sockherd.worker.loop_accept import LoopAccept
from sockherd.worker.loop_core import log


class LoopQueued(LoopAccept):
    """The deleted listeners' stragglers and the posted connections."""

    def _take_queued(self) -> None:
        """drain()'s thread (the main one, whatever the loop threads are
        doing): what is queued on the deleted listeners is accepted now and
        each dup closed, so from here on new connections are refused, not
        queued behind a slow handler and served late or reset at the
        worker's exit (review, TERM with the only loop thread in a 3 s
        handler). Each accepted fd goes to a loop thread that is not in app
        code if there is one (served at once), else to the first, which
        serves it once its handler returns. A listener whose delete is
        deferred has a loop thread inside it, accepting: its own drain step
        empties it (_accept_stragglers). With no loop thread left, nothing
        is taken: the queue is the other workers' to serve (taken here, each
        was only refused at our exit)."""
        if not self.threads_alive:
            while self._stragglers:
                os.close(self._stragglers.pop()[0])
            return
        self._empty_queued(self._post_accepted)

    def _post_accepted(self, fd: int) -> None:
        """fd to a live loop thread's mail: one not in app code if there is
        one. Under _posted_lock, so a thread that ends meanwhile (_ended,
        same lock) either is not chosen or finds the fd in its mail and
        passes it on; with no thread left it stays in _posted for
        refuse_posted."""
        with self._posted_lock:
            self._posted[fd] = time.monotonic()   # not drained until it is adopted
            me = self._mail_posted(fd)
        if me is not None:
            self.table.wake(self.loop_threads[me].tid)

    def _mail_posted(self, fd: int) -> int | None:
        """Under _posted_lock, fd in _posted: its adoption into a live loop
        thread's mail; that thread's position, or None if none is left."""
        alive = [i for i in range(len(self.loop_threads)) if i not in self.ended]
        if not alive:
            return None
        me = next((i for i in alive if not self.relief.busy[i]), alive[0])
        self._mail[me].append((self._adopt_posted, (me, fd)))
        return me

    def _adopt_posted(self, me: int, fd: int) -> None:
        """_take_queued's connection, on loop thread `me` (its mail), unless
        refuse_posted took it first."""
        with self._posted_lock:
            if fd not in self._posted:
                return                       # refused at the drain's deadline
            del self._posted[fd]
            self._adopting += 1              # still counted until it is in conns
        try:
            self._adopt_accepted(self.loop_threads[me], me, fd)
        finally:
            with self._posted_lock:
                self._adopting -= 1

    def posted_due(self, wait: float) -> float | None:
        """When the oldest connection _take_queued posted will have waited
        `wait` seconds for a loop thread (monotonic), or None: none waits."""
        with self._posted_lock:
            return min(self._posted.values()) + wait if self._posted else None

    def refuse_posted(self, linger: float = 0.5, waited: float = 0.0) -> int:
        """The main thread: connections _take_queued accepted that no loop
        thread got to in `waited` seconds (each was busy in the app) are
        refused rather than held behind a slow handler or reset by our
        exit: an HTTP interface's client gets a 503 (Connection: close)
        after its unread input is read, then a FIN; a stream client, and
        a client of a TLS listener, gets the FIN alone. With waited 0 (the
        drain's deadline, or no loop thread left): all of them. Returns how
        many."""
        now = time.monotonic()
        with self._posted_lock:
            fds = [fd for fd, at in self._posted.items() if now - at >= waited]
            for fd in fds:
                del self._posted[fd]
        if not fds:
            return 0
        # a Date as on every response the engine makes itself (RFC 9110 6.6.1)
        date = email.utils.formatdate(usegmt=True).encode()
        answer = (b"HTTP/1.1 503 Service Unavailable\r\nDate: " + date + b"\r\n"
                  b"Content-Type: text/plain\r\nContent-Length: 34\r\nConnection: close\r\n\r\n"
                  b"503 Service Unavailable: stopping\n") if self.engine is not None else b""
        socks = []
        for fd in fds:
            # a TLS client is closed without a byte: a 503 in clear would be
            # a garbled handshake to it (nginx and HAProxy close too)
            tls = fd in self._tls_accepted
            self._tls_accepted.discard(fd)
            s = socket.socket(fileno=fd)
            s.setblocking(False)
            try:
                while s.recv(65536):         # the request it sent: a close with
                    pass                     # unread input would be a reset
            except OSError:
                pass
            try:
                if not tls:
                    s.send(answer)
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            socks.append(s)
        end = time.monotonic() + linger      # what it sends meanwhile, read too
        while socks and time.monotonic() < end:
            ready, _, _ = select.select(socks, [], [], max(0.0, end - time.monotonic()))
            for s in ready:
                try:
                    if s.recv(65536):
                        continue
                except OSError:
                    pass
                socks.remove(s)
                s.close()
        for s in socks:
            s.close()
        log.warning("drain: refused %d queued connection(s) no loop thread got to%s", len(fds),
                    f" in {waited:g} s" if waited else "")
        return len(fds)

    def _accept_stragglers(self, th, me: int) -> int:
        """A draining thread's part of _delete_listeners(drain=True): once no
        poller of ours can take a deleted listener's wake-ups (_unpolled),
        new connections wake the other workers' pollers; what is queued now
        came before, and is taken and served here (Connection: close).
        Returns a poll timeout (ms) while one is still polled, else -1."""
        deferred = self._empty_queued(lambda fd: self._adopt_accepted(th, me, fd))
        return 10 if deferred else -1

    def _empty_queued(self, adopt) -> bool:
        """Accepts what is queued on each deleted listener that no poller of
        ours can take a wake-up of any more (_unpolled; adopt(fd) each),
        closing its dup; True if some is still polled (its straggler kept
        for later)."""
        later, taken = [], 0
        while self._stragglers:
            try:
                dup, fd, gen = self._stragglers.pop()
            except IndexError:
                break                       # another thread took the last one
            if not self._unpolled(fd, gen):
                later.append((dup, fd, gen))
                continue
            try:
                while True:
                    try:
                        conn, _ = _accept_raw(dup)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError as exc:
                        log.warning("emptying a deleted listener: %s", exc.strerror)
                        break
                    taken += 1
                    if self._tls and fd not in self.plain_listeners:
                        self._tls_accepted.add(conn)
                    adopt(conn)
            finally:
                os.close(dup)
        self._stragglers.extend(later)
        if taken:
            log.info("drain: took %d connection(s) queued on a deleted listener", taken)
        return bool(later)

    def _unpolled(self, fd: int, gen: int) -> bool:
        """Whether no poller of ours can take the wake-up of a connection
        queued on deleted listener fd (incarnation gen) any more: its delete
        is complete (released), or the only threads still registered are
        inside it (running: the delete is deferred to them). Such a thread
        never waits in epoll before leaving it, and the last one to leave
        closes it, so the kernel hands new connections to other workers.
        Waiting for released alone stranded a connection (review, `--threads 2`,
        one thread stuck in app code it reached from the accept): the idle
        sibling's EXCLUSIVE registration outlived the delete, took the next
        connection's wake-up, found the listener no longer its own and
        dropped it, and nobody accepted the connection until the stuck
        call ended (tests/master/test_drain_never_strands_a_queued_connection.py)."""
        if self.table.released(fd, gen):
            return True
        info = self.table.dump(fd)
        return info.generation != gen or not info.polled_recv & ~info.running_mask

    def _adopt_accepted(self, th, me: int, fd: int) -> None:
        """A connection accepted outside fdcore's accept, made ours."""
        tls = fd in self._tls_accepted
        self._tls_accepted.discard(fd)
        if self.engine is not None:
            self.engine.take(me, fd, not tls)
            self.gate.publish()
            return
        conn = self._register(th, fd)
        if conn is not None:
            conn.connect()


def _accept_raw(lfd: int) -> tuple[int, None]:
    """One non-blocking accept on a listener fd we do not own as a socket
    object: (new fd, close-on-exec and non-blocking, None)."""
    s = socket.socket(fileno=lfd)
    try:
        s.setblocking(False)
        conn, _ = s.accept()
    finally:
        s.detach()
    conn.setblocking(False)
    return conn.detach(), None
