"""The control ROUTER's 64 KiB request limit (ipc/control.py MAX_REQUEST)
and its bound on the envelope, on a real master."""
from __future__ import annotations

import json

import pytest
import zmq

from test_control_odd_and_concurrent_requests import Client, _ask
from test_run import master  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(60)


def test_a_multipart_request_over_the_limit_in_all_is_refused(master, tmp_path):
    """Defect: only the last frame was measured, so a DEALER sending any
    number of frames under 64 KiB each before a valid request had them all
    kept and echoed back in the reply (an unbounded request). Now the
    envelope is one frame of at most 255 bytes after the routing id (issue
    19 §5): more is refused, and nothing of it comes back."""
    m = master("-w", "1", ready=1)
    with Client(tmp_path) as c:
        c.send(*([b"e" * 40000] * 5), b'{"command": "status"}')
        assert c.sock.poll(10000), "no reply"
        reply = c.sock.recv_multipart()
        got = json.loads(reply[-1])
        assert got["ok"] is False and "request of 6 frames after the routing id (the " \
            "largest envelope frame 40000 bytes)" in got["error"], got
        assert reply[:-1] == [], "the oversized envelope came back"
        c.send(*([b""] * 40), b'{"command": "status"}')      # bytes are not all
        assert c.sock.poll(10000), "no reply to 41 frames"
        assert "request of 41 frames" in json.loads(c.sock.recv_multipart()[-1])["error"]
    # a REQ client over the limit gets its refusal through its delimiter
    with Client(tmp_path, zmq.REQ) as req:
        req.sock.send(b'{"command": "status", "args": {}}' + b" " * 70000)
        assert req.sock.poll(10000), "no reply to REQ"
        assert json.loads(req.sock.recv())["error"] == "request of 70033 bytes: at most 65536"
    assert _ask(tmp_path, "status")["result"]["pid"] == m.proc.pid
