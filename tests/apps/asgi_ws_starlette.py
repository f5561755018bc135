"""A Starlette app with WebSocket routes (issue 23's tests, tests/ws): a
WebSocketEndpoint echo, a function route that closes with its own code
and reason, and one that denies the handshake with an HTTP response (the
websocket.http.response extension, Starlette's send_denial_response)."""
from __future__ import annotations

from starlette.applications import Starlette
from starlette.endpoints import WebSocketEndpoint
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from asgi_records import record


class Echo(WebSocketEndpoint):
    encoding = "text"

    async def on_receive(self, ws: WebSocket, data: str) -> None:
        await ws.send_text(data.upper())

    async def on_disconnect(self, ws: WebSocket, close_code: int) -> None:
        record("starlette-echo", code=close_code)


async def bye(ws: WebSocket) -> None:
    await ws.accept()
    name = await ws.receive_text()
    await ws.send_text(f"bye {name}")
    await ws.close(code=4001, reason=f"done with {name}")


async def denied(ws: WebSocket) -> None:
    await ws.send_denial_response(PlainTextResponse("members only", status_code=401,
                                                    headers={"x-reason": "no cookie"}))


async def home(request):
    return PlainTextResponse("starlette home")


app = Starlette(routes=[
    Route("/", home),
    WebSocketRoute("/ws/echo", Echo),
    WebSocketRoute("/ws/bye", bye),
    WebSocketRoute("/ws/denied", denied),
])
