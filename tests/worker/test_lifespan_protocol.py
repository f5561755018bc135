"""The lifespan protocol's rules (worker/lifespan.py) in-process, on real
apps and a real asyncio loop, for the cases a master test would only slow
down: every way a startup can fail and the message each gives, the auto
mode's line between "no lifespan support" and "a failed startup", messages
out of order, shutdown.failed, the startup bound. The same class runs in
every ASGI worker (tests/worker/test_asgi_lifespan.py: on a real master)."""
from __future__ import annotations

import asyncio
import logging
import select
import threading

import pytest

from sockherd.worker.lifespan import Lifespan, LifespanFailed

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def aio():
    """An asyncio loop running in a thread of its own: the serving loop
    thread's stand-in (Lifespan only talks to it through thread-safe calls)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="lifespan-test", daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    if not thread.is_alive():
        loop.close()


@pytest.fixture
def lifespans(aio):
    made = []

    def make(app, mode="auto", state=None):
        life = Lifespan(app, mode, {} if state is None else state)
        made.append(life)
        return life

    yield make
    for life in made:
        life.close()


async def complete_both(scope, receive, send):
    assert (await receive())["type"] == "lifespan.startup"
    scope["state"]["pool"] = "ready"
    await send({"type": "lifespan.startup.complete"})
    assert (await receive())["type"] == "lifespan.shutdown"
    await send({"type": "lifespan.shutdown.complete"})


def wait_shutdown(life: Lifespan) -> None:
    assert life.begin_shutdown()
    ready, _, _ = select.select([life.done_fd], [], [], 10)
    assert ready and not life.shutdown_pending


def test_startup_and_shutdown_share_the_state_dict(lifespans, aio):
    state = {}
    life = lifespans(complete_both, "on", state)
    life.start(aio, 10)
    assert state == {"pool": "ready"} and life.shutdown_due
    wait_shutdown(life)
    assert life.phase == "done"


async def returns_at_once(scope, receive, send):
    return None


async def raises_at_once(scope, receive, send):
    raise ValueError(f"unsupported scope {scope['type']}")


@pytest.mark.parametrize("app, how", [(returns_at_once, "returned"),
                                      (raises_at_once, "raised ValueError")])
def test_auto_serves_an_app_that_never_asked_for_startup(lifespans, aio, caplog, app, how):
    caplog.set_level(logging.INFO, "sockherd.worker")
    life = lifespans(app, "auto")
    life.start(aio, 10)
    assert not life.shutdown_due and not life.begin_shutdown()
    assert f"lifespan: not supported by the app (it {how}" in caplog.text


async def returns_after_startup(scope, receive, send):
    await receive()


async def completes_twice(scope, receive, send):
    await receive()
    await send({"type": "lifespan.shutdown.complete"})      # out of order: raises here


@pytest.mark.parametrize("app, mode, why", [
    (returns_at_once, "on", "the app returned without lifespan.startup.complete"),
    (raises_at_once, "on", "the app raised ValueError: unsupported scope lifespan"),
    (returns_after_startup, "auto", "the app returned without lifespan.startup.complete"),
    (completes_twice, "auto", "the app raised RuntimeError: unexpected ASGI message "
                              "{'type': 'lifespan.shutdown.complete'} in lifespan startup "
                              "(lifespan spec 2.0)"),
])
def test_every_failed_startup_says_how(lifespans, aio, app, mode, why):
    life = lifespans(app, mode)
    with pytest.raises(LifespanFailed) as info:
        life.start(aio, 10)
    assert str(info.value) == f"lifespan startup failed: {why}"


def test_a_startup_past_its_bound_fails_and_is_cancelled(lifespans, aio):
    cancelled = []

    async def slow(scope, receive, send):
        await receive()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    life = lifespans(slow, "on")
    with pytest.raises(LifespanFailed, match=r"did not complete within 0\.3s \(ready_timeout\)"):
        life.start(aio, 0.3)
    life.close()
    assert cancelled == [True]


def test_a_failed_shutdown_is_logged_with_the_apps_message(lifespans, aio, caplog):
    async def app(scope, receive, send):
        await receive()
        await send({"type": "lifespan.startup.complete"})
        await receive()
        await send({"type": "lifespan.shutdown.failed", "message": "flush lost 3 rows"})

    life = lifespans(app, "on")
    life.start(aio, 10)
    wait_shutdown(life)
    assert "lifespan: the app's shutdown failed: flush lost 3 rows" in caplog.text
