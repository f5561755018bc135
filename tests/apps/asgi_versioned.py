"""The app that tests/asgi/test_asgi_reload_under_load.py reloads: its
version is read at import from the file named by ASGI_TEST_VERSION_FILE
(the test rewrites it before each reload, so each generation answers with
its own).

  GET /     `VERSION PID` (as tests/master/test_reload.py's WSGI app)
  GET /sse  text/event-stream: 10 events `data: VERSION i`, 50 ms apart
            (?n=N&pause=S: N events, S seconds apart)
  WS  /ws   `VERSION PID` once accepted, then each text message echoed
            (tests/ws/test_ws_reload_contract.py)
"""
import asyncio
import os
from urllib.parse import parse_qs

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
    if scope["type"] == "websocket":
        await receive()                                    # websocket.connect
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": f"{VERSION} {os.getpid()}"})
        while (message := await receive())["type"] == "websocket.receive":
            try:
                await send({"type": "websocket.send", "text": message.get("text"),
                            "bytes": message.get("bytes")})
            except OSError:      # closed meanwhile (the drain's 1001): the disconnect is next
                pass
        return                                             # websocket.disconnect
    if scope["path"] == "/sse":
        query = parse_qs(scope["query_string"].decode())
        events = int(query.get("n", [EVENTS])[0])
        pause = float(query.get("pause", [0.05])[0])
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for i in range(events):
            if i:
                await asyncio.sleep(pause)
            await send({"type": "http.response.body", "body": f"data: {VERSION} {i}\n\n".encode(),
                        "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    body = f"{VERSION} {os.getpid()}".encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
