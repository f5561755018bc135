"""A FastAPI app exercising what real services use (issue 22 §4), served by
tests/asgi/test_asgi_fastapi.py. What the app saw is written with
asgi_records.record() (ASGI_TEST_RECORDS).

  GET  /items/{item_id}?q=&limit=   JSON; item_id an int (422 otherwise)
  GET  /whoami                      a dependency reading X-User (401 without)
  POST /echo                        a pydantic body, echoed with a computed field
  POST /background/{tag}            answers at once; a background task then
                                    waits for the test's `release-TAG` record
                                    (so it provably runs after the response)
                                    and records `background-TAG`
  GET  /sse/{tag}?n=&pause=         text/event-stream: n events `data: i`, the
                                    first at once, then `pause` s between
                                    them; at its end the generator records
                                    `sse-TAG` (events sent, completed or not)
  GET  /file/{name}                 FileResponse of a file in the records dir (the
                                    message types it sent recorded: RecordSends)
  POST /upload                      UploadFile + a form field: size, sha256
  GET  /boom                        raises: 500
"""
from __future__ import annotations

import asyncio
import hashlib
import os

from fastapi import BackgroundTasks, Depends, FastAPI, Form, Header, HTTPException, UploadFile
from fastapi.responses import FileResponse, StreamingResponse
from pydantic import BaseModel

from asgi_records import RecordSends, exists, record, records_dir

app = FastAPI()
app.add_middleware(RecordSends)


@app.get("/items/{item_id}")
async def item(item_id: int, q: str | None = None, limit: int = 10):
    return {"item_id": item_id, "q": q, "limit": limit}


async def current_user(x_user: str | None = Header(default=None)) -> str:
    if not x_user:
        raise HTTPException(status_code=401, detail="no X-User")
    return x_user


@app.get("/whoami")
async def whoami(user: str = Depends(current_user)):
    return {"user": user}


class Order(BaseModel):
    name: str
    quantity: int
    price: float


@app.post("/echo")
async def echo(order: Order):
    return {**order.model_dump(), "total": order.quantity * order.price}


async def after_response(tag: str) -> None:
    # bounded: a test that never releases ends the task in 30 s, recorded as such
    for _ in range(3000):
        if exists(f"release-{tag}"):
            record(f"background-{tag}", released=True, pid=os.getpid())
            return
        await asyncio.sleep(0.01)
    record(f"background-{tag}", released=False, pid=os.getpid())


@app.post("/background/{tag}")
async def background(tag: str, tasks: BackgroundTasks):
    tasks.add_task(after_response, tag)
    return {"queued": tag}


@app.get("/sse/{tag}")
async def sse(tag: str, n: int = 5, pause: float = 0.1):
    async def events():
        sent = 0
        try:
            for i in range(n):
                if i:
                    await asyncio.sleep(pause)
                yield f"data: {i}\n\n"
                sent += 1
        finally:
            # reached on completion, on a cancellation (a server telling
            # Starlette of the disconnect) and on the generator's close
            record(f"sse-{tag}", sent=sent, completed=sent == n)
    return StreamingResponse(events(), media_type="text/event-stream")


@app.get("/file/{name}")
async def file(name: str):
    if "/" in name or name.startswith("."):
        raise HTTPException(status_code=404)
    return FileResponse(os.path.join(records_dir(), name), media_type="application/octet-stream")


@app.post("/upload")
async def upload(file: UploadFile, note: str = Form()):
    digest = hashlib.sha256()
    size = 0
    while chunk := await file.read(1 << 16):
        digest.update(chunk)
        size += len(chunk)
    return {"filename": file.filename, "note": note, "size": size, "sha256": digest.hexdigest()}


@app.get("/boom")
async def boom():
    raise RuntimeError("fastapi boom")
