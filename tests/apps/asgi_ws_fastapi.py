"""A FastAPI app with WebSocket endpoints (issue 23's tests, tests/ws):
an echo that answers text and bytes, JSON through receive_json /
send_json, a path and query parameter, a dependency that refuses a
missing token before accept (403), and one that holds the connection and
records how it ended (the drain's 1001)."""
from __future__ import annotations

from fastapi import Depends, FastAPI, WebSocket, WebSocketDisconnect, WebSocketException, status

from asgi_records import record

app = FastAPI()


@app.get("/")
async def home():
    return {"ok": True}


async def token(ws: WebSocket, token: str | None = None) -> str:
    if token != "secret":
        raise WebSocketException(code=status.WS_1008_POLICY_VIOLATION)
    return token


@app.websocket("/ws/echo/{room}")
async def echo(ws: WebSocket, room: str, who: str = "anon"):
    await ws.accept(subprotocol="chat" if "chat" in ws.scope["subprotocols"] else None)
    await ws.send_text(f"welcome {who} to {room}")
    try:
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                record(f"echo-{room}", code=msg["code"])
                return
            if msg.get("text") is not None:
                await ws.send_text("echo: " + msg["text"])
            else:
                await ws.send_bytes(msg["bytes"][::-1])
    except WebSocketDisconnect as exc:
        record(f"echo-{room}", code=exc.code)


@app.websocket("/ws/json")
async def json_ws(ws: WebSocket, _: str = Depends(token)):
    await ws.accept()
    try:
        while True:
            data = await ws.receive_json()
            await ws.send_json({"sum": sum(data["values"]), "n": len(data["values"])})
    except WebSocketDisconnect:
        pass


@app.websocket("/ws/hold/{name}")
async def hold(ws: WebSocket, name: str):
    await ws.accept()
    record(f"hold-{name}-open", pid=__import__("os").getpid())
    try:
        while True:
            await ws.send_text(await ws.receive_text())
    except WebSocketDisconnect as exc:
        record(f"hold-{name}", code=exc.code)
