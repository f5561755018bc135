#!/usr/bin/env python3
"""asyncio + uvloop echo server, N processes on one listener: the peer of
echo_bench.py (run with bench/.venv-peers/bin/python).

    bench/.venv-peers/bin/python bench/uvloop_echo.py --port PORT [--procs 2]

Binds one listener, then forks --procs processes; each runs a uvloop event
loop serving the shared socket with a Protocol that writes back what it
receives. Prints "ready" once every process serves; on SIGTERM each process
prints `child PID connections=N` and exits, then the parent exits 0.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys

import uvloop

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


def child(lsock: socket.socket, wfd: int) -> None:
    async def serve():
        loop = asyncio.get_running_loop()
        stop = loop.create_future()
        loop.add_signal_handler(signal.SIGTERM, lambda: stop.done() or stop.set_result(None))
        server = await loop.create_server(Echo, sock=lsock, backlog=2048)
        os.write(wfd, b"r")
        os.close(wfd)
        await stop
        server.close()

    uvloop.run(serve())
    sys.stdout.write(f"child {os.getpid()} connections={Echo.count}\n")
    sys.stdout.flush()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--procs", type=int, default=2)
    a = ap.parse_args()
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((a.host, a.port))
    lsock.listen(2048)
    lsock.setblocking(False)
    return serve_forked(lsock, a.procs, child)


if __name__ == "__main__":
    sys.exit(main())
