#!/usr/bin/env python3
"""ws_conformance: the RFC 6455 conformance cases of tests/ws_conformance
run against sockherd, uvicorn (--ws websockets) and granian, and a table of
how each server fares per case group (issue 23).

    .venv/bin/python bench/ws_conformance.py [--servers sockherd,uvicorn,granian]
        [--markdown]

`make test` runs the sockherd cases only; the peers' cases need their
commands, which bench/setup_peers.sh installs into bench/.venv-peers: this
script names that bin directory in SOCKHERD_WS_PEERS_BIN and runs pytest
(sockherd's .venv) over the cases, two xdist workers, a JUnit XML report
parsed for the table. Per group and server: passed / cases, then every
failed case with what the server did instead (the assertion's `where`
line: the close code it sent, `no close frame`, the HTTP status).

Exit status: 0 when every sockherd case passed (the peers' failures are
findings about them, not errors of this script); 1 otherwise; 2 for a
set-up problem (no .venv, no peers venv).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import defaultdict

import benchlib as B

CASES = os.path.join(B.ROOT, "tests", "ws_conformance")
SERVERS = ("sockherd", "uvicorn", "granian")


def run_cases(servers: list[str], xml_path: str) -> int:
    env = {**os.environ, "SOCKHERD_WS_PEERS_BIN": os.path.join(B.PEERS_VENV, "bin")}
    argv = [os.path.join(B.ROOT, ".venv", "bin", "python"), "-m", "pytest", "-q", "-n", "2",
            "-p", "no:cacheprovider", CASES, "-k", " or ".join(servers), f"--junitxml={xml_path}"]
    return subprocess.run(argv, cwd=B.ROOT, env=env, stdout=subprocess.DEVNULL,
                          timeout=1800).returncode


def what_happened(message: str) -> str:
    """The server's answer from an assertion message: its `where` line."""
    where = re.findall(r"where (\S+) = (<[^>]*>)", message)
    if where:
        value, obj = where[-1]
        return obj.strip("<>") if obj.startswith("<close") or obj.startswith("<no") else \
            f"{obj.strip('<>')}"
    return message.splitlines()[0][:120] if message else "?"


def parse(xml_path: str, servers: list[str]):
    """{group: {server: [(case, ok, detail)]}} from the JUnit report."""
    out: dict = defaultdict(lambda: defaultdict(list))
    for tc in ET.parse(xml_path).iter("testcase"):
        name = tc.get("name")
        m = re.match(r"(\w+)\[(.*)\]$", name)
        if not m:
            continue
        ids = m.group(2).split("-")
        server = next((s for s in servers if s in ids), None)
        if server is None or tc.find("skipped") is not None:
            continue
        group = tc.get("classname").rsplit(".", 1)[-1].replace("test_rfc6455_", "")
        case = m.group(1).removeprefix("test_") + \
            ("[" + "-".join(i for i in ids if i != server) + "]" if len(ids) > 1 else "")
        bad = tc.find("failure")
        if bad is None:
            bad = tc.find("error")
        detail = "" if bad is None else what_happened(bad.get("message") or bad.text or "")
        out[group][server].append((case, bad is None, detail))
    return out


def report(results, servers: list[str]) -> str:
    groups = ["handshake", "framing", "fragmentation", "utf8", "control", "close"]
    rows = []
    for g in groups:
        row = [g]
        for s in servers:
            cases = results[g][s]
            ok = sum(1 for _, passed, _ in cases if passed)
            row.append(f"{ok}/{len(cases)}" if cases else "not run")
        rows.append(row)
    totals = ["all"]
    for s in servers:
        cases = [c for g in groups for c in results[g][s]]
        totals.append(f"{sum(1 for c in cases if c[1])}/{len(cases)}")
    rows.append(totals)
    out = [B.table(["case group", *[f"{s} passed" for s in servers]], rows)]
    for s in servers:
        failed = [(g, c, d) for g in groups for c, ok, d in results[g][s] if not ok]
        if not failed:
            continue
        out.append(f"\n{s}: {len(failed)} failed case(s)")
        # cases failing the same way, grouped: "case ... : what the server did"
        by_what: dict = defaultdict(list)
        for g, c, d in failed:
            by_what[(g, re.sub(r"\[.*\]", "", c), d)].append(re.search(r"\[(.*)\]", c).group(1)
                                                          if "[" in c else "")
        for (g, c, d), params in by_what.items():
            shown = ", ".join(p for p in params if p)
            out.append(f"- {g}: {c}" + (f" [{shown}]" if shown else "") + f": {d}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default=",".join(SERVERS))
    args = ap.parse_args()
    servers = [s for s in args.servers.split(",") if s]
    try:
        B.check_sockherd()
        if set(servers) - {"sockherd"}:
            B.check_peers_venv("websockets")
    except B.BenchError as e:
        print(e, file=sys.stderr)
        return 2
    versions = subprocess.run(
        [B.PEERS_PY, "-c", "import importlib.metadata as m; print(' '.join(f'{p}/{m.version(p)}'"
         " for p in ('uvicorn', 'websockets', 'granian')))"],
        capture_output=True, text=True).stdout.strip()
    print(B.header("RFC 6455 conformance cases (tests/ws_conformance) per server"))
    print(f"- peers: {versions} (uvicorn --ws websockets; granian --interface asgi)\n")
    with tempfile.TemporaryDirectory(prefix="ws-conformance-") as tmp:
        xml_path = os.path.join(tmp, "cases.xml")
        run_cases(servers, xml_path)
        results = parse(xml_path, servers)
    print(report(results, servers))
    print(B.footer())
    sockherd = [c for g in results.values() for c in g.get("sockherd", [])]
    return 1 if any(not ok for _, ok, _ in sockherd) else 0


if __name__ == "__main__":
    sys.exit(main())
