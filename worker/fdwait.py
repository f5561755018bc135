"""Readiness of a raw fd asked of the kernel directly, outside the fd
table's pollers: a blocking wait for a thread that is a connection's while
an app runs (worker/wsgi.py: a body read, a big response, a sendfile;
stream_output.py's flush_now), and an instant probe (worker/loop.py,
worker/relief.py: which of these fds have input or room now)."""
from __future__ import annotations

import select
import time


def wait_ready(fd: int, event: int, deadline: float, what: str) -> None:
    """Blocks until fd may be ready for event (select.POLLIN or POLLOUT),
    or raises TimeoutError(what) once the monotonic deadline passed. For a
    thread that is the connection's while an app runs (a body read, a big
    response, a sendfile); callers retry their I/O and wait again."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(what)
    waiter = select.poll()
    waiter.register(fd, event)
    waiter.poll(max(1, int(left * 1000)))


def ready_now(interest: dict[int, int]) -> set[int]:
    """Which of the fds have the events they are asked for ({fd: events})
    pending right now (or a hang-up, an error): one poll(2), no wait."""
    probe = select.poll()
    for fd, events in interest.items():
        probe.register(fd, events)
    return {fd for fd, _ in probe.poll(0)}
