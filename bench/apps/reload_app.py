"""The app of bench/reload_under_load.py (issue 9): every answer names the
process that gave it, so the client can tell a new generation's first answer.

app    WSGI: GET / answers 200 `pid=N\\n`; GET /sleep?S sleeps S seconds
       (default 3; time.sleep, the thread blocked as a real slow handler
       blocks it), then answers the same
asgi   the ASGI equivalent (uvicorn; asyncio.sleep)
"""
import asyncio
import os
import time

from peer_apps import lifespan      # bench/apps (the servers put it on the path)


def _body() -> bytes:
    return b"pid=%d\n" % os.getpid()


def app(environ, start_response):
    if environ.get("PATH_INFO") == "/sleep":
        time.sleep(float(environ.get("QUERY_STRING") or 3))
    body = _body()
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(body)))])
    return [body]


async def asgi(scope, receive, send):
    if scope["type"] == "lifespan":
        return await lifespan(receive, send)
    if scope["type"] != "http":
        return
    if scope["path"] == "/sleep":
        await asyncio.sleep(float(scope.get("query_string", b"").decode() or 3))
    body = _body()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
