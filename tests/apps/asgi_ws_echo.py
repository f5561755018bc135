"""A bare ASGI WebSocket echo (no framework, no dependency): every text or
bytes message sent back as it came, plain HTTP answered 200. The app of the
RFC 6455 conformance cases (tests/ws_conformance) and of the echo and
idle-memory benchmark (bench/ws_echo.py), served alike by sockherd, uvicorn
and granian, so the servers' codecs are all that differs."""
from __future__ import annotations


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"),
                                (b"content-length", b"7")]})
        await send({"type": "http.response.body", "body": b"ws echo"})
        return
    if (await receive())["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    while True:
        message = await receive()
        if message["type"] != "websocket.receive":
            return                                        # websocket.disconnect
        if message.get("text") is not None:
            await send({"type": "websocket.send", "text": message["text"]})
        else:
            await send({"type": "websocket.send", "bytes": message["bytes"]})
