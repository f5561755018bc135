"""Live listener transfer from a running instance (`sockherd run --takeover <path>`).

The running master serves a plain AF_UNIX stream socket (ZeroMQ cannot carry fds) in its
runtime directory, mode 0600 and, belt and braces, only for peers of our own uid
(SO_PEERCRED). The conversation is three messages on a Channel:

    new  -> old   HandoffRequest(pid)
    old  -> new   HandoffListeners(descriptors) + the listener fds (batched by the channel)
    new  -> old   HandoffConfirm(names)      once every fd was checked against its descriptor

Only after the confirmation does the old instance mark the listeners as handed over (and
tell its owner through on_handed_over): a new instance that died half-way must leave the
old one serving as if nothing happened. The old instance keeps its own copies open; when
to stop accepting on them is its master's decision.

The server is non-blocking and driven by the master's poll loop (poll_fds() / handle());
serve() is a small loop of its own for callers without one.
"""

import os
import select
import socket
import struct
import time

from .channel import Channel
from .errors import HandoffError, IPCError, ListenerMismatch
from .listeners import adopt
from .messages import Error, HandoffConfirm, HandoffListeners, HandoffRequest

_UCRED = struct.Struct("3i")
# How long a whole hand-off may take: the client's budget from its connect,
# and the server's session lifetime from its accept, so a session never
# holds copies of the listeners (the fd batches still owed) past the point
# where its client gave up, nor for a stalled one that never reads or closes
HANDOFF_TIMEOUT = 10.0


class _Session:
    """One client: waiting for its request, then for its confirmation."""

    def __init__(self, channel: Channel, deadline: float, pid: int):
        self.channel = channel
        self.deadline = deadline
        self.pid = pid                 # the client's, by SO_PEERCRED (not its own word)
        self.sent_names: list[str] | None = None


class HandoffServer:
    def __init__(self, path: str, listeners, on_handed_over=None,
                 session_timeout: float = HANDOFF_TIMEOUT):
        """listeners() returns the current [(ListenerDescriptor, fd)] to hand out (fds stay
        ours); on_handed_over(names, pid) runs once a client (process pid, by SO_PEERCRED)
        confirmed it holds them."""
        self.path = path
        self.handed_over: set[str] = set()
        self.handed_to = 0             # the pid of the last client that confirmed
        self._listeners = listeners
        self._on_handed_over = on_handed_over
        self._session_timeout = session_timeout
        self._sessions: dict[int, _Session] = {}
        self._sock = _bind_private(path)
        self._inode = os.stat(path).st_ino

    def fileno(self) -> int:
        return self._sock.fileno()

    def poll_fds(self) -> list[tuple[int, int]]:
        """(fd, poll mask) for the master's poller: the server socket and every session."""
        fds = [(self._sock.fileno(), select.POLLIN)]
        for fd, session in self._sessions.items():
            mask = select.POLLIN | (select.POLLOUT if session.channel.wants_write else 0)
            fds.append((fd, mask))
        return fds

    def handle(self, fd: int, revents: int) -> None:
        """React to poll() readiness of one of poll_fds(); never raises for a bad client."""
        if fd == self._sock.fileno():
            self._accept()
            return
        session = self._sessions.get(fd)
        if session is None:
            return
        try:
            if revents & select.POLLOUT:
                session.channel.flush()
            if revents & (select.POLLIN | select.POLLHUP | select.POLLERR):
                session.channel.read_available()
                while (received := session.channel.next_message()) is not None:
                    self._on_message(session, received)
        except (IPCError, OSError):
            # A client that breaks the protocol or leaves loses its session, nothing more.
            # (Whatever it sends gets here: messages.decode() raises only MessageError.)
            self._end(fd)
        except BaseException:
            # Not the client's doing: a bug of ours or of the owner's callbacks. The
            # session's fds are closed all the same, then the owner gets to see it.
            self._end(fd)
            raise

    def expire(self, now: float | None = None) -> None:
        """Drop sessions past their deadline (a client that connected and went silent)."""
        now = time.monotonic() if now is None else now
        for fd in [fd for fd, s in self._sessions.items() if s.deadline < now]:
            self._end(fd)

    def serve(self, timeout: float, until=lambda: False, tick: float = 0.05) -> None:
        """Run the server by itself until until() is true or timeout seconds passed."""
        deadline = time.monotonic() + timeout
        while not until() and time.monotonic() < deadline:
            poller = select.poll()
            for fd, mask in self.poll_fds():
                poller.register(fd, mask)
            for fd, revents in poller.poll(tick * 1000):
                self.handle(fd, revents)
            self.expire()

    def close(self) -> None:
        for fd in list(self._sessions):
            self._end(fd)
        self._sock.close()
        # Unlink only our own socket file: a successor may have bound the path since.
        try:
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except BlockingIOError:
                return
            except ConnectionAbortedError:
                continue              # that client left before we got to it
            except OSError:
                # EMFILE, ENFILE, ENOBUFS...: the connection waits in the backlog and
                # poll() reports it again; the serve loop must not die of it.
                return
            try:
                pid, uid, _ = _UCRED.unpack(conn.getsockopt(
                    socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
                if uid != os.getuid():
                    conn.close()
                    continue
                channel = Channel(conn)
            except BaseException:
                conn.close()
                raise
            self._sessions[conn.fileno()] = _Session(
                channel, time.monotonic() + self._session_timeout, pid)

    def _on_message(self, session: _Session, received) -> None:
        msg = received.msg
        received.close_fds()
        if isinstance(msg, HandoffRequest) and session.sent_names is None:
            pairs = list(self._listeners())
            session.sent_names = [desc.name for desc, _ in pairs]
            session.channel.post(HandoffListeners([desc for desc, _ in pairs]),
                                 [fd for _, fd in pairs])
        elif isinstance(msg, HandoffConfirm) and session.sent_names is not None:
            if msg.names != session.sent_names:
                session.channel.post(Error(f"confirmed {msg.names}, sent {session.sent_names}"))
                return
            self.handed_over.update(msg.names)
            self.handed_to = session.pid
            if self._on_handed_over is not None:
                self._on_handed_over(list(msg.names), session.pid)
            self._end(session.channel.fileno())
        else:
            session.channel.post(Error(f"unexpected {type(msg).__struct_config__.tag} message"))

    def _end(self, fd: int) -> None:
        session = self._sessions.pop(fd, None)
        if session is not None:
            session.channel.close()


def _bind_private(path: str) -> socket.socket:
    """Listening socket at path, mode 0600 from the first instant it is reachable: bind
    under a temporary name, chmod, then rename() over path (atomic, and it replaces a
    stale socket file left by a crashed instance)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        sock.bind(tmp)
        os.chmod(tmp, 0o600)
        sock.listen(16)
        sock.setblocking(False)
        os.rename(tmp, path)
    except BaseException:
        sock.close()
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return sock


def fetch_listeners(path: str, timeout: float = HANDOFF_TIMEOUT) -> list[tuple]:
    """Ask the instance serving `path` for its listeners: [(ListenerDescriptor, socket)].
    Every socket is checked against its descriptor; on any failure nothing stays open."""
    return fetch_listeners_from(path, timeout)[0]


def fetch_listeners_from(path: str,
                         timeout: float = HANDOFF_TIMEOUT) -> tuple[list[tuple], int]:
    """fetch_listeners(), and the pid of the process that served them (its
    SO_PEERCRED): the instance a takeover tells to drain once it serves."""
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    try:
        channel = Channel.connect(path, timeout)
    except OSError as exc:
        raise HandoffError(f"cannot connect to {path}: {exc.strerror or exc}") from None
    with channel:
        try:
            peer, _, _ = _UCRED.unpack(channel.socket.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        except (AttributeError, OSError):
            peer = 0
        try:
            channel.send(HandoffRequest(os.getpid()), timeout=left())
            received = channel.recv(timeout=left())
        except (IPCError, OSError) as exc:
            # Any bad reply is one of our IPCErrors (its fds already closed); the channel
            # closes whatever else it holds on the way out of the with block.
            raise HandoffError(f"hand-off from {path} failed: {exc}") from None
        msg = received.msg
        if not isinstance(msg, HandoffListeners):
            received.close_fds()
            detail = msg.message if isinstance(msg, Error) else type(msg).__struct_config__.tag
            raise HandoffError(f"hand-off from {path} refused: {detail}")
        try:
            sockets = adopt(msg.listeners, received.fds)
        except ListenerMismatch as exc:
            raise HandoffError(f"hand-off from {path}: {exc}") from None
        try:
            channel.send(HandoffConfirm([d.name for d in msg.listeners]), timeout=left())
        except BaseException as exc:
            for sock in sockets:
                sock.close()
            if isinstance(exc, (IPCError, OSError)):
                raise HandoffError(f"hand-off from {path} failed: {exc}") from None
            raise
        return list(zip(msg.listeners, sockets)), peer
