"""When a loop thread's asyncio loop polls (turns) while callbacks are
ready (worker/aio.py ThreadEventLoop._run_once): at most every
_TURN_EVERY iterations or _TURN_AFTER seconds, never starving the
thread's I/O.

Finding (bench/asgi_loop.py, callgrind, 2026-11-26): every iteration of
the loop ran a whole turn of the loop thread (the Python turn, the
engine's turn, a poll) even with callbacks ready, where it had nothing
to wait for: a turn cost about as much as the iteration it served
(sleep(0) 24.1k instructions per iteration, asyncio's default loop 21.1k,
uvloop 8.5k). Real ASGI requests on a real Loop over loopback."""
from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from test_aio_loop import answer, get

pytestmark = pytest.mark.timeout(60)

N = 4000


def polls(loop) -> int:
    return loop.loop_threads[0].counters()["loops"]


def test_a_run_of_ready_callbacks_polls_a_fraction_of_its_iterations(serve_asgi):
    """N sleep(0) are N iterations with a callback ready: the thread polls
    about N / _TURN_EVERY times (a poll per iteration before: 2 N, the
    engine's turn polls once without waiting first)."""
    seen = {}

    async def work(scope):
        before = polls(loop)
        for _ in range(N):
            await asyncio.sleep(0)
        seen["sleep0"] = polls(loop) - before
        aio = asyncio.get_running_loop()
        done = aio.create_future()
        left = [N]

        def step():                 # a timer due at once is ready work as well
            left[0] -= 1
            if left[0]:
                aio.call_later(0, step)
            else:
                done.set_result(None)
        before = polls(loop)
        aio.call_later(0, step)
        await done
        seen["later0"] = polls(loop) - before
        return "ok"

    loop, addr = serve_asgi(answer(work))
    assert get(addr) == b"ok"
    # a turn every 16 iterations: about N / 16 * 2 polls; the 1 ms bound
    # adds one per millisecond a loaded machine stretches the run to
    assert seen["sleep0"] < N / 4, seen
    assert seen["later0"] < N / 4, seen


def test_a_task_that_never_waits_for_io_does_not_starve_other_requests(serve_asgi):
    """A request whose app spins on sleep(0) for 3 s: another connection's
    request is read and answered meanwhile, within a fraction of that."""
    spinning = threading.Event()

    async def work(scope):
        if scope["path"] == "/spin":
            spinning.set()
            end = time.monotonic() + 3.0
            while time.monotonic() < end:
                await asyncio.sleep(0)
            return "spun"
        return "quick"

    loop, addr = serve_asgi(answer(work))
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("spin", get(addr, "/spin")), daemon=True)
    t.start()
    assert spinning.wait(10)
    t0 = time.monotonic()
    assert get(addr, "/quick") == b"quick"
    took = time.monotonic() - t0
    t.join(20)
    assert out.get("spin") == b"spun"
    assert took < 1.5, took


def test_stop_ends_a_loop_whose_task_never_waits():
    """Loop.stop() while a task spins on sleep(0) forever: the loop
    thread notices the stop at its next turn and ends."""
    from sockherd.fdcore import Table
    from sockherd.worker.asgi import make_handler
    from sockherd.worker.loop import Loop

    spinning = threading.Event()

    async def app(scope, receive, send):
        spinning.set()
        while True:
            await asyncio.sleep(0)

    table = Table(1, 1)
    loop = Loop(table, make_handler(app, {"threads": 1}))
    srv = socket.create_server(("127.0.0.1", 0))
    addr = srv.getsockname()
    loop.add_listener(srv)
    loop.start()
    c = socket.create_connection(addr)
    try:
        c.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        assert spinning.wait(10)
        t0 = time.monotonic()
        loop.stop(timeout=10)
        assert time.monotonic() - t0 < 5
    finally:
        c.close()
        table.close()


def test_a_turn_runs_without_the_selectors_python_frames_and_still_serves_app_fds(serve_asgi):
    """Finding (bench/http_callgrind.py --app fastapi and bench/asgi_loop.py
    micro, callgrind, 2026-11-26): each turn went through two Python frames
    of ours (ThreadEventLoop._turn, PollerSelector.select) around the loop
    thread's own turn: about 2k instructions a turn, one turn per request
    of a FastAPI app. The C iteration (worker/aio_native/handles.c
    runner_turn) now calls the loop thread's turn itself; what select did
    stays: the app's own fds' events reach asyncio (an open_connection
    here, to a server answering after a wait: the loop blocks in a turn
    with the app's socket registered), and the Loop's stop ends the run."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def echo_later():
        c, _ = srv.accept()
        with c:
            data = c.recv(100)
            time.sleep(0.05)                # the loop waits in its turn for this
            c.sendall(data.upper())

    t = threading.Thread(target=echo_later, daemon=True)
    t.start()

    async def work(scope):
        loop = asyncio.get_running_loop()
        sel = loop._selector
        calls = []
        plain = sel.select

        def counted(timeout=None):
            calls.append(timeout)
            return plain(timeout)
        sel.select = counted
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"ping")
            await writer.drain()
            data = await reader.read(100)
            writer.close()
            await writer.wait_closed()
            await asyncio.sleep(0.01)
        finally:
            del sel.select
        return f"{data.decode()} {len(calls)}"

    loop, addr = serve_asgi(answer(work))
    try:
        assert get(addr) == b"PING 0"
    finally:
        srv.close()
        t.join(5)
    aio_loop = loop.aio_loop(0)
    loop.stop()
    assert aio_loop.is_closed()
