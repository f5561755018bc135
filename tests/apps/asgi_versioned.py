"""The app that tests/asgi/test_asgi_reload_under_load.py reloads: its
version is read at import from the file named by ASGI_TEST_VERSION_FILE
(the test rewrites it before each reload, so each generation answers with
its own).

  GET /     `VERSION PID` (as tests/master/test_reload.py's WSGI app)
  GET /sse  text/event-stream: 10 events `data: VERSION i`, 50 ms apart
"""
import asyncio
import os

with open(os.environ["ASGI_TEST_VERSION_FILE"]) as f:
    VERSION = f.read().strip()

EVENTS = 10


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            kind = message["type"].split(".")[-1]          # startup | shutdown
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return
    if scope["path"] == "/sse":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for i in range(EVENTS):
            if i:
                await asyncio.sleep(0.05)
            await send({"type": "http.response.body", "body": f"data: {VERSION} {i}\n\n".encode(),
                        "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    body = f"{VERSION} {os.getpid()}".encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
