"""fd bookkeeping shared by the ipc tests: counting this process's open fds and making
throwaway ones. Imported by the test modules as a plain sibling module."""

import os
import resource


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
