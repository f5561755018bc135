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

The server lives in the master, which must outlive every client (issue 19), so what a
client can make it hold is bounded:

* MAX_SESSIONS at a time; a connection beyond them is told "hand-off busy" and closed;
* a client sends no fds, ever: its channel gives the kernel no room for them, so any it
  passes are discarded before they reach our fd table, and its session is dropped;
* its messages are small (a pid, a list of names): a frame over MAX_MESSAGE is refused
  from its header, before its payload is read;
* its first message is due FIRST_MESSAGE_TIMEOUT after the accept, the whole hand-off
  HANDOFF_TIMEOUT after it; a message that is not the next step of the conversation ends
  the session (after an Error saying why).

And one takeover at a time: a request while another client holds the listeners offered
to it (under way), or while the client that confirmed is alive (done: it is starting, or
serves and will tell us to drain), is refused with an Error naming that client. A taker
that died without taking over frees the listeners for the next one.

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
FIRST_MESSAGE_TIMEOUT = 2.0    # a client sends its request right after connecting
MAX_SESSIONS = 2               # one takeover, and room to tell a second one why not
MAX_MESSAGE = 4096             # a client's messages are under 1 KiB
_ACCEPTS_PER_CALL = 64         # a connect flood must not hold the master's loop


class _Session:
    """One client: waiting for its request, then for its confirmation."""

    def __init__(self, channel: Channel, accepted: float, first_deadline: float, pid: int):
        self.channel = channel
        self.accepted = accepted
        self.deadline = first_deadline    # until its request arrives
        self.pid = pid                 # the client's, by SO_PEERCRED (not its own word)
        self.sent_names: list[str] | None = None


class _Taker:
    """The client that confirmed: alive, it holds the takeover (a pidfd, so a
    reused pid is never mistaken for it; kill(pid, 0) where there is none)."""

    def __init__(self, pid: int):
        self.pid = pid
        self._gone = False
        try:
            self._pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._pidfd = -1

    def alive(self) -> bool:
        if self._gone:
            return False
        if self._pidfd >= 0:
            # a pidfd polls readable once its process exited
            poller = select.poll()
            poller.register(self._pidfd, select.POLLIN)
            self._gone = bool(poller.poll(0))
        else:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self._gone = True
            except OSError:
                pass                      # alive, another user's (cannot be: same uid)
        if self._gone:
            self.close()
        return not self._gone

    def close(self) -> None:
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1


class HandoffServer:
    def __init__(self, path: str, listeners, on_handed_over=None,
                 session_timeout: float = HANDOFF_TIMEOUT, on_refused=None,
                 first_message_timeout: float = FIRST_MESSAGE_TIMEOUT,
                 max_sessions: int = MAX_SESSIONS):
        """listeners() returns the current [(ListenerDescriptor, fd)] to hand out (fds stay
        ours); on_handed_over(names, pid) runs once a client (process pid, by SO_PEERCRED)
        confirmed it holds them; on_refused(pid, why) once per client refused or dropped
        for what it did, for the owner's log."""
        self.path = path
        self.handed_over: set[str] = set()
        self.handed_to = 0             # the pid of the last client that confirmed
        self._listeners = listeners
        self._on_handed_over = on_handed_over
        self._on_refused = on_refused
        self._session_timeout = session_timeout
        self._first_timeout = min(first_message_timeout, session_timeout)
        self._max_sessions = max_sessions
        self._sessions: dict[int, _Session] = {}
        self._taker: _Taker | None = None
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
                while fd in self._sessions \
                        and (received := session.channel.next_message()) is not None:
                    self._on_message(session, received)
        except (IPCError, OSError) as exc:
            # A client that breaks the protocol or leaves loses its session, nothing more.
            # (Whatever it sends gets here: messages.decode() raises only MessageError.)
            self._end(fd)
            if not isinstance(exc, ConnectionError):      # leaving is no misdeed
                self._refused(session.pid, f"session dropped: {exc}")
        except BaseException:
            # Not the client's doing: a bug of ours or of the owner's callbacks. The
            # session's fds are closed all the same, then the owner gets to see it.
            self._end(fd)
            raise

    def expire(self, now: float | None = None) -> None:
        """Drop sessions past their deadline (a client that connected and went silent)."""
        now = time.monotonic() if now is None else now
        for fd in [fd for fd, s in self._sessions.items() if s.deadline < now]:
            session = self._sessions[fd]
            self._end(fd)
            if session.sent_names is None:
                self._refused(session.pid, f"session dropped: no request within "
                                           f"{self._first_timeout:g}s of connecting")

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
        if self._taker is not None:
            self._taker.close()
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
        for _ in range(_ACCEPTS_PER_CALL):     # poll() reports the rest again
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
                # what a client may send: small frames, no fds (see the top)
                channel = Channel(conn, max_frame_in=MAX_MESSAGE, takes_fds=False)
            except BaseException:
                conn.close()
                raise
            if len(self._sessions) >= self._max_sessions:
                why = (f"hand-off busy: {len(self._sessions)} sessions under way "
                       f"(at most {self._max_sessions}); try again")
                self._refuse(channel, why)
                self._refused(pid, why)
                continue
            now = time.monotonic()
            self._sessions[conn.fileno()] = _Session(channel, now, now + self._first_timeout,
                                                     pid)

    def _on_message(self, session: _Session, received) -> None:
        msg = received.msg
        received.close_fds()
        if isinstance(msg, HandoffRequest) and session.sent_names is None:
            busy = self._takeover_held()
            if busy:
                self._drop(session, busy)
                return
            pairs = list(self._listeners())
            session.sent_names = [desc.name for desc, _ in pairs]
            session.deadline = session.accepted + self._session_timeout
            session.channel.post(HandoffListeners([desc for desc, _ in pairs]),
                                 [fd for _, fd in pairs])
        elif isinstance(msg, HandoffConfirm) and session.sent_names is not None:
            if msg.names != session.sent_names:
                self._drop(session, f"confirmed {msg.names}, sent {session.sent_names}")
                return
            self.handed_over.update(msg.names)
            self.handed_to = session.pid
            if self._taker is not None:
                self._taker.close()
            self._taker = _Taker(session.pid)
            self._end(session.channel.fileno())
            if self._on_handed_over is not None:
                self._on_handed_over(list(msg.names), session.pid)
        else:
            self._drop(session, f"unexpected {type(msg).__struct_config__.tag} message")

    def _takeover_held(self) -> str:
        """Why no takeover may begin now ("": it may): one is under way, or done."""
        for other in self._sessions.values():
            if other.sent_names is not None:
                return (f"a takeover by pid {other.pid} is under way; one at a time "
                        "(take over from the instance that serves once it is done)")
        if self._taker is not None and self._taker.alive():
            return (f"the listeners were handed over to pid {self._taker.pid} already; "
                    "take over from that instance (its own hand-off socket) once it serves")
        return ""

    def _drop(self, session: _Session, why: str) -> None:
        """Tell the client why, and end its session."""
        self._sessions.pop(session.channel.fileno(), None)   # (-1 once closed)
        self._refuse(session.channel, why)
        self._refused(session.pid, why)

    @staticmethod
    def _refuse(channel: Channel, why: str) -> None:
        """Error(why) if the socket takes it now (it is small: a fresh socket's buffer
        does), then close: nothing waits on a client we refuse."""
        try:
            channel.post(Error(why))
        except (IPCError, OSError):
            pass
        finally:
            channel.close()

    def _refused(self, pid: int, why: str) -> None:
        if self._on_refused is not None:
            self._on_refused(pid, why)

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
            # A server that refused us may have closed before our request went out: its
            # Error is what to say, not the EPIPE
            if why := _refusal(channel):
                raise HandoffError(f"hand-off from {path} refused: {why}") from None
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


def _refusal(channel: Channel) -> str:
    """The Error message the server sent before closing, if one is waiting."""
    try:
        got = channel.next_message()
    except IPCError:
        return ""
    if got is None:
        return ""
    got.close_fds()
    return got.msg.message if isinstance(got.msg, Error) else ""
