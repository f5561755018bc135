"""A worker's figures for the master (a StatsRequest): what `sockherd ctl
show proc / show activity / show fd` and the metrics print about it.

Read from the main thread while the loop threads run: each counter is one
word the C side writes, so a read is a recent value, never a torn one;
a snapshot, not a transaction (HAProxy's `show activity` is the same).
"""
from __future__ import annotations

import dataclasses
import time

from sockherd.fdcore.table import State
from sockherd.worker.loop_core import KIND_CONN, KIND_LISTENER

STARTED = time.monotonic()


def answer(loop, what: str, fd: int = -1) -> dict:
    if what == "activity":
        return {"threads": [
            {"tid": th.tid, "tgid": th.tgid, **th.counters()} for th in loop.loop_threads]}
    if what == "fd":
        table = loop.table
        try:
            infos = [table.dump(fd)] if fd >= 0 else table.show_fd()
        except Exception as exc:                   # noqa: BLE001 - said to the asker
            return {"fds": [], "error": f"fd {fd}: {exc}"}
        return {"fds": [_fd_row(i) for i in infos if i.tgid]}
    engine = loop.engine
    # one read of the engine's counts: requests is their sum (srv_count),
    # so the two always agree in an answer (two reads could straddle one)
    responses = engine.responses if engine is not None else None
    return {
        "requests": sum(responses.values()) if responses is not None else None,
        "responses": responses,
        # requests the engine refused itself (400, 408, 413...), by reason
        "refused": engine.refused if engine is not None else None,
        # the app's requests by duration: ((bound, count)..., sum), the
        # counts per bucket, not cumulative (the master's family adds them)
        "durations": _durations(engine),
        "connections": loop.open_connections,
        # issue 23: ASGI WebSockets accepted and not closed (asgi_ws.c)
        "websockets": loop.websockets_open,
        # TLS handshakes (resumed among them), failed, abandoned, and
        # plain HTTP refused on a TLS port (conn_tls.c); None: TLS is off
        "tls": _tls(engine),
        "threads": len(loop.loop_threads),
        # fewer than threads: one ended, the worker drains to be replaced
        "threads_alive": loop.threads_alive,
        "groups": len({th.tgid for th in loop.loop_threads}),
        "uptime": round(time.monotonic() - STARTED, 3),
        "draining": loop.draining,
        # times this worker stopped accepting: out of fds (EMFILE, ENFILE...)
        # and max_connections reached (worker/loop.py)
        "accept_pauses": {"emfile": loop.paused_emfile, "max_connections": loop.paused_cap},
    }


def _durations(engine) -> dict | None:
    if engine is None:
        return None
    buckets, total = engine.durations
    # +Inf is no msgpack/JSON number a status page can show: its bound is None
    return {"bounds": [b for b, _ in buckets[:-1]], "counts": [n for _, n in buckets],
            "sum": total}


def _tls(engine) -> dict | None:
    if engine is None:
        return None
    counts = engine.tls_counts()
    return {k: v for k, v in counts.items() if k != "on"} if counts.pop("on") else None


KINDS = {KIND_LISTENER: "listener", KIND_CONN: "connection"}


def _fd_row(info) -> dict:
    row = dataclasses.asdict(info)
    row["owner_kind"] = KINDS.get(info.kind, str(info.kind))
    row["state"] = "|".join(f.name.lower() for f in State if f and f in info.state) or "-"
    return row
