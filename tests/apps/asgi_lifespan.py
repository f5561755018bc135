"""Raw ASGI 3 app speaking the lifespan protocol with lifespan state.

startup puts a greeting and a counter object into the state and records
`lifespan-startup-PID`; shutdown records `lifespan-shutdown-PID` with how
many requests that process served. HTTP:

  GET /        JSON: the request's scope["state"] keys and greeting, and
               whether startup was recorded before this request ran
  GET /mutate  sets scope["state"]["added"]: a per-request copy, so the
               next request must not see it (spec: shallow copy)
"""
import json
import os

from asgi_records import exists, record

_served = {"n": 0}


async def lifespan(scope, receive, send):
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            scope["state"]["greeting"] = "hello from startup"
            scope["state"]["pid"] = os.getpid()
            record(f"lifespan-startup-{os.getpid()}", pid=os.getpid())
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            record(f"lifespan-shutdown-{os.getpid()}", pid=os.getpid(), served=_served["n"])
            await send({"type": "lifespan.shutdown.complete"})
            return


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        return await lifespan(scope, receive, send)
    assert scope["type"] == "http"
    _served["n"] += 1
    state = scope.get("state", {})
    if scope["path"] == "/mutate":
        state["added"] = True
    body = json.dumps({"keys": sorted(state), "greeting": state.get("greeting"),
                       "state_pid": state.get("pid"), "pid": os.getpid(),
                       "startup_recorded": exists(f"lifespan-startup-{os.getpid()}")}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
