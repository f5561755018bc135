"""A real FastAPI app (tests/apps/asgi_fastapi.py) served by a real server,
httpx as the client (issue 22 §4): JSON, path and query parameters and their
validation, a dependency, a pydantic body, a background task that runs after
the response, a StreamingResponse of server-sent events (time to the first
event, a client going away mid-stream seen by the app), a FileResponse, an
UploadFile upload, a 500. Each test runs against every server kind of
conftest.py (uvicorn only with SOCKHERD_ASGI_REFERENCE=1)."""
from __future__ import annotations

import hashlib
import os
import time
import uuid

import httpx
import pytest

from test_run import wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def fastapi_app(shared_asgi_server):
    """One server for the module's tests (they only send requests): its
    FastAPI start was most of each test's time. What a test leaves in the
    records carries a tag of its own (fresh())."""
    return shared_asgi_server("asgi_fastapi:app")


def fresh(name: str) -> str:
    """name made unique to this run of the test (the records dir is shared)."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def test_json_path_and_query_parameters(fastapi_app):
    with httpx.Client(base_url=fastapi_app.url, timeout=30) as c:
        r = c.get("/items/42", params={"q": "café & co", "limit": 3})
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/json"
        assert r.json() == {"item_id": 42, "q": "café & co", "limit": 3}
        assert c.get("/items/7").json() == {"item_id": 7, "q": None, "limit": 10}
        bad = c.get("/items/not-a-number")
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["path", "item_id"]
        assert c.get("/nope").status_code == 404


def test_dependency_and_pydantic_body(fastapi_app):
    with httpx.Client(base_url=fastapi_app.url, timeout=30) as c:
        assert c.get("/whoami", headers={"X-User": "ada"}).json() == {"user": "ada"}
        r = c.get("/whoami")
        assert r.status_code == 401 and r.json() == {"detail": "no X-User"}
        r = c.post("/echo", json={"name": "widget", "quantity": 3, "price": 2.5})
        assert r.json() == {"name": "widget", "quantity": 3, "price": 2.5, "total": 7.5}
        assert c.post("/echo", json={"name": "widget"}).status_code == 422


def test_background_task_runs_after_the_response(fastapi_app):
    """The task cannot finish before the test releases it: the response
    arriving first shows it was sent before the task ran to its end."""
    srv, t1 = fastapi_app, fresh("t1")
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        r = c.post(f"/background/{t1}")
        assert r.status_code == 200 and r.json() == {"queued": t1}
        assert not (srv.records / f"background-{t1}").exists()
        (srv.records / f"release-{t1}").write_text("")
        assert srv.record(f"background-{t1}")["released"] is True
        # the connection still serves the next request
        assert c.get("/items/1").status_code == 200


def test_sse_first_event_arrives_before_the_stream_ends(fastapi_app):
    """3 events 1 s apart: a server that buffered the response would deliver
    the first event after 2 s, with the last."""
    srv, first = fastapi_app, fresh("first")
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        t0 = time.monotonic()
        with c.stream("GET", f"/sse/{first}", params={"n": 3, "pause": 1.0}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            arrivals = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    arrivals.append((line, time.monotonic() - t0))
    assert [a for a, _ in arrivals] == ["data: 0", "data: 1", "data: 2"]
    # 1.5 s leaves room for a loaded machine; a buffered stream's first event is at >= 2 s
    assert arrivals[0][1] < 1.5, f"first event after {arrivals[0][1]:.2f} s"
    assert arrivals[2][1] >= 1.9
    assert srv.record(f"sse-{first}") == {"sent": 3, "completed": True}


def test_client_going_away_during_sse_is_seen_by_the_app(fastapi_app):
    """A client closes its connection after 3 events of an endless stream:
    the app's generator ends there (it records how many events it sent)
    instead of running its 600 events on."""
    srv, gone = fastapi_app, fresh("gone")
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        with c.stream("GET", f"/sse/{gone}", params={"n": 600, "pause": 0.05}) as r:
            got = 0
            for line in r.iter_lines():
                got += line.startswith("data: ")
                if got == 3:
                    break
    # the with blocks closed the response and the client: the socket is gone
    rec = srv.record(f"sse-{gone}", timeout=15)
    assert rec["completed"] is False and 3 <= rec["sent"] < 600, rec
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        assert c.get("/items/5").json()["item_id"] == 5       # still serving


def test_file_response(fastapi_app):
    srv, blob = fastapi_app, fresh("blob")
    data = os.urandom(3 << 20) + b"end"
    (srv.records / f"{blob}.bin").write_bytes(data)
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        r = c.get(f"/file/{blob}.bin", headers={"X-Record": blob})
        assert r.status_code == 200 and r.content == data
        assert r.headers["content-length"] == str(len(data))
        part = c.get(f"/file/{blob}.bin", headers={"Range": "bytes=100-199"})
        assert part.status_code == 206 and part.content == data[100:200]
        assert c.head(f"/file/{blob}.bin").content == b""
        assert c.get("/file/.hidden").status_code == 404
    if srv.kind == "sockherd":             # pathsend advertised (uvicorn has none)
        sent = srv.record(f"sends-{blob}")["types"]
        assert "http.response.pathsend" in sent, sent


def test_upload_file(fastapi_app):
    data = os.urandom(5 << 20)
    with httpx.Client(base_url=fastapi_app.url, timeout=60) as c:
        r = c.post("/upload", data={"note": "five MiB"},
                   files={"file": ("big.bin", data, "application/octet-stream")})
    assert r.status_code == 200, r.text
    assert r.json() == {"filename": "big.bin", "note": "five MiB", "size": len(data),
                        "sha256": hashlib.sha256(data).hexdigest()}


def test_an_exception_is_a_500_and_the_server_serves_on(fastapi_app):
    """Starlette answers 500 and then re-raises to the server, which may
    close that connection (uvicorn does): the next request uses a new one."""
    logged = fastapi_app.text().count("fastapi boom")      # the server may be shared
    with httpx.Client(base_url=fastapi_app.url, timeout=30) as c:
        r = c.get("/boom")
        assert r.status_code == 500
        assert "fastapi boom" not in r.text            # no traceback to the client
    with httpx.Client(base_url=fastapi_app.url, timeout=30) as c:
        assert c.get("/items/9").json()["item_id"] == 9
    wait_for(lambda: fastapi_app.text().count("fastapi boom") > logged, 10,
             "the error in the server's log")
