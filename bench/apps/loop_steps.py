"""The event-loop steps both of bench/asgi_loop.py's halves run: its apps
per request (loop_work.py) and its in-process micro-benchmark
(bench/aio_micro.py), written once so the two measure the same work."""
import asyncio


def countdown(loop, n: int, again=None):
    """(done, step): done, a future of loop, is set once step has run n
    times; again(step), if given, runs after each run but the last (the
    chain: each callback schedules the next)."""
    done = loop.create_future()
    left = [n]

    def step():
        left[0] -= 1
        if not left[0]:
            done.set_result(None)
        elif again is not None:
            again(step)
    return done, step


async def chain(loop, n: int, schedule) -> None:
    """n callbacks, each scheduled by the one before it with schedule
    (loop.call_soon, or call_later with its delay bound)."""
    done, step = countdown(loop, n, schedule)
    schedule(step)
    await done


async def pingpong(n: int) -> None:
    """n round trips between two tasks over two asyncio.Queues."""
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
