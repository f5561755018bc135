"""Fork-and-supervise for the benchmarks' own peer servers
(prefork_server.py, asyncio_echo.py): one listening socket (or None: each
child binds its own, SO_REUSEPORT), N children forked, "ready" printed once
every child said so (a byte on a pipe), SIGTERM to the parent stops them
all and reaps them."""
from __future__ import annotations

import os
import signal
import socket
import sys


def serve_forked(lsock: socket.socket | None, procs: int, child) -> int:
    """child(lsock, wfd) runs in each forked process (SIGTERM at its default
    until it installs its own) and writes one byte to wfd once it serves."""
    stop = False

    def on_term(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    rfd, wfd = os.pipe()
    kids = []
    for _ in range(procs):
        pid = os.fork()
        if pid == 0:
            os.close(rfd)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            code = 0
            try:
                child(lsock, wfd)
            except BaseException as exc:        # noqa: BLE001 - reported, then exit
                print(f"child {os.getpid()} failed: {exc!r}", file=sys.stderr)
                code = 1
            os._exit(code)
        kids.append(pid)
    os.close(wfd)
    got = 0
    while got < procs:
        chunk = os.read(rfd, procs)
        if not chunk:
            break
        got += len(chunk)
    os.close(rfd)
    print("ready", flush=True)
    while not stop:
        signal.pause()
    for pid in kids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    if lsock is not None:
        lsock.close()
    for pid in kids:
        os.waitpid(pid, 0)
    return 0
