"""An app's own Sec-WebSocket-Extensions in websocket.accept's headers
(worker/native/app/asgi/asgi_ws_send.c, drop_extensions): the server's answer wins,
the app's field is dropped with a warning on the worker's logger, the 101
carries one Sec-WebSocket-Extensions at most (the server's), the app's
other headers go out as given.

Why dropped and not refused: the app sees whole messages, never frames, so
it can apply no extension; the server's field is the only true one. Two
permessage-deflate answers make websockets' client (and RFC 7692 5) fail
the connection; refusing the accept would fail a WebSocket that works.
Before the fix the 101 carried both fields: the raw client's count and
websockets' client (which refuses a duplicate permessage-deflate) fail."""
from __future__ import annotations

import logging

import pytest
import websockets.sync.client as wsc

from wsclient import RawWs, frame

pytestmark = pytest.mark.timeout(60)

APP_EXT = b"permessage-deflate; server_max_window_bits=9"


async def app(scope, receive, send):
    """Accepts with its own Sec-WebSocket-Extensions (and another header),
    then echoes until the client leaves."""
    if scope["type"] != "websocket":
        return
    await receive()
    await send({"type": "websocket.accept",
                "headers": [(b"Sec-WebSocket-Extensions", APP_EXT), (b"x-app", b"kept")]})
    while True:
        m = await receive()
        if m["type"] == "websocket.disconnect":
            return
        await send({"type": "websocket.send", **{k: m[k] for k in ("text", "bytes") if k in m}})


def extension_fields(w: RawWs) -> list[str]:
    return [v for k, v in w.headers if k.lower() == "sec-websocket-extensions"]


def dropped_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "sockherd.worker" and r.levelno == logging.WARNING
            and "Sec-WebSocket-Extensions" in r.getMessage()]


def test_negotiated_deflate_wins_over_the_apps_field(serve_asgi, caplog):
    caplog.set_level(logging.WARNING, logger="sockherd.worker")
    addr = serve_asgi(app, ws_per_message_deflate=True)[1]
    w = RawWs(addr, path="/x", extra=["Sec-WebSocket-Extensions: permessage-deflate"])
    assert w.status == 101
    assert extension_fields(w) == ["permessage-deflate"]       # the server's, once
    assert w.header("x-app") == "kept"
    w.send(frame(2, b"a" * 200))
    op, fin, payload = w.recv_frame()
    assert op == 2 and fin == 1                                  # compressed: RSV1 aside
    (warning,) = dropped_warnings(caplog)
    assert "/x" in warning and "server_max_window_bits=9" in warning
    assert "permessage-deflate as negotiated" in warning
    # a client that refuses two answers connects and echoes
    with wsc.connect(f"ws://{addr[0]}:{addr[1]}/y", compression="deflate") as ws:
        assert ws.response.headers.get_all("Sec-WebSocket-Extensions") == ["permessage-deflate"]
        ws.send("z" * 300)
        assert ws.recv(timeout=10) == "z" * 300


def test_without_deflate_the_apps_field_is_dropped_too(serve_asgi, caplog):
    """Deflate off (the default): the server applies no extension, so the
    app's field would announce one nobody applies: dropped as well."""
    caplog.set_level(logging.WARNING, logger="sockherd.worker")
    addr = serve_asgi(app)[1]
    w = RawWs(addr, path="/off", extra=["Sec-WebSocket-Extensions: permessage-deflate"])
    assert w.status == 101 and extension_fields(w) == [] and w.header("x-app") == "kept"
    w.send(frame(1, b"plain"))
    assert w.recv_frame() == (1, 1, b"plain")
    (warning,) = dropped_warnings(caplog)
    assert "/off" in warning and warning.endswith("none)")
