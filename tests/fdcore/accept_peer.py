"""Second holder of a listening socket, for tests/fdcore/test_fd_seed004.py.

    accept_peer.py <fd>|scm:<fd> <accept|hold> <max_seconds>

The listener arrives as <fd> (subprocess pass_fds), or with "scm:<fd>" over
the unix socket <fd> (SCM_RIGHTS, one message). It prints "ready" once
running, then in "accept" mode accepts every connection, answers b"ok\\n" and
closes it; in "hold" mode it never accepts (connections stay queued, the
listener stays readable). It exits when its stdin is closed or after
max_seconds, printing "accepted <n>".
"""
from __future__ import annotations

import os
import select
import socket
import sys
import time


def main() -> int:
    src, mode, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    deadline = time.monotonic() + seconds
    if src.startswith("scm:"):
        with socket.socket(fileno=int(src[4:])) as chan:
            chan.settimeout(30)
            _msg, fds, _flags, _addr = socket.recv_fds(chan, 16, 1)
        fd = fds[0]
    else:
        fd = int(src)
    lst = socket.socket(fileno=fd)
    # the file status flags (O_NONBLOCK) are shared with the other holder:
    # never change them, cope with EAGAIN instead
    print("ready", flush=True)
    accepted = 0
    watch = [0, lst] if mode == "accept" else [0]
    while time.monotonic() < deadline:
        r, _, _ = select.select(watch, [], [], 0.1)
        if 0 in r and not os.read(0, 64):
            break
        if lst in r:
            try:
                conn, _addr = lst.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                continue
            with conn:
                conn.setblocking(True)
                conn.settimeout(5)
                try:
                    conn.sendall(b"ok\n")
                except OSError:
                    pass
            accepted += 1
    lst.detach()
    print(f"accepted {accepted}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
