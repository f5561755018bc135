"""The threads rule of the ASGI adapter (worker/native/app/asgi/asgi_app.c): a
connection whose task runs is only touched by its task's thread, so an
ASGI Server never shares its connections among a group's threads (no
per-request dispatch, refused if asked) and the relief never moves one.
The rule on a real master at --threads 2: tests/master/test_run_asgi.py."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(60)


async def app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def test_an_asgi_server_never_dispatches_nor_relieves(serve_asgi):
    loop, _ = serve_asgi(app, threads=2)
    engine = loop.engine
    assert engine.interface == "asgi" and loop.asgi
    assert engine.dispatch is False and loop.relief.enabled is False
    with pytest.raises((ValueError, RuntimeError)):
        engine.dispatch = True


def test_the_interface_is_one_of_two(serve_wsgi):
    loop, _ = serve_wsgi(lambda e, s: [])
    assert loop.engine.interface == "wsgi" and not loop.asgi and loop.aio_loop(0) is None
    with pytest.raises((TypeError, ValueError, RuntimeError)):
        loop.engine.interface = "rsgi"
    with pytest.raises(TypeError):
        loop.engine.interface = 3
