"""The ASGI apps of bench/asgi_loop.py (issue 22 §3): each request's handler
does the timer and callback work of a typical async endpoint before it
answers, so the server's event loop (ours on the fdcore poller, uvloop,
granian's) carries it.

work   per request: 10 x `await asyncio.sleep(0)`, a call_soon chain of 5
       callbacks, create_task + gather of 4 small tasks (each one sleep(0)),
       and 4 round trips between two tasks over two asyncio.Queues; then
       200, text/plain, "loop work done" (14 bytes)
timer  per request: `await asyncio.sleep(0.001)` (a real 1 ms timer), then
       the same answer
"""
import asyncio

from loop_steps import chain, pingpong   # bench/apps (the servers put it on the path)
from peer_apps import lifespan

BODY = b"loop work done"
_START = {"type": "http.response.start", "status": 200,
          "headers": [(b"content-type", b"text/plain"),
                      (b"content-length", str(len(BODY)).encode())]}
_BODY = {"type": "http.response.body", "body": BODY}


async def _small() -> int:
    await asyncio.sleep(0)
    return 1


async def work(scope, receive, send):
    if scope["type"] == "lifespan":
        return await lifespan(receive, send)
    if scope["type"] != "http":
        return
    loop = asyncio.get_running_loop()
    for _ in range(10):
        await asyncio.sleep(0)
    await chain(loop, 5, loop.call_soon)
    await asyncio.gather(*[loop.create_task(_small()) for _ in range(4)])
    await pingpong(4)
    await send(_START)
    await send(_BODY)


async def timer(scope, receive, send):
    if scope["type"] == "lifespan":
        return await lifespan(receive, send)
    if scope["type"] != "http":
        return
    await asyncio.sleep(0.001)
    await send(_START)
    await send(_BODY)
