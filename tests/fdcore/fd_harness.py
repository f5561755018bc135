"""Shared harness of the fdcore step-by-step tests: a Table whose hooks record
every protocol point and can run scripted steps there, real socketpairs the
table owns, and checks of what the kernel's epoll instances hold.

Imported by test_fd_protocol.py, test_fd_races.py and test_fd_interleavings.py;
the `make` fixture that builds harnesses lives in conftest.py.
"""
from __future__ import annotations

import errno
import os
import socket
import threading

from sockherd.fdcore import Hook, Table
MAXFD = 1 << 16
OWNER = 0x5EED
EPOLLIN, EPOLLOUT, EPOLLRDHUP, EPOLLEXCLUSIVE = 0x1, 0x4, 0x2000, 1 << 28
WAKE_DATA = (1 << 64) - 1




class Harness:
    """A Table whose hook records every point and runs scripted steps there."""

    def __init__(self, threads: int, groups: int):
        self.t = Table(threads, groups, maxfd=MAXFD)
        self.th = self.t.threads
        self.log: list[tuple[Hook, int, int, int]] = []
        self._actions: list[dict] = []
        self._alock = threading.Lock()
        self._peers: list[socket.socket] = []
        self._extra_fds: list[int] = []
        self.t.set_hook(self._hook)

    def _hook(self, point: Hook, tid: int, fd: int, gen: int) -> None:
        self.log.append((point, tid, fd, gen))
        run = []
        with self._alock:
            for act in list(self._actions):
                if act["point"] == point and act["tid"] in (None, tid) and act["fd"] in (None, fd):
                    if act["once"]:
                        self._actions.remove(act)
                    run.append(act["fn"])
        for fn in run:
            fn(tid, fd, gen)

    def at(self, point: Hook, fn, *, tid: int | None = None, fd: int | None = None,
           once: bool = True) -> None:
        """Runs fn(tid, fd, gen) when `point` is reached (by tid, for fd)."""
        with self._alock:
            self._actions.append(dict(point=point, fn=fn, tid=tid, fd=fd, once=once))

    def count(self, point: Hook, *, fd: int | None = None, gen: int | None = None,
              tid: int | None = None) -> int:
        return sum(1 for p, t_, f, g in list(self.log)
                   if p == point and fd in (None, f) and gen in (None, g) and tid in (None, t_))

    def closes(self, fd: int, gen: int) -> int:
        return self.count(Hook.CLOSE_END, fd=fd, gen=gen)

    def pair(self) -> tuple[int, socket.socket]:
        """A connected socketpair: (detached fd for the table, peer socket)."""
        a, b = socket.socketpair()
        self._peers.append(b)
        fd = a.detach()
        assert fd < MAXFD
        return fd, b

    def reuse(self, fd: int) -> socket.socket:
        """Makes the (closed) number fd a fresh socketpair end again, as the
        next socket() of the process would; returns its peer."""
        a, b = socket.socketpair()
        if b.fileno() == fd:
            a, b = b, a
        self._peers.append(b)
        if a.fileno() == fd:
            a.detach()
        else:
            os.dup2(a.fileno(), fd)
            a.close()
        return b

    def keep(self, sock: socket.socket) -> socket.socket:
        self._peers.append(sock)
        return sock

    def keep_fd(self, fd: int) -> int:
        self._extra_fds.append(fd)
        return fd

    def insert(self, fd: int, *, owner: int = OWNER, tgid: int = 1, mask: int = 1, **kw) -> None:
        self.t.insert(fd, owner, tgid=tgid, thread_mask=mask, **kw)

    def finish(self) -> None:
        self.t.set_hook(None)
        for info in self.t.show_fd():
            try:
                self.th[self.t.group_base(info.tgid)].delete(info.fd)
            except OSError:
                pass
        self.t.close()
        for s in self._peers:
            s.close()
        for fd in self._extra_fds:
            try:
                os.close(fd)
            except OSError:
                pass


def run_thread(fn, *args) -> tuple[threading.Thread, dict]:
    """Runs fn in an OS thread; result or exception in the returned dict."""
    box: dict = {}

    def body():
        try:
            box["result"] = fn(*args)
        except BaseException as exc:  # reported by the test
            box["error"] = exc

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, box


def joined(t: threading.Thread, box: dict, timeout: float = 10.0):
    t.join(timeout)
    assert not t.is_alive(), "thread stuck (deadlock or livelock)"
    if "error" in box:
        raise box["error"]
    return box.get("result")


def swapped_with_old_file_readable(h: Harness, th) -> int:
    """An fd inserted for th, registered for recv, whose peer sent data; then,
    behind the table's back, its number is made a stranger's socket while the
    old file lives on in a dup (so its registration stays and reports IN).
    The next MOD of th's registration fails ENOENT. Returns the fd."""
    fd, peer = h.pair()
    h.keep_fd(os.dup(fd))                   # the old file outlives the swap
    h.insert(fd)
    th.want_recv(fd)
    th.update_pass()
    peer.send(b"data")
    stranger, other_end = socket.socketpair()
    h.keep(other_end)
    os.dup2(stranger.fileno(), fd)
    stranger.close()
    return fd


def is_closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as exc:
        assert exc.errno == errno.EBADF
        return True
    return False


def epoll_regs(epfd: int) -> list[tuple[int, int, int]]:
    """(tfd, events, data) of every registration of an epoll instance, from
    /proc/self/fdinfo (the kernel's view)."""
    out = []
    with open(f"/proc/self/fdinfo/{epfd}") as f:
        for line in f:
            if line.startswith("tfd:"):
                p = line.split()
                out.append((int(p[1]), int(p[3], 16), int(p[5], 16)))
    return [r for r in out if r[2] != WAKE_DATA]


def kernel_events(epfd: int, fd: int) -> int | None:
    regs = [r for r in epoll_regs(epfd) if r[0] == fd]
    assert len(regs) <= 1, regs
    return regs[0][1] if regs else None


def assert_clean(info, fd: int) -> None:
    assert info.fd == fd
    assert (info.tgid, info.refcount, int(info.state), info.owner, info.kind) == (0, 0, 0, 0, 0)
    assert (info.running_mask, info.thread_mask, info.update_mask) == (0, 0, 0)
    assert (info.polled_recv, info.polled_send) == (0, 0)
    assert not info.in_shared_list
    assert info.nb_takeover == 0


def assert_closed_once(h: Harness, fd: int, gen: int) -> None:
    assert h.closes(fd, gen) == 1
    assert h.count(Hook.CLOSE_BEGIN, fd=fd, gen=gen) == 1
    assert h.count(Hook.CLOSE_DRAINED, fd=fd, gen=gen) == 1
    info = h.t.dump(fd)
    assert info.generation == gen + 1
    assert_clean(info, fd)
    assert is_closed(fd)
