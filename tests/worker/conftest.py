"""Fixtures of the in-process worker tests: a real Loop over a real fdcore
Table, listening on loopback, stopped and checked for loop errors whatever
the test did."""
from __future__ import annotations

import socket

import pytest

from sockherd.fdcore import Table
from sockherd.worker.loop import Loop
from sockherd.worker.wsgi import make_handler


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
def serve_wsgi(serve_stream):
    """start(app, threads=1, **settings) -> (loop, addr): the wsgi interface."""
    def start(app, threads=1, **cfg):
        return serve_stream(make_handler(app, {"threads": threads, **cfg}), threads)

    return start
