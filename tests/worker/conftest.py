"""Fixtures of the in-process worker tests: a real Loop over a real fdcore
Table, listening on loopback, stopped and checked for loop errors whatever
the test did."""
from __future__ import annotations

import importlib.util
import os
import socket
import sys

import pytest


def _sanitizer_build() -> None:
    """test_http_asan.py runs these tests against an AddressSanitizer +
    UBSan build of the native HTTP extension, named by SOCKHERD_HTTP_MODULE:
    it takes the installed module's place before anything imports it, so
    the parser and the whole engine (wsgi.py's Server) are that build."""
    path = os.environ.get("SOCKHERD_HTTP_MODULE")
    if path:
        spec = importlib.util.spec_from_file_location("sockherd.worker._http", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules["sockherd.worker._http"] = mod
        import sockherd.worker
        sockherd.worker._http = mod
        # run_under_asan (tests/http_asan.py) checks the child said so
        print(f"sanitizer build in place: {path}")


_sanitizer_build()

from sockherd.fdcore import Table  # noqa: E402
from sockherd.worker.loop import Loop  # noqa: E402
from sockherd.worker.wsgi import make_handler  # noqa: E402


@pytest.fixture
def serve_stream():
    """start(handler_class, threads=2, groups=1, **loop_kw) -> (loop, addr)"""
    made = []

    def start(handler, threads=2, groups=1, **kw):
        table = Table(threads, groups)
        loop = Loop(table, handler, **kw)
        srv = socket.create_server(("127.0.0.1", 0), backlog=512)
        addr = srv.getsockname()
        loop.add_listener(srv)
        loop.start()
        made.append((loop, table))
        return loop, addr

    yield start
    for loop, table in made:
        loop.stop()
        table.close()
        assert not loop.errors, loop.errors


@pytest.fixture
def serve_asgi(serve_stream):
    """start(app, threads=1, state=None, **settings) -> (loop, addr): the
    asgi interface (worker/asgi.py), each loop thread an asyncio loop."""
    from sockherd.worker.asgi import make_handler as make_asgi_handler

    def start(app, threads=1, state=None, **cfg):
        return serve_stream(make_asgi_handler(app, {"threads": threads, **cfg}, state), threads)

    return start


@pytest.fixture
def serve_wsgi(serve_stream):
    """start(app, threads=1, **settings) -> (loop, addr): the wsgi interface."""
    def start(app, threads=1, **cfg):
        return serve_stream(make_handler(app, {"threads": threads, **cfg}), threads)

    return start
