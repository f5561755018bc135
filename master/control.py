"""The master's control channel: a ZeroMQ ROUTER for `sockherd ctl`, a PUB
for the event stream, both living in the master's own loop (no thread).

Where: `ipc://RUNTIME_DIR/control` and `ipc://RUNTIME_DIR/events` by
default, the directory created 0700 and owned by us (refused otherwise),
the sockets 0600: only our user reaches them (circus's unauthenticated
endpoint is what not to do). A `tcp://` control endpoint is accepted only
with CURVE keys: the server's key pair and a directory of the clients'
public keys, checked by a ZAP authenticator driven from the same loop; an
unauthorised client's handshake fails and it gets nothing. Without the keys
the master refuses to start with that endpoint.

A bound ipc path that answers belongs to another running master: we do not
steal it (ZeroMQ would silently unlink and rebind); a stale one (nothing
listening: a crash, or our own previous image across an upgrade's exec) is
replaced. A takeover's new instance finds the old one's endpoint live and
binds it once the old instance is gone (retried every second). Any other
master finding it live refuses to start, before it binds anything
(check_free): two masters of one user with default settings would share one
endpoint, and `sockherd ctl` would silently talk to the first (review).

Requests (ipc/control.py) go to master/commands: one module per command.
A command may answer later (reload, upgrade: when the new generation is
READY or refused); its Responder says where the reply goes.
"""
from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import stat
import tempfile
import time

import zmq

from sockherd.ipc import control as proto
from sockherd.master.addresses import UNIX_PATH_MAX

log = logging.getLogger("sockherd.master")

RETRY = 1.0                  # a live ipc path held by another master: try again after
BATCH = 64                   # requests read per wake-up: signals and timers come between
LOG_EVERY = 60.0             # seconds between two lines about refused requests
# replies queued for one client: one that never reads pins this many at most,
# the newer ones are dropped (a `sockherd ctl` waits for its one reply). Not
# fewer: a burst of replies sent in one turn of the loop (deferred `show
# proc`s answered together) goes through this queue before libzmq's I/O
# thread writes it out, and 16 lost some of 20 to a client that did read
REPLY_HWM = 128
REQUEST_HWM = BATCH          # requests queued per client before libzmq stops reading it
EVENTS_HWM = 1000            # events queued per subscriber (a few hundred bytes each)
SUBSCRIPTION_MAX = 4096      # bytes of one message a subscriber sends us (its topic)


def runtime_dir(values, addresses=()) -> str:
    """The runtime directory the settings (a Settings or its dict) name:
    runtime_dir, else this master's own directory in the default place
    (instance_key), so that masters of other apps never share one."""
    return _get(values, "runtime_dir") or os.path.join(default_runtime_dirs()[0],
                                                       instance_key(values, addresses))


def instance_key(values, addresses=()) -> str:
    """The name of a master's own runtime directory: proc_name, else its
    bind addresses, else (no bind, or only fd:// and systemd: entries: the
    sockets systemd passed) the addresses of the sockets it serves, as a
    file name (issue 36 review: two socket-activated apps were one key). What cannot be one (a `/` of a unix
    path, a `:` ZeroMQ would read) becomes `_`, and then a hash of the
    whole keeps two names apart that differ only there. The same settings
    give the same key: a takeover's new instance finds the old one's
    endpoint (and waits for it), a second master of one app is refused."""
    import hashlib
    import re

    binds = list(_get(values, "bind") or ())
    if addresses and all(b.startswith(("fd://", "systemd:")) for b in binds):
        binds = [str(a) for a in addresses]
    name = _get(values, "proc_name") or "+".join(binds) or "master"
    safe = re.sub(r"[^A-Za-z0-9._+-]", "_", name)[:32]    # a socket path's room is 107 bytes
    if safe != name or safe.startswith("."):
        safe = f"{safe}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return safe


def default_runtime_dirs() -> list[str]:
    """Where a master without a runtime_dir puts its control sockets, the
    first the one it uses here; the others are where one started in another
    environment (systemd as root, a shell without XDG_RUNTIME_DIR) has them:
    `sockherd ctl` looks there when the first has nobody (master/ctl.py)."""
    out = []
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        out.append(os.path.join(xdg, "sockherd"))
    if os.geteuid() == 0:
        out.append("/run/sockherd")
    out.append(os.path.join(tempfile.gettempdir(), f"sockherd-{os.getuid()}"))
    return out


def masters(dirs: list[str]) -> list[str]:
    """The live control endpoints in dirs: DIR/control (a master whose
    runtime_dir is DIR) and DIR/*/control (the default place's own
    directories), in that order. Masters elsewhere (an explicit
    --runtime-dir) are elsewhere()'s: listed and named, never picked. A socket nobody listens on (its master
    exited without removing it: killed) is removed with its events socket,
    if it is ours and still the same file after the probe."""
    found = []
    for d in dirs:
        try:
            subs = sorted(e.name for e in os.scandir(d) if e.is_dir(follow_symlinks=False))
        except OSError:
            subs = []
        for path in [os.path.join(d, "control")] + [os.path.join(d, n, "control")
                                                    for n in subs]:
            try:
                before = os.lstat(path)
            except OSError:
                if reexecuting(path):               # an upgrade's re-exec: soon again
                    found.append(f"ipc://{path}")
                continue
            if not stat.S_ISSOCK(before.st_mode):
                continue
            if _live(path) or reexecuting(path):
                found.append(f"ipc://{path}")
            elif before.st_uid == os.geteuid():
                _remove_stale(path, before)
    return found


def _remove_stale(path: str, before: os.stat_result) -> None:
    """Unlinks a dead control socket and its events socket, unless the
    file changed since it was probed (a master binding it meanwhile)."""
    try:
        now = os.lstat(path)
        if (now.st_ino, now.st_dev) != (before.st_ino, before.st_dev):
            return
        os.unlink(path)
        where = os.path.dirname(path)
        _unmark_reexec(path)                     # one of a master that died re-executing
        events = os.path.join(where, "events")
        if os.path.exists(events) and not _live(events):
            os.unlink(events)
        if os.path.dirname(where) in default_runtime_dirs():
            os.rmdir(where)              # a master's own directory, empty now
    except OSError:
        pass


REEXEC = "reexec"            # beside the control socket while its master re-executes


def _mark_reexec(control_path: str) -> None:
    try:
        with open(os.path.join(os.path.dirname(control_path), REEXEC), "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        pass


def _unmark_reexec(control_path: str) -> None:
    try:
        os.unlink(os.path.join(os.path.dirname(control_path), REEXEC))
    except OSError:
        pass


def reexecuting(control_path: str) -> bool:
    """Whether the master of the control socket at control_path is in an
    upgrade's re-exec (its endpoint closed until the new image binds it):
    its REEXEC file names a process that runs."""
    try:
        with open(os.path.join(os.path.dirname(control_path), REEXEC)) as f:
            pid = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_endpoint(endpoint: str, wait: float = 0.0) -> bool:
    """Whether an ipc:// endpoint has a master listening (tcp: assumed);
    one re-executing (an upgrade) is waited for, up to `wait` seconds."""
    if not endpoint.startswith("ipc://"):
        return True
    path = endpoint[len("ipc://"):]
    deadline = time.monotonic() + wait
    while not _live(path):
        if not reexecuting(path) or time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def endpoint_of(values, addresses=()) -> str | None:
    """The control endpoint of settings (a Settings or its dict); None: off."""
    chosen = _get(values, "control")
    if chosen == "off":
        return None
    return chosen or f"ipc://{os.path.join(runtime_dir(values, addresses), 'control')}"


def events_endpoint(control: str) -> str:
    """The PUB endpoint beside a control endpoint: ipc://DIR/events, or the
    tcp port after the control one."""
    if control.startswith("ipc://"):
        return f"ipc://{os.path.join(os.path.dirname(control[6:]), 'events')}"
    host, _, port = control.rpartition(":")
    return f"{host}:{int(port) + 1}"


def check_length(endpoint: str) -> None:
    """ValueError naming the way out if an ipc:// path cannot be a unix
    socket's (sun_path): connect() to it fails with no errno, which the
    liveness probe took for a live master (a misleading refusal)."""
    path = endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else ""
    if len(os.fsencode(path)) > UNIX_PATH_MAX:
        raise ValueError(f"control: {endpoint} is {len(os.fsencode(path))} bytes long, a unix "
                         f"socket path holds at most {UNIX_PATH_MAX}: give a shorter "
                         f"--runtime-dir DIR (or --control ENDPOINT, or --control off)")


def _get(values, key: str):
    return values.get(key, "") if isinstance(values, dict) else getattr(values, key, "")


def check_free(values, addresses=()) -> None:
    """OSError naming what to do if the control endpoint of the settings
    is an ipc path another running master serves (`sockherd run` without
    --takeover, before it binds its listeners; addresses: the sockets
    systemd passed, instance_key's)."""
    endpoint = endpoint_of(values, addresses)
    if endpoint is None or not endpoint.startswith("ipc://"):
        return                      # off, or tcp: a bind that fails says so itself
    for ep in (endpoint, events_endpoint(endpoint)):
        check_length(ep)
        if live_endpoint(ep):
            raise OSError(                  # an address in use, as a bind's would be
                f"control: {ep} is served by another running master; give this one its "
                f"own with --runtime-dir DIR (or --control ENDPOINT, or --control off), or "
                f"take that one's listeners over with --takeover")


class Responder:
    """Where one request's reply goes (exactly once); the server knows the
    ones still owed (an upgrade's exec answers them first)."""

    def __init__(self, server: "ControlServer", envelope: list[bytes]):
        self._server, self._envelope, self.done = server, envelope, False
        server.outstanding.add(self)

    def ok(self, result=None) -> None:
        self._send(proto.Reply(ok=True, result=result))

    def fail(self, error: str) -> None:
        self._send(proto.Reply(ok=False, error=error))

    def _send(self, reply: proto.Reply) -> None:
        if self.done:
            return
        self.done = True
        self._server.outstanding.discard(self)
        self._server.send(self._envelope, proto.encode(reply))


class ControlServer:
    def __init__(self, sup, endpoint: str):
        self.sup = sup
        self.endpoint = endpoint
        self.events_at = events_endpoint(endpoint)
        self.ctx = zmq.Context()
        self.router: zmq.Socket | None = None
        self.pub: zmq.Socket | None = None
        self.auth = None
        self._retry_at: float | None = None
        self._more = False                        # requests left after a BATCH
        self.outstanding: set[Responder] = set()
        self.monitors: list[zmq.Socket] = []      # control_guard.py's, on our sockets
        self._said_busy = False
        self._refusals, self._refusal_logged_at = 0, -LOG_EVERY
        self._curve = None
        if endpoint.startswith("tcp://"):
            self._curve = _curve_keys(sup.settings)
        elif not endpoint.startswith("ipc://"):
            raise ValueError(f"control endpoint {endpoint!r}: ipc://PATH or tcp://HOST:PORT")
        self._open()

    # ---- binding ---------------------------------------------------------------------------
    def _open(self) -> None:
        """Binds both sockets; a live ipc path of another master: retried."""
        if self.endpoint.startswith("ipc://"):
            # again at each try: the directory may have gone meanwhile (systemd
            # removes a stopped unit's RuntimeDirectory; review)
            where = os.path.dirname(self.endpoint[len("ipc://"):])
            if os.path.dirname(where) in default_runtime_dirs():
                _private_dir(os.path.dirname(where))     # the default place: 0700 too
            _private_dir(where)
            for ep in (self.endpoint, self.events_at):
                check_length(ep)
                if _live(ep[len("ipc://"):]):
                    if not self._said_busy:
                        log.warning("control: %s is served by another running master; "
                                    "bound once it is free", ep)
                        self._said_busy = True
                    self._retry_at = time.monotonic() + RETRY
                    return
        router = self.ctx.socket(zmq.ROUTER)
        pub = self.ctx.socket(zmq.PUB)
        try:
            for sock in (router, pub):
                sock.linger = 1000               # a reply sent just before stop or exec
            # a larger request gets an error reply (ipc/control.py); a frame
            # past MAX_MESSAGE: libzmq drops the connection on reading its
            # length, before any of it is held in memory (issue 19 §5)
            router.setsockopt(zmq.MAXMSGSIZE, proto.MAX_MESSAGE)
            router.sndhwm, router.rcvhwm = REPLY_HWM, REQUEST_HWM
            router.setsockopt(zmq.ROUTER_MANDATORY, 0)   # a full client's reply: dropped
            pub.setsockopt(zmq.MAXMSGSIZE, SUBSCRIPTION_MAX)
            pub.sndhwm = EVENTS_HWM
            if self._curve is not None:
                self._start_auth()
                for sock in (router, pub):
                    sock.curve_secretkey, sock.curve_publickey = self._curve
                    sock.curve_server = True
            router.bind(self.endpoint)
            pub.bind(self.events_at)
        except zmq.ZMQError as exc:
            router.close(0)
            pub.close(0)
            raise OSError(exc.errno, f"control endpoint {self.endpoint}: {exc.strerror}") \
                from None
        if self.endpoint.startswith("ipc://"):
            for ep in (self.endpoint, self.events_at):
                os.chmod(ep[len("ipc://"):], 0o600)
            _unmark_reexec(self.endpoint[len("ipc://"):])   # an upgrade's new image: here
        self.router, self.pub, self._retry_at = router, pub, None
        log.info("control: %s (events: %s)", self.endpoint, self.events_at)

    def _start_auth(self) -> None:
        from zmq.auth.base import Authenticator

        if self.auth is None:
            self.auth = Authenticator(self.ctx, log=logging.getLogger("sockherd.master.zap"))
            self.auth.start()
            self.auth.configure_curve(domain="*", location=_get(self.sup.settings,
                                                                "control_curve_clients"))

    # ---- the master's loop (Supervisor.add_extra) ------------------------------------------
    def fds(self) -> list[int]:
        return []                  # ZeroMQ's own fds, registered by _reregister()

    def next_deadline(self) -> float | None:
        if self._more:
            return time.monotonic()               # requests waiting: no sleep
        return self._retry_at

    def poll(self) -> None:
        if self._retry_at is not None and time.monotonic() >= self._retry_at:
            try:
                self._open()
            except (OSError, ValueError) as exc:  # never the master's end: next second
                log.error("%s; trying again in %gs", exc, RETRY)
                self._retry_at = time.monotonic() + RETRY
                return
            self._reregister()
        if self.auth is not None:
            while self.auth.zap_socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                _done_now(self.auth.handle_zap_message(self.auth.zap_socket.recv_multipart()))
        if self.router is None:
            return
        # a bounded batch: one client's flood must not hold signals, timers
        # and workers back (review); the rest is read on the next turn
        for _ in range(BATCH):
            if self.router is None or not self.router.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self._more = False
                return
            try:
                envelope, body, refusal = self._recv()
            except zmq.Again:
                break
            if refusal:
                self._refused(envelope, refusal)
            elif body is not None:
                self._on_request(envelope, body)
        self._more = self.router is not None and bool(
            self.router.getsockopt(zmq.EVENTS) & zmq.POLLIN)

    def _recv(self) -> tuple[list[bytes], bytes | None, str]:
        """One request: (its envelope, its last frame or None if it has
        none, "" or the refusal).
        Frames are read one at a time and only the identity and the first
        two after it are kept (libzmq hands us a message once its last frame
        is in, each frame at most MAX_MESSAGE): the envelope of a refused
        one is the identity and its first frame if that fits, so a reply
        never echoes more than 2 x 255 bytes (issue 19 §5)."""
        router = self.router
        envelope = [router.recv(zmq.NOBLOCK)]         # the identity: libzmq's, <= 255
        kept, count, largest = [], 0, 0
        more = router.getsockopt(zmq.RCVMORE)
        while more:
            part = router.recv(copy=False)
            more = router.getsockopt(zmq.RCVMORE)
            count += 1
            if count <= 2:
                kept.append(part)
            if more:
                largest = max(largest, len(part))    # an envelope frame's size
        first_fits = len(kept) == 2 and len(kept[0]) <= proto.MAX_ENVELOPE_FRAME
        if first_fits:
            envelope.append(kept[0].bytes)
        if count > 2 or (count == 2 and not first_fits):
            return envelope, b"", proto.bad_envelope(count, largest)
        if not kept:
            return envelope, None, ""                 # the identity alone: nothing to answer
        body = kept[-1]
        if len(body) > proto.MAX_REQUEST:
            return envelope, b"", proto.too_large(len(body))
        return envelope, body.bytes, ""

    def _reregister(self) -> None:
        """The selector watches the ZeroMQ fds (edge-triggered: poll() reads
        all there is every time the master wakes)."""
        for fd in self._zmq_fds():
            try:
                self.sup.sel.register(fd, selectors.EVENT_READ, ("extra", fd))
            except KeyError:
                pass                                  # registered already

    def _refused(self, envelope: list[bytes], why: str) -> None:
        """A request of the wrong shape or size: its error reply, and a log
        line (one a minute at most: a client looping on it must not fill
        the log)."""
        Responder(self, envelope).fail(why)
        self._refusals += 1
        now = time.monotonic()
        if now >= self._refusal_logged_at + LOG_EVERY:
            log.warning("control: refused %d request(s) since the last such line; the "
                        "latest: %s", self._refusals, why)
            self._refusals, self._refusal_logged_at = 0, now

    def _on_request(self, envelope: list[bytes], frame: bytes) -> None:
        from sockherd.master import commands

        r = Responder(self, envelope)
        try:
            req = proto.decode_request(frame)
        except proto.ProtocolError as exc:
            r.fail(str(exc))
            return
        commands.dispatch(self.sup, req, r)

    def send(self, envelope: list[bytes], frame: bytes) -> None:
        if self.router is None:
            return
        try:
            self.router.send_multipart(envelope + [frame], zmq.NOBLOCK)
        except zmq.ZMQError as exc:               # the client is gone: its loss
            log.debug("control: reply not sent: %s", exc)

    def publish(self, event: dict) -> None:
        if self.pub is None:
            return
        try:
            self.pub.send(proto.EVENT_TOPIC + proto.encode(event), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass                                  # no subscriber keeping up: dropped

    # ---- an upgrade's exec ---------------------------------------------------------------
    def before_exec(self) -> None:
        """The reply to `upgrade` must leave before the exec ends this
        image, and so must every other one owed (a deferred `show proc`) or
        still unread: each gets "ask again" (review: they never got any).
        Then the sockets are closed and the context terminated, which waits
        for what they still send (up to their linger, 1 s). The endpoint's
        directory says meanwhile that we re-execute (REEXEC: our pid), so
        that `sockherd ctl` waits for the new image's endpoint instead of
        saying "no master running" (issue 36 review); the new image's
        _open removes it."""
        if self.endpoint.startswith("ipc://"):
            _mark_reexec(self.endpoint[len("ipc://"):])
        why = proto.REEXECUTING
        for r in list(self.outstanding):
            r.fail(why)
        while self.router is not None and self.router.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            try:
                envelope, body, refusal = self._recv()
            except zmq.Again:
                break
            if refusal or body is not None:
                Responder(self, envelope).fail(why)
        self._close_sockets()
        self.ctx.term()

    def exec_failed(self) -> None:
        self.ctx = zmq.Context()
        self._open()
        self._reregister()

    def _close_sockets(self) -> None:
        for fd in self._zmq_fds():
            try:
                self.sup.sel.unregister(fd)
            except (KeyError, ValueError):
                pass
        for mon in self.monitors:                 # before the context's term() waits on them
            try:
                self.sup.sel.unregister(mon.getsockopt(zmq.FD))
            except (KeyError, ValueError, zmq.ZMQError):
                pass
            mon.close(0)
        self.monitors = []
        for sock in (self.router, self.pub):
            if sock is not None:
                sock.close(linger=1000)
        self.router = self.pub = None
        if self.auth is not None:
            self.auth.stop()
            self.auth = None

    def _zmq_fds(self) -> list[int]:
        out = []
        for sock in [self.router] + ([self.auth.zap_socket] if self.auth else []):
            if sock is not None:
                try:
                    out.append(sock.getsockopt(zmq.FD))
                except zmq.ZMQError:
                    pass
        return out

    def close(self) -> None:
        self._close_sockets()
        self.ctx.term()
        if self.endpoint.startswith("ipc://"):
            where = os.path.dirname(self.endpoint[len("ipc://"):])
            if os.path.dirname(where) in default_runtime_dirs():
                try:
                    os.rmdir(where)      # our own directory of the default place, if empty
                except OSError:
                    pass


def _done_now(coro) -> None:
    """Runs pyzmq's ZAP handler (a coroutine, for async key callbacks) to
    its end: with keys from a directory it never waits on anything."""
    try:
        coro.send(None)
    except StopIteration:
        return
    coro.close()
    raise RuntimeError("the ZAP handler waited on something: not supported here")


def _private_dir(path: str) -> None:
    """The runtime directory: created 0700, or an existing one that is ours
    (tightened to 0700); anybody else's is refused (ValueError)."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        raise ValueError(f"control: runtime directory {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"control: runtime directory {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise ValueError(f"control: runtime directory {path} belongs to uid {st.st_uid}, "
                         f"not to us ({os.geteuid()})")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)


_ACCEPTCON = 0x10000              # /proc/net/unix's Flags of a listening socket


def _listening_paths() -> set[bytes]:
    """The paths of this network namespace's listening unix sockets
    (/proc/net/unix), read once."""
    out = set()
    try:
        with open("/proc/net/unix", "rb") as f:
            next(f, None)
            for line in f:
                cols = line.split(None, 7)
                if len(cols) == 8 and int(cols[3], 16) & _ACCEPTCON:
                    out.add(cols[7].rstrip(b"\n"))
    except (OSError, ValueError):
        pass
    return out


def elsewhere(known: list[str]) -> list[str]:
    """Live masters outside the default places (an explicit runtime_dir):
    a listening socket named `control` with a listening `events` beside
    it (what every master binds) that this user can reach, not among
    known. Found in /proc/net/unix, so without a connection."""
    listening = _listening_paths()
    found = []
    for raw in sorted(listening):
        if not raw.endswith(b"/control") or raw[:-len(b"control")] + b"events" not in listening:
            continue
        path = os.fsdecode(raw)
        endpoint = f"ipc://{path}"
        if endpoint in known:
            continue
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                found.append(endpoint)
        except OSError:
            continue                       # another user's (its dir is 0700), or gone
    return found


def _listed(path: str) -> bool:
    """Whether this network namespace's /proc/net/unix lists a listening
    socket bound at path: asked without connecting, so a master whose fd
    table is full gets no connection to accept (a probe's connection in
    its backlog made libzmq's accept meet EMFILE: ctl under the fd squeeze
    went unanswered, CI)."""
    want = os.fsencode(path)
    try:
        with open("/proc/net/unix", "rb") as f:
            next(f, None)
            for line in f:
                cols = line.split(None, 7)
                if len(cols) == 8 and cols[7].rstrip(b"\n") == want and \
                        int(cols[3], 16) & _ACCEPTCON:
                    return True
    except (OSError, ValueError):
        pass
    return False


def _live(path: str) -> bool:
    """Whether a unix socket at path has somebody listening: listed so in
    /proc/net/unix, else a connect() that is not refused (a master in
    another network namespace, sharing the path, is not listed here)."""
    if _listed(path):
        return True
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError as exc:
            return exc.errno not in (errno.ECONNREFUSED, errno.ENOENT)
    return True


def _curve_keys(settings) -> tuple[bytes, bytes]:
    """(secret, public) of the server's certificate; ValueError if a tcp
    endpoint lacks its keys."""
    import zmq.auth

    secret_file = _get(settings, "control_curve_secret")
    clients = _get(settings, "control_curve_clients")
    if not secret_file or not clients:
        raise ValueError("control: a tcp:// endpoint needs control_curve_secret and "
                         "control_curve_clients (CURVE keys); refusing to start without them")
    if not os.path.isdir(clients):
        raise ValueError(f"control_curve_clients {clients!r}: not a directory")
    try:
        public, secret = zmq.auth.load_certificate(secret_file)
    except (OSError, ValueError) as exc:
        raise ValueError(f"control_curve_secret {secret_file!r}: {exc}") from None
    if not secret:
        raise ValueError(f"control_curve_secret {secret_file!r}: no secret key in it")
    return secret, public


def attach(sup) -> None:
    """Called by `sockherd run` before the loop starts: serve the control
    endpoint of the settings (none if `off`). Raises ValueError or OSError."""
    endpoint = endpoint_of(sup.settings, [lst.descriptor.address for lst in sup.listeners])
    if endpoint is None:
        return
    server = ControlServer(sup, endpoint)
    sup.add_extra(server)
    server._reregister()
    sup.events.subscribe(server.publish)
    sup.control = server
