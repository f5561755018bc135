"""Real FastAPI and Starlette WebSocket endpoints (tests/apps/asgi_ws_*.py)
served by a real sockherd master and worker, the `websockets` library as
the client (issue 23): accept with a subprotocol, path and query
parameters, text and bytes, JSON, a dependency refusing the handshake
(403), the app's close code and reason, Starlette's denial response, the
disconnect code each app sees, plain HTTP beside them on one worker."""
from __future__ import annotations

import json

import httpx
import pytest
import websockets.sync.client as wsc
from websockets.exceptions import ConnectionClosed, InvalidStatus

from wsclient import RawWs

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def fastapi_app(ws_server):
    return ws_server("asgi_ws_fastapi:app")


@pytest.fixture
def starlette_app(ws_server):
    return ws_server("asgi_ws_starlette:app")


def test_fastapi_echo(fastapi_app):
    with wsc.connect(fastapi_app.url("/ws/echo/lobby?who=ada"), subprotocols=["chat"],
                     max_size=None) as ws:
        assert ws.subprotocol == "chat"
        assert ws.recv() == "welcome ada to lobby"
        ws.send("hi ✓")
        assert ws.recv() == "echo: hi ✓"
        ws.send(b"\x01\x02\x03")
        assert ws.recv() == b"\x03\x02\x01"
        big = "x" * (1 << 20)                         # a 1 MiB message each way
        ws.send(big)
        assert ws.recv(timeout=30) == "echo: " + big
        ws.close(code=4005)
    assert fastapi_app.record("echo-lobby") == {"code": 4005}
    with httpx.Client(timeout=10) as c:
        assert c.get(f"http://127.0.0.1:{fastapi_app.port}/").json() == {"ok": True}


def test_fastapi_json_and_dependency(fastapi_app):
    with wsc.connect(fastapi_app.url("/ws/json?token=secret")) as ws:
        ws.send(json.dumps({"values": [1, 2, 3.5]}))
        assert json.loads(ws.recv()) == {"sum": 6.5, "n": 3}
    with pytest.raises(InvalidStatus) as err:
        wsc.connect(fastapi_app.url("/ws/json?token=wrong"))
    assert err.value.response.status_code == 403


def test_fastapi_client_gone_is_1006(fastapi_app):
    w = RawWs(("127.0.0.1", fastapi_app.port), path="/ws/echo/gone")
    assert w.recv_frame()[2].startswith(b"welcome")
    w.close()                                         # no close frame
    assert fastapi_app.record("echo-gone") == {"code": 1006}


def test_starlette_endpoint_and_close_code(starlette_app):
    with wsc.connect(starlette_app.url("/ws/echo")) as ws:
        ws.send("shout")
        assert ws.recv() == "SHOUT"
    assert starlette_app.record("starlette-echo") == {"code": 1000}
    with wsc.connect(starlette_app.url("/ws/bye")) as ws:
        ws.send("ada")
        assert ws.recv() == "bye ada"
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
    assert (ws.protocol.close_rcvd.code, ws.protocol.close_rcvd.reason) == (4001, "done with ada")


def test_starlette_denial_response(starlette_app):
    with pytest.raises(InvalidStatus) as err:
        wsc.connect(starlette_app.url("/ws/denied"))
    r = err.value.response
    assert r.status_code == 401 and r.body == b"members only"
    assert r.headers["x-reason"] == "no cookie"
