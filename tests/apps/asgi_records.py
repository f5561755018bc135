"""Where the ASGI test apps leave what they saw, for the test to read.

A test cannot look inside a server process: the apps write one small file
per event (a background task that ran, a stream that ended early, a
lifespan startup) into the directory named by ASGI_TEST_RECORDS, which the
server fixture sets (tests/asgi/conftest.py). A record is written whole
under a temporary name and renamed, so a poller never reads half of one.
"""
from __future__ import annotations

import json
import os


def records_dir() -> str:
    return os.environ["ASGI_TEST_RECORDS"]


def record(name: str, **fields) -> None:
    path = os.path.join(records_dir(), name)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(fields, f)
    os.replace(tmp, path)


def exists(name: str) -> bool:
    return os.path.exists(os.path.join(records_dir(), name))


class RecordSends:
    """ASGI middleware: for a request whose path starts with `prefix` and
    that has an `X-Record: TAG` header, the types of the messages the app
    sent are recorded as `sends-TAG` (a test proves which messages the
    framework chose, e.g. http.response.pathsend for a FileResponse when
    the server advertises it)."""

    def __init__(self, app, prefix: str = "/file/"):
        self.app = app
        self.prefix = prefix

    async def __call__(self, scope, receive, send):
        tag = scope["type"] == "http" and scope["path"].startswith(self.prefix) and \
            next((v for k, v in scope["headers"] if k == b"x-record"), None)
        if not tag:
            return await self.app(scope, receive, send)
        types: list[str] = []

        async def recording_send(message):
            types.append(message["type"])
            await send(message)
        try:
            await self.app(scope, receive, recording_send)
        finally:
            record(f"sends-{tag.decode('ascii')}", types=types)
