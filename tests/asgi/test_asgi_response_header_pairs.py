"""http.response.start's headers are an iterable of two-item iterables
(ASGI HTTP spec): a tuple subclass such as a namedtuple is one, and is
served (review of issue 22's adapter, finding 5: only an exact tuple or
list was taken, and such a response was a 500)."""
from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.timeout(120)


def test_namedtuple_header_pairs_are_served(asgi_server):
    srv = asgi_server("asgi_misbehaving:app")
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        r = c.get("/namedtuple-headers")
    assert r.status_code == 200 and r.content == b"ok", srv.text()
    assert r.headers["x-pair"] == "named" and r.headers["content-length"] == "2"
