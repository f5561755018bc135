#!/usr/bin/env python3
"""The classic prefork server (gunicorn sync, Apache prefork): the peer of
accept_bench.py.

    python bench/prefork_server.py --port PORT [--procs 8] [--mode epoll|select|blocking]

Binds one listener, then forks --procs processes that all wait on it:

  epoll     each an epoll instance, level-triggered, NOT EPOLLEXCLUSIVE, on the
            shared non-blocking listener; on readiness, accept until EAGAIN
            (every waiter is woken per connection: the thundering herd)
  select    the same with select() (gunicorn's sync worker)
  blocking  each blocks in accept() on a blocking listener (the kernel wakes
            one waiter per connection)

Each accepted connection is closed at once (the benchmark's app closes on
connect). A wake-up whose first accept() returns EAGAIN counts as
accept_empty (sockherd's definition). Prints "ready" on stdout once every
child is waiting; on SIGTERM the children stop and each prints one line
`child PID accepted=N accept_empty=M wakeups=W` on stdout (the driver sums
them); the parent exits 0 once they are reaped.
"""
from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import sys

from forked import serve_forked   # bench/forked.py (the script's directory)


def child(lsock: socket.socket, mode: str, wfd: int) -> None:
    stop = False
    accepted = empty = wakeups = 0

    class Stop(Exception):
        pass

    def on_term(*_):
        nonlocal stop
        stop = True
        if mode == "blocking":
            raise Stop                       # out of the blocking accept()

    signal.signal(signal.SIGTERM, on_term)
    lfd = lsock.fileno()
    os.write(wfd, b"r")
    os.close(wfd)
    if mode == "blocking":
        try:
            while not stop:
                c, _ = lsock.accept()
                wakeups += 1
                accepted += 1
                c.close()
        except Stop:
            pass
    else:
        if mode == "epoll":
            ep = select.epoll()
            ep.register(lfd, select.EPOLLIN)        # level-triggered, not exclusive

            def wait():
                return ep.poll(1.0)
        else:
            def wait():
                r, _, _ = select.select([lfd], [], [], 1.0)
                return r
        while not stop:
            try:
                ready = wait()
            except InterruptedError:
                continue
            if not ready:
                continue                      # the 1 s timeout: checks the stop flag
            wakeups += 1
            first = True
            while True:
                try:
                    c, _ = lsock.accept()
                except BlockingIOError:
                    if first:
                        empty += 1
                    break
                first = False
                accepted += 1
                c.close()
    sys.stdout.write(f"child {os.getpid()} accepted={accepted} accept_empty={empty} "
                     f"wakeups={wakeups}\n")
    sys.stdout.flush()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--mode", choices=("epoll", "select", "blocking"), default="epoll")
    ap.add_argument("--backlog", type=int, default=2048)
    a = ap.parse_args()

    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((a.host, a.port))
    lsock.listen(a.backlog)
    lsock.setblocking(a.mode == "blocking")
    return serve_forked(lsock, a.procs, lambda s, w: child(s, a.mode, w))


if __name__ == "__main__":
    sys.exit(main())
