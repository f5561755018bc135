#!/usr/bin/env python3
"""asyncio echo server (stdlib loop or uvloop), N processes: the peers of
echo_bench.py (run with bench/.venv-peers/bin/python, which has uvloop).

    bench/.venv-peers/bin/python bench/asyncio_echo.py --port PORT [--procs 2]
        [--loop uvloop|asyncio] [--listener reuseport|shared]

Forks --procs processes; each runs one event loop (asyncio's default
selector loop, or uvloop) with a Protocol that writes back what it
receives, with asyncio's own flow control (pause_reading while the
transport's buffer is above its high-water mark), so a client that does not
read cannot grow it without bound. --listener reuseport (the default): each
process binds its own listener with SO_REUSEPORT and the kernel spreads the
connections by hash; shared: the parent binds one listener before the fork
and the processes accept from it (issue 7's set-up: a burst of connects may
land mostly on one process). Prints "ready" once every process serves; on
SIGTERM each process prints `child PID connections=N` and exits, then the
parent exits 0.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys

from forked import serve_forked   # bench/forked.py (the script's directory)


class Echo(asyncio.Protocol):
    count = 0

    def connection_made(self, transport):
        Echo.count += 1
        self.transport = transport
        s = transport.get_extra_info("socket")
        if s is not None:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data):
        self.transport.write(data)

    # the transport calls these around its high-water mark: stop reading
    # while the peer does not take what was echoed
    def pause_writing(self):
        self.transport.pause_reading()

    def resume_writing(self):
        self.transport.resume_reading()


def listener(host: str, port: int, reuseport: bool) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuseport:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind((host, port))
    s.listen(2048)
    s.setblocking(False)
    return s


def child(a, lsock: socket.socket | None, wfd: int) -> None:
    if lsock is None:
        lsock = listener(a.host, a.port, True)

    async def serve():
        loop = asyncio.get_running_loop()
        stop = loop.create_future()
        loop.add_signal_handler(signal.SIGTERM, lambda: stop.done() or stop.set_result(None))
        server = await loop.create_server(Echo, sock=lsock, backlog=2048)
        os.write(wfd, b"r")
        os.close(wfd)
        await stop
        server.close()

    if a.loop == "uvloop":
        import uvloop
        uvloop.run(serve())
    else:
        asyncio.run(serve())
    sys.stdout.write(f"child {os.getpid()} connections={Echo.count}\n")
    sys.stdout.flush()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    ap.add_argument("--listener", choices=("reuseport", "shared"), default="reuseport")
    a = ap.parse_args()
    # reuseport: the parent holds no listener (one in the group that never
    # accepts would get its share of the connections)
    lsock = listener(a.host, a.port, False) if a.listener == "shared" else None
    return serve_forked(lsock, a.procs, lambda s, w: child(a, s, w))


if __name__ == "__main__":
    sys.exit(main())
