"""The embedded default app: what bare `sockherd run` serves.

A status page of the worker that answers: master -> this worker -> its thread
groups -> their threads, each thread with its fdcore counters (HAProxy's
`show activity`). It speaks just enough HTTP/1.1 over the stream interface to
answer a browser (one GET, then close) until the WSGI server lands; the
master's view of every worker comes with the control channel.
"""
from __future__ import annotations

import html
import os
import time

from sockherd.fdcore import COUNTERS

MAX_HEAD = 8192


def _response(status: str, body: bytes, ctype: str = "text/html; charset=utf-8",
              head_only: bool = False) -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            f"Cache-Control: no-store\r\nConnection: close\r\n\r\n").encode()
    return head if head_only else head + body


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


class StatusPage:
    """Stream handler: reads one request head, answers it, closes."""

    def on_connect(self, conn):
        self.head = b""

    def on_data(self, conn, data):
        self.head += data
        if b"\r\n\r\n" not in self.head:
            if len(self.head) > MAX_HEAD:
                conn.write(_response("431 Request Header Fields Too Large",
                                     b"request head too large\n", "text/plain"))
                conn.close()
            return
        line = self.head.split(b"\r\n", 1)[0].split()
        method = line[0] if line else b""
        if len(line) != 3 or not line[2].startswith(b"HTTP/1."):
            conn.write(_response("400 Bad Request", b"bad request line\n", "text/plain"))
        elif method not in (b"GET", b"HEAD"):
            conn.write(_response("405 Method Not Allowed", b"GET or HEAD only\n", "text/plain"))
        else:
            conn.write(_response("200 OK", render(conn.loop), head_only=method == b"HEAD"))
        conn.close()
