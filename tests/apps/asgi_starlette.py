"""A Starlette app (issue 22 §4), served by tests/asgi/test_asgi_starlette.py.

  GET  /                       plain text
  GET  /hello/{name}           path parameter and query string
  GET  /scope/{rest:path}      JSON of the ASGI scope's HTTP fields
  POST /body                   the request body read whole (await request.body()):
                               its length and sha256
  GET  /stream?n=              a StreamingResponse of n chunks `chunk i;`
  GET  /file/{name}            FileResponse of a file in the records dir (the
                               message types it sent recorded: asgi_records.RecordSends)
  GET  /wait-disconnect/{tag}  a long poll: records `waiting-TAG`, then polls
                               request.is_disconnected() until the client has
                               gone and records `disconnected-TAG` (bounded:
                               30 s, then records that it timed out)
"""
from __future__ import annotations

import asyncio
import hashlib
import os

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.middleware import Middleware
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from asgi_records import RecordSends, record, records_dir


async def home(request: Request):
    return PlainTextResponse("starlette home")


async def hello(request: Request):
    return PlainTextResponse(f"hello {request.path_params['name']} "
                             f"q={request.query_params.get('q', '')}")


async def scope_view(request: Request):
    s = request.scope
    return JSONResponse({
        "type": s["type"], "asgi": s["asgi"], "http_version": s["http_version"],
        "method": s["method"], "scheme": s["scheme"], "path": s["path"],
        "raw_path": s["raw_path"].decode("latin-1"),
        "query_string": s["query_string"].decode("latin-1"), "root_path": s["root_path"],
        "headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in s["headers"]],
        "client": list(s["client"]) if s.get("client") else None,
        "server": list(s["server"]) if s.get("server") else None,
    })


async def body(request: Request):
    data = await request.body()
    return JSONResponse({"size": len(data), "sha256": hashlib.sha256(data).hexdigest()})


async def stream(request: Request):
    n = int(request.query_params.get("n", "5"))

    async def chunks():
        for i in range(n):
            yield f"chunk {i};"
            await asyncio.sleep(0)
    return StreamingResponse(chunks(), media_type="text/plain")


async def wait_disconnect(request: Request):
    tag = request.path_params["tag"]
    record(f"waiting-{tag}")
    for polls in range(600):
        if await request.is_disconnected():
            record(f"disconnected-{tag}", polls=polls)
            return PlainTextResponse("gone")
        await asyncio.sleep(0.05)
    record(f"disconnected-{tag}", timed_out=True)
    return PlainTextResponse("timed out")


async def file(request: Request):
    name = request.path_params["name"]
    if "/" in name or name.startswith("."):
        return PlainTextResponse("no", status_code=404)
    return FileResponse(os.path.join(records_dir(), name), media_type="application/octet-stream")


app = Starlette(middleware=[Middleware(RecordSends)], routes=[
    Route("/", home),
    Route("/hello/{name}", hello),
    Route("/scope/{rest:path}", scope_view),
    Route("/body", body, methods=["POST"]),
    Route("/stream", stream),
    Route("/file/{name}", file, methods=["GET", "HEAD"]),
    Route("/wait-disconnect/{tag}", wait_disconnect),
])
