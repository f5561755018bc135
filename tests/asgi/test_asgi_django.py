"""Django through its ASGI handler with async views
(tests/apps/asgi_django.py, settings in asgi_django_settings.py: no
database) served by a real server, httpx as the client (issue 22 §4). Each
test runs against every server kind of conftest.py (uvicorn only with
SOCKHERD_ASGI_REFERENCE=1)."""
from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.timeout(120)


def test_django_async_views(asgi_server):
    srv = asgi_server("asgi_django:application")
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        r = c.get("/hello/dj", params={"q": "x"})
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        assert r.json() == {"name": "dj", "q": "x", "method": "GET", "async": True}
        r = c.get("/stream")
        assert r.status_code == 200 and r.text == "part 0;part 1;part 2;"
        assert c.get("/nope").status_code == 404
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        r = c.get("/boom")          # Django answers it itself (the server sees no error)
        assert r.status_code == 500 and "django async boom" not in r.text
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        assert c.get("/hello/again").json()["name"] == "again"      # serves on
