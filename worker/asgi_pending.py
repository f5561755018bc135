"""INTERIM, removed when the asgi branch is merged: what an ASGI app's
worker serves while `sockherd.worker.asgi` (the HTTP adapter) is not in
this build. Every request gets 503 and the connection closes, so that the
app side (interface detection, lifespan, READY only after startup, the
master's handling of a failed startup) runs and is tested on real workers
before the adapter lands. bootstrap.py picks it only on ImportError of that
module."""
from __future__ import annotations

BODY = b"the ASGI HTTP adapter is not in this build of sockherd\n"
RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(BODY)) + BODY


class AdapterMissing:
    """A stream handler: one 503 per connection, then close."""

    def on_data(self, conn, data: bytes) -> None:
        conn.write(RESPONSE)
        conn.close()
