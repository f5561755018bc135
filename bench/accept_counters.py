#!/usr/bin/env python3
"""accept_counters: every fdcore counter of each loop thread under a
connection flood, in-process (a diagnostic for accept_bench's empty wake-ups;
the workers' `totals:` lines carry only six counters).

    .venv/bin/python bench/accept_counters.py [--threads 1,2,4] [--inflight 1] [--seconds 3]

For each thread count: one sockherd.worker.loop.Loop (Table of T threads in
one group, the listener inserted EXCLUSIVE as a worker does, the stream app
echo:CloseOnConnect), bench/accept_flood.c against it for --seconds, then
the per-thread counters (loops, poll_io, accepted, accept_empty, wakeups:
eventfd wake-ups received, ctl_add/mod/del) and per accepted connection.
"""
from __future__ import annotations

import os
import socket
import sys

import benchlib as B

sys.path.insert(0, B.APPS)


def run(threads: int, groups: int, client: str, a, rotate: bool | None):
    from sockherd.fdcore import Table
    from sockherd.worker.loop import Loop
    from echo import CloseOnConnect

    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(2048)
    port = lsock.getsockname()[1]
    table = Table(threads, groups)
    loop = Loop(table, CloseOnConnect)
    if rotate is not None:
        loop.rotate_accept = rotate
    try:
        loop.add_listener(lsock)
        loop.start()
        res = B.run_json_client([client, "127.0.0.1", str(port), str(a.seconds),
                                 str(a.inflight), "16"], timeout=a.seconds + 60)
    finally:
        loop.stop()
        rows = [th.counters() for th in loop.loop_threads]
        table.close()
    return rows, res


def main() -> int:
    ap = B.arg_parser(__doc__)
    ap.add_argument("--threads", default="1,2,4", help="loop thread counts, one run each")
    ap.add_argument("--groups", type=int, default=1, help="thread groups (1)")
    ap.add_argument("--inflight", type=int, default=1, help="connects in flight (1)")
    ap.add_argument("--seconds", type=float, default=3.0, help="flood per run (3)")
    ap.add_argument("--rotate", default="on,off",
                    help="Loop.rotate_accept values to run (a43c271: after each accept batch "
                         "the thread DELs its listener registration and re-ADDs it at its "
                         "next poll); on,off (default) runs both; ignored by a Loop without it")
    a = ap.parse_args()
    client = B.build_c("accept_flood")
    keys = ("loops", "poll_io", "accepted", "accept_empty", "wakeups", "wake_nowork",
            "poll_drop_fd", "poll_skip_fd", "poll_stale", "ctl_add", "ctl_mod", "ctl_del",
            "ctl_err")
    print(B.header("accept_counters: fdcore counters per loop thread, in-process"))
    print(f"- {a.inflight} connect(s) in flight, {a.seconds:g} s per run, {a.groups} group(s)\n")
    from sockherd.fdcore import Table
    from sockherd.worker.loop import Loop
    with Table(1, 1) as probe:
        has_rotate = hasattr(Loop(probe, object), "rotate_accept")
    rotations = ([{"on": True, "off": False}[x.strip()] for x in a.rotate.split(",")]
                 if has_rotate else [None])
    rows = []
    for rot in rotations:
        for t in (int(x) for x in a.threads.split(",")):
            per_thread, res = run(t, a.groups, client, a, rot)
            tot = {k: sum(r[k] for r in per_thread) for k in keys}
            acc = max(tot["accepted"], 1)
            label = {True: "on", False: "off", None: "n/a"}[rot]
            for i, r in enumerate(per_thread):
                rows.append([label, t, i, f"{res['rate']:,.0f}"] + [r[k] for k in keys])
            rows.append([label, t, "all, per accepted", f"{res['rate']:,.0f}"]
                        + [f"{tot[k] / acc:.3f}" for k in keys])
    print(B.table(["rotate_accept", "threads", "thread", "conns/s", *keys], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
