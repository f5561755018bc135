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
