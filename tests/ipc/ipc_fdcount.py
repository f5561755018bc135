"""fd bookkeeping shared by the ipc tests: counting this process's open fds and making
throwaway ones. Imported by the test modules as a plain sibling module."""

import os
import resource
import socket


def open_fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def devnull_fds(n: int) -> list[int]:
    return [os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC) for _ in range(n)]


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def raise_nofile_limit(wanted: int) -> None:
    """1000+ fds plus their received copies need more than the usual 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(wanted, soft)), hard))


# What a peer may pass where a listener is expected (the real one twice as often).
FD_KINDS = ["listener", "listener", "o_path_socket", "o_path_file", "o_path_dir", "file",
            "dir", "pipe", "eventfd", "chardev", "not_listening", "dgram"]


def open_fd_of_kind(kind: str, listener: socket.socket) -> int:
    """A new fd of the given kind, made from a unix listener bound to a file; every kind
    but "listener" is one adopt() must refuse for it."""
    path = listener.getsockname()
    if kind == "o_path_socket":         # fstat() says "socket", yet no socket call works
        return os.open(path, os.O_PATH | os.O_CLOEXEC)
    if kind == "o_path_file":
        return os.open(__file__, os.O_PATH | os.O_CLOEXEC)
    if kind == "o_path_dir":
        return os.open(os.path.dirname(path), os.O_PATH | os.O_CLOEXEC)
    if kind == "file":
        return os.open(__file__, os.O_RDONLY | os.O_CLOEXEC)
    if kind == "not_listening":
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            return sock.detach()
    if kind == "dgram":
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            return sock.detach()
    if kind == "dir":
        return os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    if kind == "pipe":
        r, w = os.pipe()
        os.close(w)
        return r
    if kind == "eventfd":
        return os.eventfd(0, os.EFD_CLOEXEC)
    if kind == "chardev":
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    if kind == "closed":
        fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        os.close(fd)
        return fd
    assert kind == "listener"
    return os.dup(listener.fileno())
