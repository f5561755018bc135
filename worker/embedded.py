"""The embedded default app: what bare `sockherd run` serves.

A status page of the worker that answers: master -> this worker -> its thread
groups -> their threads, each thread with its fdcore counters (HAProxy's
`show activity`), as a WSGI app; the master's view of every worker comes
with the control channel.
"""
from __future__ import annotations

import html
import os
import time

from sockherd.fdcore import COUNTERS


def render(loop) -> bytes:
    """The page, from the live table of the worker `loop` runs in."""
    gen, idx = getattr(loop, "identity", (0, 0))
    groups: dict[int, list] = {}
    for th in loop.loop_threads:
        groups.setdefault(th.tgid, []).append(th)
    rows = []
    for tgid, threads in sorted(groups.items()):
        rows.append(f"<li>thread group {tgid}<ul>")
        for th in threads:
            c = th.counters()
            cells = "".join(f"<td>{c[name]}</td>" for name in COUNTERS)
            rows.append(f"<li>thread {th.tid} <table><tr>{''.join(f'<th>{n}</th>' for n in COUNTERS)}"
                        f"</tr><tr>{cells}</tr></table></li>")
        rows.append("</ul></li>")
    listeners = ", ".join(str(fd) for fd in sorted(loop.listeners)) or "none (draining)"
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>sockherd status</title>
<style>body{{font-family:sans-serif}} table{{border-collapse:collapse;font-size:smaller}}
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}</style></head>
<body><h1>sockherd</h1>
<p>Answered by worker {gen}.{idx} at {html.escape(time.strftime('%Y-%m-%d %H:%M:%S'))}.
The master's view of every worker arrives with the control channel.</p>
<ul><li>master pid {os.getppid()}<ul>
<li>worker {gen}.{idx}, pid {os.getpid()}, {len(loop.conns)} open connections,
listener fds {html.escape(listeners)}<ul>
{''.join(rows)}
</ul></li></ul></li></ul></body></html>
"""
    return page.encode()


def status_app(environ, start_response):
    """The embedded page as a WSGI app (served by the wsgi interface, so
    it gets the same strict parsing and keep-alive as any app)."""
    if environ["REQUEST_METHOD"] not in ("GET", "HEAD"):
        start_response("405 Method Not Allowed", [("Content-Type", "text/plain"),
                                                  ("Allow", "GET, HEAD")])
        return [b"GET or HEAD only\n"]
    start_response("200 OK", [("Content-Type", "text/html; charset=utf-8"),
                              ("Cache-Control", "no-store")])
    return [render(environ["sockherd.loop"])]
