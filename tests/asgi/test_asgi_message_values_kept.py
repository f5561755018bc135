"""The values of an app's message stay alive while the server uses them,
whatever Python code the message runs on the way (review of issue 22's
adapter, finding 1): send() took a borrowed "body" out of the message,
then asked more_body for its truth, an app's __bool__ that may empty the
message; the body was then read after its free (a worker dead of SIGSEGV
when the body is big enough to be a mapping of its own)."""
from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.timeout(120)


def test_a_more_body_that_empties_its_message_leaves_the_body_whole(asgi_server):
    srv = asgi_server("asgi_misbehaving:app")
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        pid = c.get("/pid").text
        try:
            r = c.get("/more-body-clears-message")
        except httpx.TransportError as exc:
            pytest.fail(f"no response ({exc!r}); the server's log:\n{srv.text()}")
        assert r.status_code == 200 and len(r.content) == int(r.headers["content-length"])
        assert len(r.content) > 32 << 20 and not r.content.strip(b"\0")
        assert c.get("/pid").text == pid, f"the worker was replaced:\n{srv.text()}"
