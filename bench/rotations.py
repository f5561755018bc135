"""Servers side by side, measured in rotations (issue 24's tls_hello.py and
accesslog_cost.py): on a shared 2-core machine one run of A, B, C says little,
so every round measures every (load, server) pair with the servers' order
turned by one (A B C, B C A, C A B, ...), each row through http_hello's
measure_quiet (a wait for a quiet box, a disturbed row measured again), and
the report gives each server's median and range over the rounds, and ratios
paired within a round (server / its base in the same round and load).

A bench script gives: its servers (name -> http_hello.Server spec function),
its loads (name -> (http_hello load, client function or None)), and for each
server the name of the row it is compared with.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import benchlib as B
import http_hello as H


def add_arguments(ap: argparse.ArgumentParser, rounds: int = 3) -> None:
    """The options every rotation bench takes (http_hello's, and --rounds)."""
    ap.add_argument("--seconds", type=float, default=6.0, help="measured seconds per row (6)")
    ap.add_argument("--warmup", type=float, default=1.0,
                    help="an uncounted run of the same load before each row (1)")
    ap.add_argument("--rounds", type=int, default=rounds,
                    help=f"rotations: every (load, server) row once per round, the servers' "
                         f"order turned by one each round ({rounds})")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 2 s rows, 1 s warm-up, 1 round")
    add_quiet_arguments(ap, budget=600)


def add_quiet_arguments(ap: argparse.ArgumentParser, budget: float) -> None:
    """The options of measure_quiet's rows (http_hello.measure_quiet), and
    --json: what a row during which other processes were busy does."""
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    ap.add_argument("--max-other", type=float, default=0.3, metavar="CORES",
                    help="a row during which other processes took more than this many cores "
                         "is measured again (0.3)")
    ap.add_argument("--retries", type=int, default=1,
                    help="at most this many repeats of a disturbed row (1)")
    ap.add_argument("--row-wait", type=float, default=10, metavar="S",
                    help="before each row, wait up to S s for the box below 0.3 busy cores (10)")
    ap.add_argument("--budget", type=float, default=budget, metavar="S",
                    help=f"no repeats and no waits before a row after S s into the run "
                         f"({budget:g})")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                    help="first wait up to S s for the machine below 0.3 busy cores (0)")


def parser(doc: str, servers) -> argparse.ArgumentParser:
    """A side-by-side bench's parser: add_arguments's options, --only (of
    servers) and --checkout."""
    ap = B.arg_parser(doc)
    add_arguments(ap)
    ap.add_argument("--only", default=",".join(servers),
                    help="servers (default: all): " + ",".join(servers))
    ap.add_argument("--checkout", default=B.ROOT, metavar="DIR",
                    help="the sockherd tree to measure (its .venv/bin/sockherd); default: this one")
    return ap


def chosen(ap: argparse.ArgumentParser, a, servers) -> list[str]:
    """After parse_args: --quick applied, and the servers --only names
    (an unknown one is a usage error)."""
    quick(a)
    only = [s for s in a.only.split(",") if s]
    for s in only:
        if s not in servers:
            ap.error(f"unknown server {s!r}")
    return only


def check_tools(only: list[str]) -> None:
    """The peers' venv when a peer is measured, and wrk (BenchError)."""
    if any(not s.startswith("sockherd") for s in only):
        B.check_peers_venv()
    if subprocess.run(["sh", "-c", "command -v wrk"], capture_output=True).returncode != 0:
        raise B.BenchError("wrk missing: run `sh bench/setup_peers.sh` first")


def print_head(head: str, quiet: str, load0: str, peers: str, a, elapsed: float) -> None:
    """The report's first lines: the machine, the wait for a quiet box, the
    load average, the peers' versions, the rounds."""
    print(head)
    if quiet:
        print(f"- {quiet}")
    print(f"- load average (1/5/15 min) at the start: {load0}; at the end: {loadavg()}")
    print(f"- peers: {peers}")
    print(f"- {a.rounds} round(s) of {a.seconds:g} s rows after an uncounted {a.warmup:g} s run "
          f"of the same load; servers side by side, their order turned by one each round; "
          f"total {elapsed:.0f} s")


def quick(a) -> None:
    """--quick: 2 s rows, 1 round. The warm-up stays 1 s: wrk takes whole
    seconds only (`-d 0.5s` prints its usage and runs nothing)."""
    if a.quick:
        a.seconds, a.warmup, a.rounds = 2.0, 1.0, 1


def rotated(names: list[str], rnd: int) -> list[str]:
    """names turned left by rnd - 1: round 1 A B C, round 2 B C A, ..."""
    k = (rnd - 1) % len(names) if names else 0
    return names[k:] + names[:k]


def start(procs: B.Procs, tmp: str, specs: dict) -> tuple[dict[str, H.Server], str]:
    """Starts every server (specs: name -> (spec function, expected body))
    and waits until each answers; (the servers by name, wrk's done.lua)."""
    lua = f"{tmp}/done.lua"
    with open(lua, "w") as f:
        f.write(H.LUA_DONE)
    servers: dict[str, H.Server] = {}
    for name, (spec, body) in specs.items():
        print(f"# starting {name}", file=sys.stderr, flush=True)
        servers[name] = H.Server(procs, tmp, name, spec, expect=body)
    for srv in servers.values():
        srv.wait_ready()
        print(f"# {srv.name} ready on {srv.port}: pids {srv.pids}", file=sys.stderr, flush=True)
    return servers, lua


def row(srv: H.Server, ld: str, h_load: str, a, lua: str, t_start: float, rnd: int,
        failures: list[str], client=None) -> dict | None:
    """One row of srv under h_load (http_hello.measure_quiet), named ld;
    None when it failed (srv.failed says why, added to failures: the server
    is measured no more)."""
    try:
        r = H.measure_quiet(srv, h_load, a, lua, t_start, client)
    except (B.BenchError, subprocess.TimeoutExpired) as e:
        srv.failed = H.failure_report(srv, ld, rnd, e, t_start)
        failures.append(srv.failed)
        print(f"# {srv.name} {ld}: FAILED: {e}", file=sys.stderr, flush=True)
        return None
    r.update(round=rnd, load=ld)
    print(f"# [{time.monotonic() - t_start:5.0f}s] round {rnd} {ld} {srv.name}: "
          f"{r['rps']:,.0f} req/s, {r['per_cpu_s']:,.0f} per CPU-s, client "
          f"{r['wrk_cpu']:.2f} cores, other {r['other']:.2f}; "
          f"{'; '.join(r['notes'])}", file=sys.stderr, flush=True)
    return r


def run(procs: B.Procs, tmp: str, specs: dict, loads: dict, a, t_start: float):
    """Starts every server (specs: name -> (spec function, expected body)),
    waits until each answers, then measures the rounds. loads: name ->
    (http_hello's load it uses for wrk and the probe, client(srv) -> the
    client(seconds) argv function, or None for wrk). Returns (servers,
    results, failures); every row has "round" and "order" (its place in the
    round's rotation)."""
    servers, lua = start(procs, tmp, specs)
    results, failures = [], []
    names = list(servers)
    for rnd in range(1, a.rounds + 1):
        for ld, (h_load, client_for) in loads.items():
            for order, name in enumerate(rotated(names, rnd)):
                srv = servers[name]
                if srv.failed:
                    continue
                r = row(srv, ld, h_load, a, lua, t_start, rnd, failures,
                        client_for(srv) if client_for else None)
                if r is not None:
                    r["order"] = order + 1
                    results.append(r)
    return servers, results, failures


def errors(r: dict) -> int:
    return r["status"] + r["connect"] + r["read"] + r["write"] + r["timeout"]


def span(values: list[float], fmt: str = "{:,.0f}") -> str:
    """median (min-max); one value alone"""
    if not values:
        return "-"
    med = fmt.format(statistics.median(values))
    if len(values) == 1:
        return med
    return f"{med} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def paired(results: list[dict], name: str, base: str, load: str, key: str) -> list[float]:
    """name's key over base's key, per round of that load (rounds with both)."""
    out = []
    for r in results:
        if r["server"] != name or r["load"] != load:
            continue
        b = [x for x in results if x["server"] == base and x["load"] == load
             and x["round"] == r["round"]]
        if b and b[0][key]:
            out.append(r[key] / b[0][key])
    return out


def summary(results: list[dict], load: str, bases: dict[str, str], names: list[str]) -> str:
    """The load's table: per server, median (range) over rounds of req/s and
    req per server CPU-s, the paired ratios to its base, server and client CPU
    per request, errors."""
    rows = []
    for name in names:
        rs = [r for r in results if r["server"] == name and r["load"] == load]
        if not rs:
            continue
        base = bases.get(name)
        rows.append([
            name, len(rs), span([r["rps"] for r in rs]),
            span(paired(results, name, base, load, "rps"), "{:.2f}") if base else "-",
            span([r["per_cpu_s"] for r in rs]),
            span(paired(results, name, base, load, "per_cpu_s"), "{:.2f}") if base else "-",
            span([r["cpu_s"] / r["requests"] * 1e6 for r in rs if r["requests"]], "{:.0f}"),
            span([r["wrk_cpu"] * r["window"] / r["requests"] * 1e6 for r in rs
                  if r["requests"]], "{:.0f}"),
            span([r["p99"] / 1000 for r in rs], "{:.2f}"),
            sum(errors(r) for r in rs), base or "-"])
    return B.table(["server", "rounds", "req/s median (min-max)", "vs base, paired",
                    "req per server CPU-s", "vs base, paired", "server CPU µs per req",
                    "client CPU µs per req", "p99 ms", "errors (all rounds)", "base"], rows)


def rows_table(results: list[dict], load: str) -> str:
    """Every measured row of the load, in the order measured."""
    rows = []
    for r in results:
        if r["load"] != load:
            continue
        rows.append([r["round"], r["order"], r["server"], f"{r['rps']:,.0f}",
                     H.fmt_ms(r["p50"]), H.fmt_ms(r["p99"]),
                     f"{r['status']} / {r['connect']}/{r['read']}/{r['write']}/{r['timeout']}",
                     f"{r['cpu_s']:.2f}", f"{r['cores']:.2f}", f"{r['per_cpu_s']:,.0f}",
                     f"{r['wrk_cpu']:.2f}", f"{r['box']:.2f}", f"{r['other']:.2f}",
                     "; ".join(r["notes"]) or "-"])
    return B.table(["round", "order", "server", "req/s", "p50 ms", "p99 ms",
                    "errors: non-2xx / conn/read/write/timeout", "server CPU s",
                    "server cores", "req per server CPU-s", "client cores", "box busy",
                    "other", "notes"], rows)


def loadavg() -> str:
    la = os.getloadavg()
    return f"{la[0]:.2f} / {la[1]:.2f} / {la[2]:.2f}"


def finish(results: list[dict], failures: list[str], loads, a) -> int:
    """The report's end: every row of each load, the failures, the load
    average, the JSON (--json); the exit status (http_hello's rule)."""
    print("\n#### Every row\n")
    for ld in loads:
        print(f"\n{ld}:\n")
        print(rows_table(results, ld))
    return end(results, failures, a)


def end(results: list[dict], failures: list[str], a) -> int:
    """The failures, the footer, the rows as JSON (--json); the exit status
    (http_hello's rule)."""
    if failures:
        print("\n#### FAILURES\n")
        for f_ in failures:
            print(f_)
    print(B.footer())
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return H.exit_status(results, failures)
