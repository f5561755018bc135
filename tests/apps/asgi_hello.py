"""Raw ASGI 3 hello world, with no lifespan support at all: the lifespan
scope is refused by raising, as many hand-written apps do (servers in
`lifespan auto` mode go on without it). Also bench/apps' model."""

BODY = b"Hello, world!"
_START = {"type": "http.response.start", "status": 200,
          "headers": [(b"content-type", b"text/plain"), (b"content-length", b"13")]}
_BODY = {"type": "http.response.body", "body": BODY}


async def app(scope, receive, send):
    if scope["type"] != "http":
        raise RuntimeError(f"asgi_hello serves http only, not {scope['type']!r}")
    await send(_START)
    await send(_BODY)
