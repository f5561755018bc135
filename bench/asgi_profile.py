#!/usr/bin/env python3
"""asgi_profile: where a loop thread's time goes while it serves an ASGI
app, by cProfile, in process (issue 22 §3/§5: what is ours on the FastAPI
path: the loop's iteration, the turn, the runner, the receive/send calls,
against the app's own cost).

    .venv/bin/python bench/asgi_profile.py [--app fastapi_json:app]
        [--conns 50] [--requests 20000] [--top 30] [--sort tottime]

A real Loop (worker/loop.py) over a real fdcore Table, one loop thread,
the asgi interface, listening on loopback; a client in this process's
main thread keeps --conns keep-alive connections busy (a request on each,
then every answer, round after round: wrk-like batches per poll). The
loop thread's profiler (cProfile, that thread only) is on for the
--requests counted, after 10 % uncounted. Prints the profile's top
entries by --sort. cProfile's own cost inflates every Python call alike:
read the shares, not the absolute times; C functions called from C (the
engine's turn serving a request, the task's steps) are inside their
Python callers' figures.
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import importlib
import io
import os
import pstats
import socket
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "apps"))


def rounds(conns: list[socket.socket], n: int) -> None:
    req = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    for _ in range(-(-n // len(conns))):
        for c in conns:
            c.sendall(req)
        for c in conns:
            buf = b""
            while True:
                d = c.recv(65536)
                if not d:
                    raise SystemExit("the server closed a connection")
                buf += d
                head, sep, body = buf.partition(b"\r\n\r\n")
                if sep:
                    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                    if len(body) >= length:
                        break
            if not buf.startswith(b"HTTP/1.1 200"):
                raise SystemExit(f"unexpected answer {buf[:80]!r}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--app", default="fastapi_json:app", help="MODULE:ATTR in bench/apps")
    ap.add_argument("--conns", type=int, default=50)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--sort", default="tottime")
    a = ap.parse_args()
    from sockherd.fdcore import Table
    from sockherd.worker.asgi import make_handler
    from sockherd.worker.loop import Loop

    mod, attr = a.app.split(":")
    app = getattr(importlib.import_module(mod), attr)
    table = Table(1, 1)
    loop = Loop(table, make_handler(app, {"threads": 1}))
    srv = socket.create_server(("127.0.0.1", 0), backlog=1024)
    port = srv.getsockname()[1]
    loop.add_listener(srv)
    loop.start()
    prof = cProfile.Profile()
    conns = []
    try:
        aio = loop.aio_loop(0)
        conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(a.conns)]
        rounds(conns, max(a.conns, a.requests // 10))
        asyncio.run_coroutine_threadsafe(_call(prof.enable), aio).result()
        rounds(conns, a.requests)
        asyncio.run_coroutine_threadsafe(_call(prof.disable), aio).result()
    finally:
        for c in conns:
            c.close()
        loop.stop()
        table.close()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats(a.sort).print_stats(a.top)
    print(f"# {a.app}, {a.conns} keep-alive connections, {a.requests} requests profiled "
          f"(loop thread only)")
    print(out.getvalue())
    return 1 if loop.errors else 0


async def _call(fn):
    fn()


if __name__ == "__main__":
    sys.exit(main())
