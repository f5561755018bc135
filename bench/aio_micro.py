#!/usr/bin/env python3
"""aio_micro: one event loop's timer and callback throughput, in process:
the child half of bench/asgi_loop.py's micro-benchmark (run it from there).

    PYTHON bench/aio_micro.py sockherd|asyncio|uvloop

Builds the loop named and answers, one line each, the commands read from
stdin:

  run NAME N   runs workload NAME with N operations on that loop and prints
               {"name", "n", "secs"} as one JSON line (secs: the workload's
               own wall clock, taken on the loop's thread)
  quit         stops the loop and exits

The loops:

  sockherd  the loop of an ASGI loop thread, as a worker runs it: a real
            Loop (worker/loop.py) over a real fdcore Table, one loop thread,
            the asgi interface's native engine, a listener on loopback; the
            workloads run on aio_loop(0), each of its iterations one turn of
            the loop thread (worker/aio.py). Needs the sockherd checkout's
            .venv python.
  asyncio   asyncio's default loop (SelectorEventLoop over epoll)
  uvloop    uvloop's loop (bench/.venv-peers' python)

Workloads (N operations each; what one operation is):

  sleep0          `await asyncio.sleep(0)` in one task: one loop iteration
  soon_chain      a call_soon callback that schedules the next: one iteration
  soon_batch      N call_soon callbacks scheduled at once: one callback
  later0_chain    a call_later(0) callback that schedules the next: one
                  iteration through the timer heap
  later_batch     N call_later timers, delays spread over 0-1 ms: one timer
  tasks           create_task of a trivial coroutine, gathered 100 at a time
  queue_pingpong  two tasks answer each other over two asyncio.Queues: one
                  round trip
  sleep_1ms       `await asyncio.sleep(0.001)`: one sleep (latency, not
                  throughput: secs/N is the time a 1 ms sleep takes)
"""
from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
import time

# the steps bench/apps/loop_work.py's apps run per request, the same code
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "apps"))
from loop_steps import chain, countdown, pingpong  # noqa: E402


async def sleep0(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def soon_chain(n: int) -> None:
    loop = asyncio.get_running_loop()
    await chain(loop, n, loop.call_soon)


async def soon_batch(n: int) -> None:
    loop = asyncio.get_running_loop()
    done, step = countdown(loop, n)
    for _ in range(n):
        loop.call_soon(step)
    await done


async def later0_chain(n: int) -> None:
    loop = asyncio.get_running_loop()
    await chain(loop, n, functools.partial(loop.call_later, 0))


async def later_batch(n: int) -> None:
    loop = asyncio.get_running_loop()
    done, step = countdown(loop, n)
    for i in range(n):
        # a deterministic spread, not in order: the heap does real work
        loop.call_later((i * 7919 % 1000) * 1e-6, step)
    await done


async def _nothing() -> int:
    return 1


async def tasks(n: int) -> None:
    create = asyncio.get_running_loop().create_task
    for _ in range(n // 100):
        await asyncio.gather(*[create(_nothing()) for _ in range(100)])


async def queue_pingpong(n: int) -> None:
    await pingpong(n)


async def sleep_1ms(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0.001)


WORKLOADS = {f.__name__: f for f in (sleep0, soon_chain, soon_batch, later0_chain, later_batch,
                                     tasks, queue_pingpong, sleep_1ms)}


async def measured(name: str, n: int) -> dict:
    t0 = time.perf_counter()
    await WORKLOADS[name](n)
    return {"name": name, "n": n, "secs": time.perf_counter() - t0}


class OurLoop:
    """A one-thread sockherd Loop serving an ASGI app (never asked), its
    asyncio loop the one the workloads run on."""

    def __init__(self):
        import socket
        from sockherd.fdcore import Table
        from sockherd.worker.asgi import make_handler
        from sockherd.worker.loop import Loop

        async def app(scope, receive, send):        # never called: no client
            raise RuntimeError("aio_micro serves no request")
        self.table = Table(1, 1)
        self.loop = Loop(self.table, make_handler(app, {"threads": 1}))
        srv = socket.create_server(("127.0.0.1", 0))
        self.loop.add_listener(srv)
        self.loop.start()
        self.aio = self.loop.aio_loop(0)

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.aio).result()

    def close(self):
        self.loop.stop()
        self.table.close()
        if self.loop.errors:
            raise RuntimeError(f"loop errors: {self.loop.errors}")


class PlainLoop:
    def __init__(self, kind: str):
        if kind == "uvloop":
            import uvloop
            self.aio = uvloop.new_event_loop()
        else:
            self.aio = asyncio.new_event_loop()

    def run(self, coro):
        return self.aio.run_until_complete(coro)

    def close(self):
        self.aio.close()


def main() -> int:
    kind = sys.argv[1] if len(sys.argv) > 1 else ""
    if kind not in ("sockherd", "asyncio", "uvloop"):
        print(__doc__, file=sys.stderr)
        return 2
    loop = OurLoop() if kind == "sockherd" else PlainLoop(kind)
    try:
        print(json.dumps({"ready": kind, "loop": type(loop.aio).__module__ + "."
                          + type(loop.aio).__name__}), flush=True)
        for line in sys.stdin:
            words = line.split()
            if not words or words[0] == "quit":
                break
            if words[0] != "run" or len(words) != 3 or words[1] not in WORKLOADS:
                print(json.dumps({"error": f"bad command {line.strip()!r}"}), flush=True)
                continue
            print(json.dumps(loop.run(measured(words[1], int(words[2])))), flush=True)
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
