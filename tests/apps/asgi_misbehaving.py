"""A raw ASGI 3 app whose routes each misbehave in one way an adversarial
review of the ASGI adapter found (tests/asgi/test_asgi_*), beside a plain
route that answers the worker's pid (to show the worker still serves, and
is the same process). Records go through asgi_records.py."""
from __future__ import annotations

import asyncio
import collections
import os

from asgi_records import exists, record

# past glibc's largest dynamic mmap threshold (32 MiB): the body's bytes
# object is a mapping of its own, unmapped as soon as it is freed, so a
# read of it after its free faults at once instead of reading stale memory
MAPPED = (32 << 20) + 4096


async def start(send, status=200, headers=()):
    await send({"type": "http.response.start", "status": status, "headers": list(headers)})


async def pid(scope, receive, send):
    body = str(os.getpid()).encode()
    await start(send, headers=[(b"content-length", str(len(body)).encode())])
    await send({"type": "http.response.body", "body": body})


class ClearsMessage:
    """A more_body whose truth test empties the message it is in: the body
    bytes are then held by nothing but whoever took them out before."""

    def __init__(self, msg):
        self.msg = msg

    def __bool__(self):
        self.msg.clear()
        return False


async def more_body_clears_message(scope, receive, send):
    await start(send, headers=[(b"content-length", str(MAPPED).encode())])
    msg = {"type": "http.response.body", "body": bytes(MAPPED)}
    msg["more_body"] = ClearsMessage(msg)
    await send(msg)


async def receive_with_timeout(scope, receive, send):
    """Waits for the body with a timeout that expires first (the client
    sends it only once the timeout is recorded), then reads it whole.
    ?late: reads it only once the server has read it (the client records
    "body-sent" after its send; two loop iterations later the loop read
    what was in the socket by then), with no receive() waiting."""
    try:
        await asyncio.wait_for(receive(), 0.05)
    except asyncio.TimeoutError:
        record("receive-timed-out")
    if scope["query_string"] == b"late":
        for _ in range(1000):
            if exists("body-sent"):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    await start(send, headers=[(b"content-length", str(len(body)).encode())])
    await send({"type": "http.response.body", "body": body})


async def send_with_timeout(scope, receive, send):
    """Streams to a client that does not read until a send() waits past
    its timeout (recorded with the body's length so far), then ends."""
    await start(send)
    chunk, sent = b"x" * 65536, 0
    while sent < (1 << 30):                     # bound: the client reads nothing yet
        sent += len(chunk)                      # a send that times out wrote it all the same
        try:
            await asyncio.wait_for(send({"type": "http.response.body", "body": chunk,
                                         "more_body": True}), 0.05)
        except asyncio.TimeoutError:
            record("send-timed-out", sent=sent)
            break
    await send({"type": "http.response.body", "body": b"end"})


async def raises_generator_exit(scope, receive, send):
    raise GeneratorExit("the app's own")


async def raises_generator_exit_mid_body(scope, receive, send):
    await start(send)
    await send({"type": "http.response.body", "body": b"first", "more_body": True})
    raise GeneratorExit("the app's own")


async def informational_status(scope, receive, send):
    await start(send, status=int(scope["query_string"] or b"100"))
    await send({"type": "http.response.body", "body": b"not a final response"})


Header = collections.namedtuple("Header", "name value")


async def namedtuple_headers(scope, receive, send):
    await start(send, headers=[Header(b"content-length", b"2"), Header(b"x-pair", b"named")])
    await send({"type": "http.response.body", "body": b"ok"})


ROUTES = {
    "/namedtuple-headers": namedtuple_headers,
    "/pid": pid,
    "/more-body-clears-message": more_body_clears_message,
    "/receive-with-timeout": receive_with_timeout,
    "/send-with-timeout": send_with_timeout,
    "/generator-exit": raises_generator_exit,
    "/generator-exit-mid-body": raises_generator_exit_mid_body,
    "/informational-status": informational_status,
}


async def app(scope, receive, send):
    if scope["type"] != "http":
        raise RuntimeError(f"asgi_misbehaving serves http only, not {scope['type']!r}")
    await ROUTES[scope["path"]](scope, receive, send)
