"""The `timeout` setting: a request that stays in the app too long.

gunicorn kills a worker whose request outlives `timeout`, because its
heartbeat comes from the thread that runs requests. Ours come from the main
thread, which never runs one: a hung handler (a call that never returns, an
endless loop) went unnoticed, its connection and its thread lost for good.

What is watched: each loop thread's busy stamp (worker/relief.py's list,
written by the engine, worker/native/engine/engine.c and dispatch.c, when it enters
a connection's handler, and by the Python loop for stream handlers; 0.0 out
of them; for an ASGI app by the loop thread's asyncio iteration around the
ready callbacks it runs, worker/aio_native/runner.c, so that a loop blocked
in the app is noticed too: issue 35 point 7). The worker's main thread,
which serves the channel, looks when the oldest stamp reaches `timeout`
(no wake-up at all while no thread is busy longer than a heartbeat
interval: its select already wakes for those).

What it does, once per worker: logs the request (method, path, seconds) and
every stuck thread's Python stack (sys._current_frames: the app's own frames,
which gunicorn never shows), then asks the master to replace the worker
(Retiring with the reason): a new worker READY first, then this one drains:
it stops accepting, its other requests finish, and the master kills it at
hard_stop_after if the stuck one never does.

The request is found in the stuck thread's frames: the outermost local that
is a WSGI environ (REQUEST_METHOD) or an ASGI scope (type http/websocket),
so nothing is recorded per request on the hot path.
"""
from __future__ import annotations

import logging
import sys
import traceback
from dataclasses import dataclass

log = logging.getLogger("sockherd.worker")


@dataclass
class Stuck:
    thread: int              # the loop thread's tid
    seconds: float
    request: str             # "GET /path" or what is known
    stack: str


class StuckWatch:
    def __init__(self, loop, timeout: float):
        self.loop = loop
        self.timeout = timeout
        self.fired = False

    def due(self) -> float | None:
        """When the oldest handler now running reaches the timeout
        (monotonic), None if off, fired already or no thread is busy."""
        if not self.timeout or self.fired:
            return None
        stamps = [t for t in self.loop.relief.busy if t]
        return min(stamps) + self.timeout if stamps else None

    def check(self, now: float) -> list[Stuck]:
        """The loop threads in one handler for timeout or longer (empty if
        none, or if this worker told already)."""
        if not self.timeout or self.fired:
            return []
        busy = self.loop.relief.busy
        late = [i for i, t in enumerate(busy) if t and now - t >= self.timeout]
        if not late:
            return []
        self.fired = True
        frames = sys._current_frames()
        found = []
        for i in late:
            since = busy[i]
            thread = self.loop._threads[i] if i < len(self.loop._threads) else None
            frame = frames.get(thread.ident) if thread is not None else None
            found.append(Stuck(thread=self.loop.loop_threads[i].tid,
                               seconds=now - since if since else self.timeout,
                               request=_request_of(frame),
                               stack="".join(traceback.format_stack(frame)) if frame else "?"))
        return found


def _request_of(frame) -> str:
    """The request the stuck thread serves, from its frames' locals."""
    chain = []
    while frame is not None:
        chain.append(frame)
        frame = frame.f_back
    for f in reversed(chain):                 # outermost first: the app's entry
        try:
            values = list(f.f_locals.values())
        except Exception:                     # noqa: BLE001 - a frame's locals may not be readable
            continue
        for v in values:
            if isinstance(v, dict):
                if "REQUEST_METHOD" in v:
                    path = v.get("SCRIPT_NAME", "") + v.get("PATH_INFO", "")
                    query = v.get("QUERY_STRING", "")
                    return f"{v['REQUEST_METHOD']} {path}{'?' + query if query else ''}"
                if v.get("type") in ("http", "websocket") and "path" in v:
                    return f"{v.get('method', 'WEBSOCKET')} {v.get('root_path', '')}{v['path']}"
    return "a handler (no HTTP request found in its frames)"


def describe(found: list[Stuck], timeout: float) -> tuple[str, str]:
    """(the reason told to the master, the log text with the stacks)."""
    first = max(found, key=lambda s: s.seconds)
    reason = (f"timeout: request {first.request} in the app for {first.seconds:.1f}s "
              f"(timeout {timeout:g}s)")
    parts = [f"request {s.request} in the app for {s.seconds:.1f}s on thread {s.thread} "
             f"(timeout {timeout:g}s); its stack:\n{s.stack.rstrip()}" for s in found]
    return reason, "\n".join(parts)
