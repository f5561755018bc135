"""The WebSocket receive queue's bound holds whatever the client's messages
are (issue 35, points 4, 17 and 18), on a real master and one worker
serving tests/apps/asgi_ws_hoard.py, the client a raw socket flooding
frames for a few seconds: the worker's peak RSS (VmHWM) over its RSS
before the flood is what the server held for the app.

Before (main at 25758be), shown by these tests:
- point 4: the bound counted payload bytes only, so an empty or one-byte
  message cost nothing of it while its dict and value cost ~280 bytes:
  an app that never receives let a client grow the worker by hundreds of
  MiB from a few MB on the wire;
- point 17: a text message was counted in its UTF-8 bytes in and its
  str's size out (four times as much for text with one astral character),
  so an app taking messages let ~4 in for each it took: unbounded;
- point 18: a compressed message inflated to ws_max_size was held twice
  (the codec's buffer and the bytes object) per stalled connection, and
  nothing bounded what all connections together held.

Now each queued message is counted by what it holds (its dict, its value
object, its slot), the same number in and out (asgi_ws_frames.c
ws_msg_cost); the codec's buffer of a big message is let go once it is
handed over; and a worker-wide bound (WS_WORKER_QUEUE_MAX) stops reading
ahead for apps that are not waiting once all queues together hold it."""
from __future__ import annotations

import re
import select
import socket
import time
import zlib

import pytest

from wsclient import RawWs, frame

pytestmark = pytest.mark.timeout(120)

FLOOD_S = 3.0


def status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1))


def worker_pid(srv) -> int:
    return int(srv.master.wait_log(r"worker \d+\.\d+: ready, pid (\d+)")[0])


def flood(ws: RawWs, chunk: bytes, seconds: float = FLOOD_S) -> int:
    """Sends chunk after chunk for `seconds` (non-blocking: a server that
    stopped reading only stops the flood), the bytes sent."""
    s = ws.sock
    s.setblocking(False)
    sent, view, at = 0, memoryview(chunk), 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            try:
                n = s.send(view[at:])
            except BlockingIOError:
                select.select([], [s], [], 0.05)
                continue
            sent += n
            at = (at + n) % len(chunk)
    finally:
        s.setblocking(True)
    return sent


def growth_mib(pid: int, before_kib: int) -> float:
    return (status_kib(pid, "VmHWM") - before_kib) / 1024


@pytest.mark.parametrize("payload", [b"", b"x"], ids=["empty", "one-byte"])
def test_tiny_messages_to_an_app_that_never_receives_are_bounded(ws_server, payload):
    """Point 4: 12 MB of empty frames grew the worker by 384 MiB."""
    srv = ws_server("asgi_ws_hoard:app", "--threads", "1")
    pid = worker_pid(srv)
    ws = RawWs(("127.0.0.1", srv.port), path="/stall")
    assert ws.status == 101
    ws.send(frame(2, payload) * 100)
    time.sleep(0.3)                              # a warm worker's own allocations first
    before = status_kib(pid, "VmRSS")
    sent = flood(ws, frame(2, payload) * 20000)
    grew = growth_mib(pid, before)
    print(f"{sent / 1e6:.1f} MB sent as {len(frame(2, payload))}-byte frames: "
          f"peak RSS +{grew:.1f} MiB")
    assert sent > 1 << 20, "the flood did not get going"
    assert grew < 16, f"the worker grew by {grew:.1f} MiB for {sent / 1e6:.1f} MB of frames"


def test_astral_text_to_a_slow_receiver_is_bounded(ws_server):
    """Point 17: ASCII text with one astral character is four times its
    UTF-8 as a str: counted by UTF-8 in and str size out, ~4 came in for
    each the app took (1.5 GiB in 11 s on one connection)."""
    srv = ws_server("asgi_ws_hoard:app", "--threads", "1")
    pid = worker_pid(srv)
    ws = RawWs(("127.0.0.1", srv.port), path="/slow")
    assert ws.status == 101
    message = frame(1, ("a" * 16383 + "\U0001F600").encode())
    ws.send(message * 4)
    time.sleep(0.3)
    before = status_kib(pid, "VmRSS")
    sent = flood(ws, message * 16)
    grew = growth_mib(pid, before)
    print(f"{sent / 1e6:.1f} MB of astral text sent: peak RSS +{grew:.1f} MiB")
    assert sent > 4 << 20, "the flood did not get going"
    assert grew < 24, f"the worker grew by {grew:.1f} MiB for {sent / 1e6:.1f} MB of text"


def deflated(data: bytes) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    out = z.compress(data) + z.flush(zlib.Z_SYNC_FLUSH)
    assert out.endswith(b"\x00\x00\xff\xff")
    return out[:-4]


def test_inflated_messages_held_are_bounded_per_connection_and_per_worker(ws_server):
    """Point 18: a ~15 KiB message that inflates to 15 MiB was held twice
    per stalled connection with more input behind it (~31 MiB each), and
    nothing bounded all of them: 8 connections held ~250 MiB. Now one copy
    each, and past the worker's bound (64 MiB) the others keep their
    compressed bytes unread."""
    srv = ws_server("asgi_ws_hoard:app", "--threads", "1", "--ws-per-message-deflate")
    pid = worker_pid(srv)
    bomb = frame(2, deflated(bytes(15 << 20)), rsv=4)
    extension = ("Sec-WebSocket-Extensions: permessage-deflate",)
    warm = RawWs(("127.0.0.1", srv.port), path="/stall", extra=extension)
    assert warm.status == 101 and "permessage-deflate" in (warm.header("sec-websocket-extensions")
                                                          or "")
    time.sleep(0.3)
    before = status_kib(pid, "VmRSS")
    socks = []
    for _ in range(8):
        ws = RawWs(("127.0.0.1", srv.port), path="/stall", extra=extension)
        assert ws.status == 101
        ws.send(bomb * 2)          # the second waits behind the first: the codec's buffer kept
        socks.append(ws)
    # each bomb inflated (or left unread): the RSS stops moving
    last = [-1]

    def steady():
        time.sleep(0.5)
        now = status_kib(pid, "VmHWM")
        same, last[0] = now == last[0], now
        return same
    deadline = time.monotonic() + 30
    while not steady():
        assert time.monotonic() < deadline, "the worker's RSS never settled"
    grew = growth_mib(pid, before)
    print(f"8 stalled connections, two 15 MiB bombs each: peak RSS +{grew:.1f} MiB")
    # 64 MiB of the worker's bound, a message over it, the buffers of one
    # inflate at a time: ~85 MiB; twice that before
    assert grew < 110, f"the worker grew by {grew:.1f} MiB for 8 bombs of {len(bomb)} bytes"
    # an app that receives still gets every message, those that came
    # before its first receive() too, past the worker's bound
    echo = RawWs(("127.0.0.1", srv.port), path="/echo", extra=extension)
    assert echo.status == 101
    echo.send(b"".join(frame(1, f"m{i}".encode()) for i in range(20)))
    for i in range(20):
        op, fin, payload = echo.recv_frame(timeout=10)
        assert (op, payload) == (1, f"m{i}".encode()), (i, op, payload[:40])
    for ws in socks:                             # still open: nothing was cut to save memory
        ws.sock.setblocking(False)
        try:
            assert ws.sock.recv(1) != b"", "a stalled connection was closed"
        except BlockingIOError:
            pass
        finally:
            ws.sock.setblocking(True)
