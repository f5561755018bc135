"""Trivial apps for idle_bench's peers (gunicorn, granian: WSGI; uvicorn: ASGI).

GET /sleep?S sleeps S seconds (default 600) before answering: a request kept
in flight while the server drains. Anything else answers "ok" at once.
"""
import asyncio
import time

BODY = b"ok\n"


def wsgi(environ, start_response):
    if environ.get("PATH_INFO") == "/sleep":
        time.sleep(float(environ.get("QUERY_STRING") or 600))
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(BODY)))])
    return [BODY]


async def lifespan(receive, send):
    """The ASGI lifespan protocol, answered (uvicorn speaks it)."""
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def asgi(scope, receive, send):
    if scope["type"] == "lifespan":
        return await lifespan(receive, send)
    if scope["type"] != "http":
        return
    if scope["path"] == "/sleep":
        await asyncio.sleep(float(scope.get("query_string", b"").decode() or 600))
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"),
                            (b"content-length", str(len(BODY)).encode())]})
    await send({"type": "http.response.body", "body": BODY})
