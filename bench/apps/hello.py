"""The hello-world apps of bench/http_hello.py (issue 8).

app       WSGI: 200, text/plain, "Hello, world!" (13 bytes)
asgi      the ASGI equivalent (uvicorn)
blocking  WSGI: sleeps 1 ms (time.sleep, GIL released), then the same answer
"""
import time

from peer_apps import lifespan      # bench/apps (the servers put it on the path)

BODY = b"Hello, world!"


def app(environ, start_response):
    start_response('200 OK', [('Content-Type', 'text/plain'), ('Content-Length', '13')])
    return [b'Hello, world!']


def blocking(environ, start_response):
    time.sleep(0.001)
    start_response('200 OK', [('Content-Type', 'text/plain'), ('Content-Length', '13')])
    return [b'Hello, world!']


_START = {"type": "http.response.start", "status": 200,
          "headers": [(b"content-type", b"text/plain"), (b"content-length", b"13")]}
_BODY = {"type": "http.response.body", "body": BODY}


async def asgi(scope, receive, send):
    if scope["type"] == "lifespan":
        return await lifespan(receive, send)
    if scope["type"] != "http":
        return
    await send(_START)
    await send(_BODY)
