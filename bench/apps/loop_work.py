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

from peer_apps import lifespan      # bench/apps (the servers put it on the path)

BODY = b"loop work done"
_START = {"type": "http.response.start", "status": 200,
          "headers": [(b"content-type", b"text/plain"),
                      (b"content-length", str(len(BODY)).encode())]}
_BODY = {"type": "http.response.body", "body": BODY}


async def _small() -> int:
    await asyncio.sleep(0)
    return 1


async def _chain(loop, n: int) -> None:
    done = loop.create_future()
    left = [n]

    def step():
        left[0] -= 1
        if left[0]:
            loop.call_soon(step)
        else:
            done.set_result(None)
    loop.call_soon(step)
    await done


async def _pingpong(n: int) -> None:
    ping: asyncio.Queue = asyncio.Queue()
    pong: asyncio.Queue = asyncio.Queue()

    async def other():
        for _ in range(n):
            await pong.put(await ping.get())
    t = asyncio.get_running_loop().create_task(other())
    for i in range(n):
        await ping.put(i)
        await pong.get()
    await t


async def work(scope, receive, send):
    if scope["type"] == "lifespan":
        return await lifespan(receive, send)
    if scope["type"] != "http":
        return
    loop = asyncio.get_running_loop()
    for _ in range(10):
        await asyncio.sleep(0)
    await _chain(loop, 5)
    await asyncio.gather(*[loop.create_task(_small()) for _ in range(4)])
    await _pingpong(4)
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
