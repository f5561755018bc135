"""WebSocket apps that let the client's messages wait in the server's
receive queue (issue 35, points 4, 17 and 18): /stall accepts and never
calls receive() again; /slow takes one message every 2 ms. What they cost
the worker is what the server queued for them, which the queue's bound
must hold whatever the messages are (empty, one byte, text whose str is
four times its UTF-8, compressed ones that inflate a thousandfold); /echo
sends each message back, its first receive() 0.2 s after the accept (what
came meanwhile waits, parsed or not), to show that an app that receives
still gets every message once the worker's queues are full."""
from __future__ import annotations

import asyncio


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "websocket" or (await receive())["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    if scope["path"] == "/stall":
        await asyncio.sleep(3600)                  # the messages wait, queued
        return
    if scope["path"] == "/echo":
        await asyncio.sleep(0.2)
        while (message := await receive())["type"] == "websocket.receive":
            await send({"type": "websocket.send", "bytes": message.get("bytes"),
                        "text": message.get("text")})
        return
    while (await receive())["type"] == "websocket.receive":
        await asyncio.sleep(0.002)
