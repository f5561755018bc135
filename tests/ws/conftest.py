"""Fixtures of the WebSocket tests: the in-process ASGI server of
tests/worker/conftest.py (a real Loop and Table, loopback, the native
engine; its ASAN build when SOCKHERD_HTTP_MODULE names one), and a raw
WebSocket client (wsclient.py) for the cases no well-behaved client
sends."""
from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "ws_worker_fixtures", Path(__file__).resolve().parents[1] / "worker" / "conftest.py")
_worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_worker)

serve_stream = _worker.serve_stream
serve_asgi = _worker.serve_asgi
