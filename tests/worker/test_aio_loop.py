"""Each loop thread runs one asyncio event loop whose I/O is that
thread's fdcore poller (issue 22 §3, worker/aio.py): asyncio's timers,
tasks, queues, executors and call_soon_threadsafe work unchanged; an fd
the app opens (a TCP client) lives in the same fdcore table, owned by the
thread; a request whose app never waits completes in the iteration that
read it. Real ASGI requests on a real Loop over loopback."""
from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from sockherd.worker import aio
from test_wsgi import raw  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def answer(fn):
    """An ASGI app whose body is str(await fn(scope))."""
    async def app(scope, receive, send):
        body = str(await fn(scope)).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})
    return app


def get(addr, path="/", timeout=10) -> bytes:
    out = raw(addr, b"GET %s HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n" % path.encode(),
              timeout=timeout)
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK"), out
    return body


def test_sleep_tasks_gather_queue(serve_asgi):
    async def work(scope):
        q: asyncio.Queue = asyncio.Queue()

        async def producer(n):
            await asyncio.sleep(0.01 * n)
            await q.put(n)
            return n * 10

        tasks = [asyncio.create_task(producer(n)) for n in (3, 1, 2)]
        got = await asyncio.gather(*tasks)
        order = [q.get_nowait() for _ in range(3)]
        t0 = time.monotonic()
        await asyncio.sleep(0.1)
        slept = time.monotonic() - t0
        return f"{got} {order} {0.09 <= slept < 1.0}"

    _, addr = serve_asgi(answer(work))
    assert get(addr) == b"[30, 10, 20] [1, 2, 3] True"


def test_run_in_executor_and_the_running_loop(serve_asgi):
    loops = []

    async def work(scope):
        loop = asyncio.get_running_loop()
        loops.append(loop)
        return await loop.run_in_executor(None, lambda: threading.current_thread().name)

    loop, addr = serve_asgi(answer(work))
    name = get(addr)
    assert not name.startswith(b"sockherd-")           # ran on an executor thread
    assert loops[0] is loop.aio_loop(0) and loops[0].is_running()
    assert isinstance(loops[0], aio.ThreadEventLoop)


def test_call_soon_threadsafe_wakes_a_thread_asleep_in_its_poll(serve_asgi):
    """The loop thread sleeps in fdcore's poll (nothing due for a minute);
    another thread resolves the app's future: it is answered at once."""
    async def work(scope):
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        threading.Timer(0.3, loop.call_soon_threadsafe, (fut.set_result, "woken")).start()
        t0 = time.monotonic()
        value = await fut
        return f"{value} {time.monotonic() - t0 < 2.0}"

    _, addr = serve_asgi(answer(work))
    t0 = time.monotonic()
    assert get(addr) == b"woken True"
    assert time.monotonic() - t0 < 2.0


def test_an_app_tcp_client_lives_in_the_fdcore_table(serve_asgi):
    """asyncio.open_connection to a local server: its socket is in the same
    fdcore table, owned by this loop thread alone, kind KIND_AIO; once the
    app closed it, the table has forgotten it."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def echo_once():
        c, _ = srv.accept()
        with c:
            c.sendall(c.recv(100).upper())

    t = threading.Thread(target=echo_once, daemon=True)
    t.start()
    seen = {}

    async def work(scope):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        fd = writer.get_extra_info("socket").fileno()
        writer.write(b"ping")
        await writer.drain()
        data = await reader.read(100)
        info = table.dump(fd)
        seen.update(kind=info.kind, mask=info.thread_mask, owner=info.owner)
        writer.close()
        await writer.wait_closed()
        seen["after"] = fd
        return data.decode()

    loop, addr = serve_asgi(answer(work))
    table = loop.table
    try:
        assert get(addr) == b"PING"
    finally:
        srv.close()
        t.join(5)
    assert seen["kind"] == aio.KIND_AIO
    assert seen["mask"] == loop.loop_threads[0].bit and seen["owner"]
    assert table.dump(seen["after"]).owner == 0            # forgotten, not closed by it


def test_a_request_that_never_waits_completes_in_its_iteration(serve_asgi, monkeypatch):
    """The task is created inside select() (the turn that read the
    request) and runs in that iteration's ready pass: no other select()
    comes between the app's call and its end."""
    selects = [0]
    real = aio.PollerSelector.select

    def counting(self, timeout=None):
        selects[0] += 1
        return real(self, timeout)

    monkeypatch.setattr(aio.PollerSelector, "select", counting)
    seen = []

    class App:
        def __call__(self, scope, receive, send):
            seen.append(("called", selects[0]))          # inside select(): the turn
            return self.run(send)

        async def run(self, send):
            seen.append(("runs", selects[0]))
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"done"})
            seen.append(("ends", selects[0]))

    _, addr = serve_asgi(App())
    assert get(addr) == b"done"
    (_, called), (_, runs), (_, ends) = seen
    assert called == runs == ends, seen


def test_anyio_task_group_and_sniffio(serve_asgi):
    anyio = pytest.importorskip("anyio")

    async def work(scope):
        results = []

        async def child(n):
            await anyio.sleep(0.01 * n)
            results.append(n)

        async with anyio.create_task_group() as tg:
            for n in (2, 1):
                tg.start_soon(child, n)
        try:
            import sniffio
            lib = sniffio.current_async_library()
        except ImportError:
            lib = "asyncio"
        return f"{results} {lib} {anyio.get_current_task().name is not None}"

    _, addr = serve_asgi(answer(work))
    assert get(addr) == b"[1, 2] asyncio True"


def test_two_loop_threads_each_their_own_loop(serve_asgi):
    """-t 2 in one group: each thread its asyncio loop; a request's task
    runs on the loop of the thread that serves its connection."""
    seen = set()

    async def work(scope):
        seen.add((threading.current_thread().name, id(asyncio.get_running_loop())))
        await asyncio.sleep(0.2)                    # both threads busy at once
        return "ok"

    loop, addr = serve_asgi(answer(work), threads=2)
    assert loop.aio_loop(0) is not loop.aio_loop(1)
    results = []
    threads = [threading.Thread(target=lambda: results.append(get(addr))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert results == [b"ok"] * 8
    names = {}
    for name, loop_id in seen:
        names.setdefault(name, set()).add(loop_id)
    assert all(len(ids) == 1 for ids in names.values())       # one loop per thread
