"""An open WebSocket's keep-alive ping (issue 35, point 27: "WebSockets are
never pinged or timed out ... a peer that vanishes without a FIN holds its
connection forever"), on a real master and worker with a raw client
(wsclient.py) that answers pings only when a test says so:
ws_ping_interval of silence -> a ping; nothing for ws_ping_timeout after
it -> close 1011 "keepalive ping timeout" and the connection's end, with
no wait for the client's close; any input re-arms the interval; 0
disables either. The app (tests/apps/asgi_ws_fastapi.py, /ws/echo/ROOM)
records the disconnect code it saw."""
from __future__ import annotations

import struct
import time

import pytest

from wsclient import RawWs, frame

pytestmark = pytest.mark.timeout(90)

PING, PONG, CLOSE, TEXT = 0x9, 0xA, 0x8, 0x1


def opened(srv, room: str) -> RawWs:
    ws = RawWs(("127.0.0.1", srv.port), path=f"/ws/echo/{room}")
    assert ws.status == 101
    op, _, payload = ws.recv_frame()
    assert (op, payload) == (TEXT, f"welcome anon to {room}".encode())
    return ws


def frames_for(ws: RawWs, seconds: float, answer_pings: bool = False) -> list[tuple]:
    """Every frame the server sends within `seconds` (pings answered if
    asked), stopping at a close frame or the end."""
    out, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            f = ws.recv_frame(timeout=max(0.01, deadline - time.monotonic()))
        except AssertionError:                     # no frame in time
            break
        if f is None:
            out.append(("eof",))
            break
        out.append(f)
        if f[0] == PING and answer_pings:
            ws.send(frame(PONG, f[2]))
        if f[0] == CLOSE:
            break
    return out


def test_silent_client_is_pinged_then_closed_1011(ws_server):
    srv = ws_server("asgi_ws_fastapi:app", "--ws-ping-interval", "0.5", "--ws-ping-timeout",
                    "0.5")
    ws = opened(srv, "silent")
    started = time.monotonic()
    op, _, payload = ws.recv_frame(timeout=5)
    assert op == PING and len(payload) == 4
    pinged = time.monotonic() - started
    op, _, payload = ws.recv_frame(timeout=5)
    closed = time.monotonic() - started
    assert op == CLOSE
    assert struct.unpack("!H", payload[:2])[0] == 1011
    assert payload[2:] == b"keepalive ping timeout"
    assert ws.at_eof(timeout=5)                    # no wait for our close: the end at once
    ended = time.monotonic() - started
    assert 0.4 <= pinged < 1.5, pinged
    assert closed < 2.0 and ended < 2.5, (closed, ended)
    assert srv.record("echo-silent")["code"] == 1011


def test_client_answering_pings_stays_open(ws_server):
    srv = ws_server("asgi_ws_fastapi:app", "--ws-ping-interval", "0.5", "--ws-ping-timeout",
                    "0.5")
    ws = opened(srv, "pong")
    got = frames_for(ws, 2.5, answer_pings=True)   # 5 intervals
    assert [f[0] for f in got].count(PING) >= 3, got
    assert all(f[0] == PING for f in got), got
    ws.send(frame(TEXT, b"still here"))
    assert ws.recv_frame(timeout=5) == (TEXT, 1, b"echo: still here")


def test_client_sending_messages_is_never_pinged(ws_server):
    srv = ws_server("asgi_ws_fastapi:app", "--ws-ping-interval", "0.5", "--ws-ping-timeout",
                    "0.5")
    ws = opened(srv, "chatty")
    deadline = time.monotonic() + 2.0              # 4 intervals, a message every 0.2 s
    n = 0
    while time.monotonic() < deadline:
        ws.send(frame(TEXT, f"m{n}".encode()))
        assert ws.recv_frame(timeout=5) == (TEXT, 1, f"echo: m{n}".encode())
        n += 1
        time.sleep(0.2)
    assert frames_for(ws, 0.1) == []               # still quiet (0.3 s since the last one)
    got = frames_for(ws, 3)                        # then silent: pinged, closed
    assert [f[0] for f in got][:2] == [PING, CLOSE], got


def test_interval_0_never_pings(ws_server):
    srv = ws_server("asgi_ws_fastapi:app", "--ws-ping-interval", "0", "--ws-ping-timeout",
                    "0.5")
    ws = opened(srv, "never")
    assert frames_for(ws, 2.0) == []
    ws.send(frame(TEXT, b"alive"))
    assert ws.recv_frame(timeout=5) == (TEXT, 1, b"echo: alive")


def test_timeout_0_pings_and_never_closes(ws_server):
    srv = ws_server("asgi_ws_fastapi:app", "--ws-ping-interval", "0.4", "--ws-ping-timeout",
                    "0")
    ws = opened(srv, "nat")
    got = frames_for(ws, 2.0)                      # never answered
    assert len(got) >= 3 and all(f[0] == PING for f in got), got
    ws.send(frame(TEXT, b"alive"))
    assert ws.recv_frame(timeout=5) == (TEXT, 1, b"echo: alive")


def test_default_settings_do_not_ping_an_active_connection(ws_server):
    """Defaults (20 s, 20 s): a connection that speaks every second is
    never pinged (cheap: 3 s of it)."""
    srv = ws_server("asgi_ws_fastapi:app")
    ws = opened(srv, "default")
    for n in range(3):
        ws.send(frame(TEXT, b"x"))
        assert ws.recv_frame(timeout=5) == (TEXT, 1, b"echo: x")
        assert frames_for(ws, 1.0) == []


@pytest.mark.parametrize("flag", ["--ws-ping-interval", "--ws-ping-timeout"])
def test_negative_is_refused(master, flag):
    m = master("asgi_ws_fastapi:app", "--interface", "asgi", "-w", "1", flag, "-1", ready=None)
    m.proc.wait(timeout=30)
    assert m.proc.returncode != 0
    assert f"{flag} = '-1': expected `float` >= 0" in m.text(), m.text()
