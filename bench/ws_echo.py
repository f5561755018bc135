#!/usr/bin/env python3
"""ws_echo: WebSocket echo throughput and memory per idle WebSocket of
sockherd, uvicorn (--ws websockets) and granian, in the same run (issue 23).

    .venv/bin/python bench/ws_echo.py [--rotations 3] [--seconds 6] [--kinds text,binary]
        [--idle 5000] [--only sockherd,uvicorn,granian] [--deflate] [--json rows.json]

Every server serves tests/apps/asgi_ws_echo.py (a bare ASGI echo) with 2
worker processes, side by side (idle while another is measured):

  sockherd  sockherd run asgi_ws_echo:app --interface asgi -w 2 --threads 1
  uvicorn   uvicorn asgi_ws_echo:app --workers 2 --ws websockets --http httptools
            --loop uvloop --no-access-log
  granian   granian --interface asgi --workers 2 asgi_ws_echo:app

Echo: bench/ws_echo_client.c (built into bench/build) opens 50 WebSockets
and runs a closed loop per connection: a masked 1 KiB message (text, ASCII;
or binary), the echo awaited and checked, the next one. 1 s uncounted, then
--seconds counted. Per row: messages/s; the server tree's CPU over the
counted window (utime + stime of every process, /proc) and messages per
server CPU-second; the client's CPU share (its CPU seconds / window /
threads: well below 1.0 means the client waited for the server, i.e. it was
not the bottleneck); the machine's busy cores. Rows rotate: each rotation
runs the servers in another order, so drift on this shared machine hits
all alike; medians and ranges over rotations are printed, with ratios.

--deflate: the echo with permessage-deflate (RFC 7692) negotiated: the
client offers it (client_no_context_takeover, as a browser's offer may
carry), sends every message compressed and inflates the server's
compressed echoes before comparing them (bench/ws_echo_client.c). sockherd
runs with --ws-per-message-deflate (off by default), uvicorn with
--ws-per-message-deflate True (its default), granian as it is (it has no
such setting): a server that does not take the offer gets no row, and the
report says so. Idle rows are unchanged (no offer).

Idle memory: per server and rotation, on a server started for it (a
server's heap keeps what earlier connections freed, and would hide the
next ones' cost): 200 WebSockets opened first (warm-up: first
allocations, buffers sized), the tree's RSS (sum of VmRSS of the server and
its workers) read; then --idle more, upgraded, left idle; RSS read again
once it stopped changing; (after - before) / idle. RLIMIT_NOFILE's soft
limit is raised to the hard one for this process and the servers it starts
(sockherd's workers size their fd tables by it; no --max-connections cap).

Exit status: 0; 1 when an echo row had mismatches or lost connections or
an idle connection was refused; 2 for a set-up problem.
"""
from __future__ import annotations

import json
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import time

import benchlib as B
import http_hello as H

SERVERS = ("sockherd", "uvicorn", "granian")
# also accepted by --only: uvicorn with the websockets-sansio implementation,
# which uvicorn says `--ws websockets` will point at in a future release; and
# sockherd with 2 loop threads per worker (a share of a loaded machine's
# cores grows with the runnable threads a server has: see RESULTS.md)
EXTRA = ("uvicorn-sansio", "sockherd-t2")
TESTS_APPS = os.path.join(B.ROOT, "tests", "apps")
WORKERS = 2
CONNS = 50
SIZE = 1024


def spec_for(server: str, tmp: str, tag: str = "echo", deflate: bool = False):
    """H.Server's spec function; tag names sockherd's runtime dir (each
    master needs its own control endpoint); deflate: permessage-deflate
    on where the server has a setting for it."""
    def spec(port: int) -> dict:
        app = "asgi_ws_echo:app"
        if server in ("sockherd", "sockherd-t2"):
            t = "1" if server == "sockherd" else "2"
            pmd = ["--ws-per-message-deflate"] if deflate else []
            return {"argv": [B.SOCKHERD, "run", app, "--interface", "asgi", "-w", str(WORKERS),
                             "--threads", t, "-b", f"127.0.0.1:{port}", "--pythonpath", TESTS_APPS,
                             "--runtime-dir", os.path.join(tmp, f"run-{server}-{tag}"), *pmd],
                    "ready": (r"worker \d+\.\d+: ready, pid", WORKERS),
                    "desc": f"sockherd run {app} --interface asgi -w {WORKERS} --threads {t} "
                            + " ".join(pmd)}
        if server in ("uvicorn", "uvicorn-sansio"):
            impl = "websockets" if server == "uvicorn" else "websockets-sansio"
            pmd = ["--ws-per-message-deflate", "True"] if deflate else []
            return {"argv": [H.peer_bin("uvicorn"), app, "--app-dir", TESTS_APPS,
                             "--host", "127.0.0.1", "--port", str(port), "--workers",
                             str(WORKERS), "--ws", impl, "--http", "httptools",
                             "--loop", "uvloop", "--no-access-log", *pmd],
                    "ready": (r"Application startup complete", WORKERS),
                    "desc": f"uvicorn {app} --workers {WORKERS} --ws {impl} --http "
                            "httptools --loop uvloop --no-access-log " + " ".join(pmd)}
        if server == "granian":
            return {"argv": [H.peer_bin("granian"), "--interface", "asgi", "--workers",
                             str(WORKERS), "--host", "127.0.0.1", "--port", str(port),
                             "--working-dir", TESTS_APPS, app],
                    "ready": (r"Started worker-\d+", WORKERS),
                    "desc": f"granian --interface asgi --workers {WORKERS} {app}"}
        raise ValueError(server)
    return spec


def tree_ticks(root: int) -> int:
    return sum(H.proc_ticks(root).values())


def tree_rss_kib(root: int) -> int:
    total = 0
    for pid in B.tree(root):
        try:
            with open(f"/proc/{pid}/status") as f:
                total += int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))
        except (OSError, AttributeError):
            pass
    return total


# ---- echo ------------------------------------------------------------------------------------
class NoDeflate(Exception):
    """The server did not take the client's permessage-deflate offer."""


def echo_row(client: str, srv: H.Server, kind: str, seconds: float, threads: int,
             deflate: bool = False) -> dict:
    opcode = "1" if kind == "text" else "2"
    warmup = 1.0
    with B.BoxMeter() as box:
        p = subprocess.Popen([client, "127.0.0.1", str(srv.port), str(CONNS), str(seconds),
                              str(SIZE), str(warmup), str(threads), opcode,
                              "1" if deflate else "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # the server's CPU over (about) the client's counted window: the
        # upgrades take a few ms, the window starts `warmup` after them
        time.sleep(warmup + 0.05)
        t0, k0 = time.monotonic(), tree_ticks(srv.p.pid)
        out, err = p.communicate(timeout=seconds + 60)
        t1, k1 = time.monotonic(), tree_ticks(srv.p.pid)
    if p.returncode == 3 and deflate:
        raise NoDeflate(err.strip())
    if p.returncode != 0:
        raise B.BenchError(f"ws_echo_client against {srv.name}: exit {p.returncode}: {err}")
    r = {}
    for kv in out.split():
        k, v = kv.split("=", 1)
        r[k] = float(v)
    server_cores = (k1 - k0) / B.CLK_TCK / (t1 - t0)
    return {"server": srv.name, "kind": kind, "rate": r["rate"],
            "server_cores": server_cores,
            "per_cpu_s": r["rate"] / server_cores if server_cores else 0.0,
            "client_share": r["cpu"] / r["seconds"] / r["threads"],
            "busy": box.busy_cores, "mismatch": int(r["mismatch"]), "lost": int(r["lost"]),
            "stalled": int(r["stalled"]), "min_conn": int(r["min_conn"]),
            "max_conn": int(r["max_conn"]), "load": os.getloadavg()[0]}


# ---- idle memory -----------------------------------------------------------------------------
def open_websockets(port: int, n: int, batch: int = 250) -> list[socket.socket]:
    """n upgraded, idle WebSockets; the handshakes pipelined by batches."""
    req = (f"GET /echo HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
           "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
           "Sec-WebSocket-Version: 13\r\n\r\n").encode()
    out = []
    while len(out) < n:
        socks = []
        for _ in range(min(batch, n - len(out))):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(req)
            socks.append(s)
        for s in socks:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = s.recv(4096)
                if not chunk:
                    raise B.BenchError(f"an idle WebSocket got EOF: {head[:80]!r}")
                head += chunk
            if not head.startswith(b"HTTP/1.1 101"):
                raise B.BenchError(f"upgrade refused: {head[:80]!r}")
        out += socks
    return out


def settled_rss(root: int, timeout: float = 20.0) -> int:
    """The tree's RSS once two reads 0.5 s apart agree within 1%."""
    last = tree_rss_kib(root)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = tree_rss_kib(root)
        if abs(now - last) <= last / 100:
            return now
        last = now
    return last


def idle_row(srv: H.Server, n: int) -> dict:
    warm = open_websockets(srv.port, 200)
    conns: list[socket.socket] = []
    try:
        before = settled_rss(srv.p.pid)
        t0 = time.monotonic()
        conns = open_websockets(srv.port, n)
        opened = time.monotonic() - t0
        after = settled_rss(srv.p.pid)
    finally:
        for s in warm + conns:
            s.close()
    return {"server": srv.name.split("-idle")[0], "n": n, "before_kib": before, "after_kib": after,
            "bytes_per_conn": (after - before) * 1024 / n, "open_s": opened,
            "load": os.getloadavg()[0]}


# ---- report ----------------------------------------------------------------------------------
def rng(values, fmt="{:,.0f}") -> str:
    values = sorted(values)
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(values[0])}–{fmt.format(values[-1])})"


def report(rows: list[dict], idles: list[dict], servers: list[str], kinds: list[str]) -> None:
    deflate = any(r.get("deflate") for r in rows)
    print("\n#### Echo, 1 KiB messages, 50 connections, 2 workers"
          + (", permessage-deflate negotiated" if deflate else "")
          + " (median (min–max) over rotations)\n")
    table = []
    med = {}
    for kind in kinds:
        for s in servers:
            rs = [r for r in rows if r["server"] == s and r["kind"] == kind]
            if not rs:
                continue
            med[(s, kind)] = (statistics.median(r["rate"] for r in rs),
                              statistics.median(r["per_cpu_s"] for r in rs))
            table.append([kind, s, rng([r["rate"] for r in rs]),
                          rng([r["per_cpu_s"] for r in rs]),
                          rng([r["server_cores"] for r in rs], "{:.2f}"),
                          rng([r["client_share"] for r in rs], "{:.2f}"),
                          rng([r["busy"] for r in rs], "{:.2f}"),
                          rng([r["load"] for r in rs], "{:.1f}"),
                          sum(r["mismatch"] + r["lost"] + r["stalled"] for r in rs)])
    print(B.table(["msg", "server", "messages/s", "messages per server CPU-s",
                   "server cores", "client CPU share", "machine busy cores", "load avg",
                   "mismatch+lost+stalled"], table))
    if "sockherd" in servers:
        print("\nsockherd / peer (medians):\n")
        ratio_rows = []
        for kind in kinds:
            for s in servers:
                if s == "sockherd" or (s, kind) not in med or ("sockherd", kind) not in med:
                    continue
                a, b = med[("sockherd", kind)], med[(s, kind)]
                ratio_rows.append([kind, f"sockherd / {s}", f"{a[0] / b[0]:.2f}x",
                                   f"{a[1] / b[1]:.2f}x"])
        print(B.table(["msg", "ratio", "messages/s", "messages per server CPU-s"], ratio_rows))
    if idles:
        n = idles[0]["n"]
        print(f"\n#### Memory per idle WebSocket ({n:,} idle, after 200 warm-up ones; "
              "RSS of the whole server tree)\n")
        table = []
        for s in servers:
            rs = [r for r in idles if r["server"] == s]
            if rs:
                table.append([s, rng([r["before_kib"] for r in rs]),
                              rng([r["after_kib"] for r in rs]),
                              rng([r["bytes_per_conn"] for r in rs]),
                              rng([r["open_s"] for r in rs], "{:.1f}")])
        print(B.table(["server", "RSS before (KiB)", "RSS after (KiB)", "bytes per WebSocket",
                       f"seconds to open {n:,}"], table))


def main() -> int:
    ap = B.arg_parser(__doc__)
    ap.add_argument("--rotations", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=6.0, help="counted seconds per echo row")
    ap.add_argument("--kinds", default="text,binary")
    ap.add_argument("--threads", type=int, default=1, help="client threads (1)")
    ap.add_argument("--idle", type=int, default=5000, help="idle WebSockets (0: no idle rows)")
    ap.add_argument("--only", default=",".join(SERVERS))
    ap.add_argument("--deflate", action="store_true",
                    help="echo rows with permessage-deflate negotiated (see below)")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args()
    servers = [s for s in a.only.split(",") if s]
    for s in servers:
        if s not in SERVERS + EXTRA:
            ap.error(f"unknown server {s!r}: {', '.join(SERVERS + EXTRA)}")
    kinds = [k for k in a.kinds.split(",") if k]
    try:
        B.check_sockherd()
        if set(servers) - {"sockherd"}:
            B.check_peers_venv("websockets")
        client = B.build_c("ws_echo_client", flags=["-pthread"], libs=["-lz"])
    except (B.BenchError, subprocess.CalledProcessError) as e:
        print(e, file=sys.stderr)
        return 2
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < a.idle + 1200:
        print(f"RLIMIT_NOFILE hard limit {hard} < {a.idle + 1200}: lower --idle",
              file=sys.stderr)
        return 2
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(B.header("ws_echo: WebSocket echo and idle memory, 2 worker processes each"))
    print(f"- RLIMIT_NOFILE {hard} (soft = hard) for the bench and the servers")
    rows: list[dict] = []
    idles: list[dict] = []
    no_deflate: dict[str, str] = {}             # --deflate: servers that did not take it
    if a.deflate:
        print("- echo with permessage-deflate negotiated (--deflate): the client offers "
              "`permessage-deflate; client_no_context_takeover; client_max_window_bits`")
    with B.Procs() as procs, B.tempdir("ws_echo-") as tmp:
        srvs = {}
        for s in servers:
            srvs[s] = H.Server(procs, tmp, s, spec_for(s, tmp, deflate=a.deflate),
                               expect=b"ws echo")
        for s in servers:
            srvs[s].wait_ready()
            print(f"- {s}: `{srvs[s].spec['desc']}`")
        for rot in range(a.rotations):
            order = servers[rot % len(servers):] + servers[:rot % len(servers)]
            for kind in kinds:
                for s in order:
                    if s in no_deflate:
                        continue
                    try:
                        r = echo_row(client, srvs[s], kind, a.seconds, a.threads, a.deflate)
                    except NoDeflate as e:
                        no_deflate[s] = str(e)
                        print(f"# {s}: {e}: no --deflate rows", file=sys.stderr, flush=True)
                        continue
                    r["deflate"] = a.deflate
                    r["rotation"] = rot
                    rows.append(r)
                    print(f"# rotation {rot} {kind} {s}: {r['rate']:,.0f} msg/s, "
                          f"{r['per_cpu_s']:,.0f} per CPU-s, client share "
                          f"{r['client_share']:.2f}, load {r['load']:.1f}",
                          file=sys.stderr, flush=True)
            if a.idle:
                # a fresh server each time: memory a server freed after earlier
                # connections stays in its heap and would be reused unseen
                for s in order:
                    fresh = H.Server(procs, tmp, f"{s}-idle{rot}",
                                     spec_for(s, tmp, f"idle{rot}"), expect=b"ws echo")
                    fresh.wait_ready()
                    r = idle_row(fresh, a.idle)
                    fresh.stop()
                    r["rotation"] = rot
                    idles.append(r)
                    print(f"# rotation {rot} idle {s}: {r['bytes_per_conn']:,.0f} B/conn",
                          file=sys.stderr, flush=True)
        for s, why in no_deflate.items():
            print(f"- {s}: no echo rows: {why} (it answered the offer without the extension)")
        for s in servers:
            problems = srvs[s].new_log_problems()
            if problems:
                print(f"- {s} logged: {problems[:3]}")
    report(rows, idles, servers, kinds)
    print(B.footer())
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"echo": rows, "idle": idles}, f, indent=1)
    bad = any(r["mismatch"] or r["lost"] for r in rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
