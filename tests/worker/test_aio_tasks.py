"""A loop thread's asyncio loop makes tasks in C (worker/aio_native/tasks.c:
its create_task and get_debug), the request tasks of the ASGI adapter
included: they behave as asyncio's own.

Finding (bench/http_callgrind.py --app asgi-hello, callgrind, 2026-11-26):
each request's task went through asyncio's Python create_task (two Python
frames and a kwargs dict) and its Future part through the loop's Python
get_debug: about 3k of a raw ASGI hello's 52k instructions. These tests pin
down what asyncio's create_task does and the C one keeps: a task factory
set by the app (loop.set_task_factory) makes every task, the request's
too; task names (asyncio's "Task-N", or the name given); the context (a
copy of the current one, or the one given; a request's context vars never
reach the next request); debug mode and a closed loop run asyncio's own
methods. Real ASGI requests on a real Loop over loopback."""
from __future__ import annotations

import asyncio
import contextvars
import re
import socket

import pytest

from test_aio_loop import answer, get

pytestmark = pytest.mark.timeout(60)

VAR = contextvars.ContextVar("VAR", default="unset")


def test_the_request_task_is_an_asyncio_task_named_and_registered_as_asyncio_does(serve_asgi):
    async def work(scope):
        loop = asyncio.get_running_loop()
        me = asyncio.current_task()
        return (f"{type(loop.create_task).__name__} {loop.get_debug()} "
                f"{isinstance(me, asyncio.Task)} {me.get_loop() is loop} "
                f"{me in asyncio.all_tasks()} {me.get_name()}")

    _, addr = serve_asgi(answer(work))
    first = get(addr).decode()
    assert re.fullmatch(r"TaskMaker False True True True Task-\d+", first), first
    second = get(addr).decode()
    # asyncio's counter: a new name per task
    assert int(second.rsplit("-", 1)[1]) > int(first.rsplit("-", 1)[1])


def test_create_task_takes_a_name_and_a_context_and_copies_the_current_one(serve_asgi):
    async def work(scope):
        loop = asyncio.get_running_loop()
        before = VAR.get()                  # the previous request's value must not be here
        VAR.set("request")

        async def child():
            return f"{asyncio.current_task().get_name()}={VAR.get()}"

        ctx = contextvars.copy_context()
        ctx.run(VAR.set, "given")
        got = [await loop.create_task(child(), name="named"),
               await loop.create_task(child(), context=ctx),
               await loop.create_task(child(), name="both", context=ctx),
               await asyncio.create_task(child(), name="module")]
        return f"{before} {' '.join(got)}"

    _, addr = serve_asgi(answer(work))
    for _ in range(2):
        body = get(addr).decode()
        assert re.fullmatch(r"unset named=request Task-\d+=given both=given module=request",
                            body), body


def test_a_requests_context_holds_across_its_steps_and_not_into_the_next_on_the_connection(
        serve_asgi):
    """Each request's task runs every step in its own context: a var it
    sets before an await is there after it (the task's later steps are
    scheduled by the loop's C call_soon with asyncio's context= keyword,
    worker/aio_native/callers.c), and the next request on the same
    keep-alive connection starts without it; asyncio.current_task() is the
    request's registered Task in every step."""
    async def work(scope):
        before = VAR.get()
        VAR.set(scope["path"])
        me = asyncio.current_task()
        await asyncio.sleep(0)                  # a second step, through call_soon
        await asyncio.sleep(0.001)              # a third, through a timer
        return (f"{before} {VAR.get()} {asyncio.current_task() is me} "
                f"{me in asyncio.all_tasks()}")

    _, addr = serve_asgi(answer(work))
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"GET /one HTTP/1.1\r\nHost: h\r\n\r\nGET /two HTTP/1.1\r\nHost: h\r\n"
                  b"Connection: close\r\n\r\n")
        out = b""
        while chunk := c.recv(65536):
            out += chunk
    bodies = [part.split(b"\r\n\r\n", 1)[1].decode() for part in out.split(b"HTTP/1.1 ")[1:]]
    assert bodies == ["unset /one True True", "unset /two True True"], out


def _unnamed_factory_task() -> str:
    """A regex of the name asyncio's own loop gives a task that a factory made
    with no name asked for."""
    async def main():
        loop = asyncio.get_running_loop()
        loop.set_task_factory(lambda lp, coro, **kw: asyncio.Task(coro, loop=lp, **kw))
        return loop.create_task(asyncio.sleep(0), context=contextvars.copy_context())
    async def run():
        task = await main()
        await task
        return task.get_name()
    name = asyncio.run(run())
    return r"Task-\d+" if re.fullmatch(r"Task-\d+", name) else re.escape(name)


def test_a_task_factory_set_by_the_app_makes_every_task_the_requests_too(serve_asgi):
    class Marked(asyncio.Task):
        pass

    made = []

    def factory(loop, coro, **kw):
        made.append(kw)
        return Marked(coro, loop=loop, **kw)

    async def work(scope):
        loop = asyncio.get_running_loop()
        if scope["path"] == "/set":
            loop.set_task_factory(factory)
            return "set"
        if scope["path"] == "/unset":
            loop.set_task_factory(None)
            return type(asyncio.current_task()).__name__

        async def child():
            return f"{type(asyncio.current_task()).__name__}:{asyncio.current_task().get_name()}"

        ctx = contextvars.copy_context()
        return " ".join([type(asyncio.current_task()).__name__,
                         await loop.create_task(child(), name="n"),
                         await loop.create_task(child(), context=ctx)])

    _, addr = serve_asgi(answer(work))
    assert get(addr, "/set") == b"set"
    body = get(addr, "/").decode()
    # the request's task, then the app's named one (asyncio names it after
    # the factory made it), then one with a context (passed to the factory),
    # named as this interpreter's asyncio names it: Task-N on 3.11, "None" on
    # 3.13.5 (its create_task calls set_name(name) with name None)
    assert re.fullmatch(r"Marked Marked:n Marked:" + _unnamed_factory_task(), body), body
    assert made[-2:] == [{}, {"context": made[-1]["context"]}]
    assert get(addr, "/unset") == b"Marked"        # that request's task: the factory's
    assert get(addr, "/").decode().startswith("Task Task:n Task:Task-")


def test_debug_mode_makes_tasks_with_asyncios_create_task_and_back(serve_asgi):
    async def work(scope):
        loop = asyncio.get_running_loop()
        seen = [type(loop.create_task).__name__]
        loop.set_debug(True)
        try:
            seen.append(str("create_task" in vars(loop) or "get_debug" in vars(loop)))
            t = loop.create_task(asyncio.sleep(0), name="dbg")
            await t
            seen.append(f"{t.get_name()} {loop.get_debug()} {bool(t._source_traceback)}")
        finally:
            loop.set_debug(False)
        seen.append(type(loop.create_task).__name__)
        return " ".join(seen)

    _, addr = serve_asgi(answer(work))
    assert get(addr) == b"TaskMaker False dbg True True TaskMaker"


def test_a_closed_loop_refuses_create_task_as_asyncio_does(serve_asgi):
    loop, _ = serve_asgi(answer(lambda scope: asyncio.sleep(0)))
    aio_loop = loop.aio_loop(0)
    loop.stop()
    assert aio_loop.is_closed()
    coro = asyncio.sleep(0)
    try:
        with pytest.raises(RuntimeError, match="Event loop is closed"):
            aio_loop.create_task(coro)
    finally:
        coro.close()


def test_wrong_arguments_get_asyncios_errors(serve_asgi):
    async def work(scope):
        loop = asyncio.get_running_loop()
        errs = []
        coro = asyncio.sleep(0)
        for call in (lambda: loop.create_task(), lambda: loop.create_task(1, 2),
                     lambda: loop.create_task(coro, bogus=1),
                     lambda: loop.create_task(42)):
            try:
                call()
            except TypeError:
                errs.append("TypeError")
        coro.close()
        return " ".join(errs)

    _, addr = serve_asgi(answer(work))
    assert get(addr) == b"TypeError TypeError TypeError TypeError"


def test_create_future_is_c_and_makes_asyncios_future_read_at_each_call(serve_asgi, monkeypatch):
    """Finding (bench/asgi_loop.py micro, callgrind, 2026-11-26): every wait
    of asyncio.Queue, Event, Lock and gather made its future through
    asyncio's Python create_future (uvloop's is C): Queue ping-pong cost
    0.87 of uvloop's instructions. Ours is C (tasks.c) and keeps what
    asyncio's does: asyncio.futures.Future(loop=loop), that name read at
    each call; asyncio's own method back in debug mode; its TypeError for
    arguments."""
    class Marked(asyncio.Future):
        pass

    async def work(scope):
        loop = asyncio.get_running_loop()
        seen = [str("create_future" in vars(loop))]
        fut = loop.create_future()
        seen.append(f"{type(fut).__name__} {fut.get_loop() is loop}")
        loop.call_soon(fut.set_result, "done")
        seen.append(await fut)
        with monkeypatch.context() as m:
            m.setattr(asyncio.futures, "Future", Marked)
            seen.append(type(loop.create_future()).__name__)
        try:
            loop.create_future(1)
        except TypeError:
            seen.append("TypeError")
        loop.set_debug(True)
        try:
            seen.append(str("create_future" in vars(loop)))
        finally:
            loop.set_debug(False)
        seen.append(str("create_future" in vars(loop)))
        return " ".join(seen)

    _, addr = serve_asgi(answer(work))
    assert get(addr) == b"True Future True done Marked TypeError False True"
