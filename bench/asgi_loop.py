#!/usr/bin/env python3
"""asgi_loop: the event loop under ASGI apps (issue 22 §3: "timers and
callbacks must not be slower than uvloop's"): sockherd's loop (asyncio on
the loop thread's fdcore poller, worker/aio.py) against uvloop and asyncio's
default loop, in the same run. Two parts:

    .venv/bin/python bench/asgi_loop.py [asgi_hello.py's options: --seconds 8
        --only ... --apps work,timer --loads ka-c50,ka-c200,close-c50 --rounds 1
        --checkout DIR --wait-quiet S --json rows.json] [--micro-n 20000]
        [--micro-reps 3] [--micro-callgrind] [--micro-checkout DIR ...]
        [--parts http,micro]

http: served over loopback exactly as bench/asgi_hello.py serves its apps
(same servers, same loads, same wrk measure and tables; its code runs this
part), with the apps of bench/apps/loop_work.py:

  work   each request: 10 x sleep(0), a call_soon chain of 5, create_task +
         gather of 4 tasks, 4 asyncio.Queue round trips; then 14 bytes
  timer  each request: asyncio.sleep(0.001); then the same answer

sockherd (this checkout or --checkout DIR) against uvicorn --loop uvloop
--http httptools, granian --interface asgi (uvloop) and gunicorn -k asgi
(uvloop), 2 workers each; bench/setup_peers.sh installs the peers. Ratios
to uvicorn and granian in the tables.

micro: in process, no HTTP: bench/aio_micro.py's workloads (sleep(0),
call_soon chains and batches, call_later chains and batches, create_task +
gather, Queue ping-pong, 1 ms sleeps) on each loop: sockherd's (a real Loop
over a real fdcore Table, one loop thread, the asgi engine; each
--micro-checkout DIR's .venv, default this checkout's), asyncio's default
loop (same python) and uvloop (bench/.venv-peers' python, the same CPython).
Wall clock: each workload --micro-reps times per loop, interleaved, the
best kept (ns per operation). Every ratio is uvloop's cost over the other
loop's (time or instructions): >= 1.00 means not slower than uvloop. --micro-callgrind also counts each workload's instructions
under callgrind (callgrind_control -z / -d around it; the whole process,
every thread): Ir per operation, independent of the machine's load (the
figure to decide by on a shared box; uvloop's are mostly in C, so its Ir
and ns do not scale alike).

Exit status as bench/asgi_hello.py's (2 for a set-up problem).
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import asgi_hello as AH
import benchlib as B
from echo_callgrind import total_ir

APPS = {
    # name: (the app as the servers name it, the body of its answer to GET /)
    "work": ("loop_work:work", b"loop work done"),
    "timer": ("loop_work:timer", b"loop work done"),
}
MICRO = os.path.join(B.HERE, "aio_micro.py")
# workloads of aio_micro.py and their operations per run, relative to --micro-n
WORKLOADS = {"sleep0": 1, "soon_chain": 1, "soon_batch": 1, "later0_chain": 1,
             "later_batch": 1, "tasks": 1, "queue_pingpong": 0.5, "sleep_1ms": 0.005}


class Child:
    """One aio_micro.py process (optionally under callgrind)."""

    def __init__(self, label: str, python: str, kind: str, tmp: str, callgrind: bool):
        self.label, self.kind = label, kind
        self.pattern = os.path.join(tmp, f"cg-{label.replace('/', '_')}.") if callgrind else None
        argv = [python, MICRO, kind]
        if callgrind:
            argv = ["nice", "-n", "19", "valgrind", "--tool=callgrind",
                    f"--callgrind-out-file={self.pattern}%p"] + argv
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, env=dict(os.environ, PYTHONHASHSEED="0"),
                                  cwd=B.HERE, start_new_session=True)
        hello = self._line()
        if "ready" not in hello:
            raise B.BenchError(f"{label}: {hello}")
        self.loop_class = hello["loop"]

    def _line(self) -> dict:
        line = self.p.stdout.readline()
        if not line:
            raise B.BenchError(f"{self.label}: aio_micro.py ended (exit {self.p.wait()})")
        return json.loads(line)

    def run(self, name: str, n: int) -> dict:
        self.p.stdin.write(f"run {name} {n}\n")
        self.p.stdin.flush()
        r = self._line()
        if "error" in r:
            raise B.BenchError(f"{self.label}: {r['error']}")
        return r

    def counted(self, name: str, n: int) -> int:
        """The instructions of one run of workload `name` (callgrind)."""
        pid = str(self.p.pid)
        subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True,
                       timeout=600)
        self.run(name, n)
        before = set(glob.glob(f"{self.pattern}{pid}*"))
        subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True,
                       timeout=600)
        dump = B.wait_for(lambda: sorted(set(glob.glob(f"{self.pattern}{pid}*")) - before),
                          600, f"{self.label} dump")[-1]
        return B.wait_for(lambda: _try_total(dump), 600, f"{self.label} dump complete")

    def close(self) -> None:
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.close()
            self.p.wait(timeout=600)
        except (OSError, subprocess.TimeoutExpired):
            self.p.kill()
            self.p.wait()


def _try_total(path: str) -> int | None:
    try:
        return total_ir(path)
    except (B.BenchError, ValueError, OSError):
        return None


def loops(a, checkout: str) -> list[tuple[str, str, str]]:
    """(label, python, kind) of each loop measured."""
    ours = [os.path.abspath(c) for c in a.micro_checkout] or [checkout]
    out = []
    for c in ours:
        py = os.path.join(c, ".venv", "bin", "python")
        if not os.path.exists(py):
            raise B.BenchError(f"{py} missing (make that checkout's .venv first)")
        label = "sockherd" if len(ours) == 1 else f"sockherd@{os.path.basename(c)}"
        out.append((label, py, "sockherd"))
    want = a.micro_loops.split(",")
    if "asyncio" in want:
        out.append(("asyncio", os.path.join(ours[0], ".venv", "bin", "python"), "asyncio"))
    if "uvloop" in want:
        B.check_peers_venv()
        out.append(("uvloop", B.PEERS_PY, "uvloop"))
    return [x for x in out if x[2] in want]


def micro(a, checkout: str) -> None:
    specs = loops(a, checkout)
    best: dict[tuple[str, str], float] = {}
    irs: dict[tuple[str, str], float] = {}
    classes = {}
    with B.tempdir("asgi_loop-") as tmp:
        children = [Child(lb, py, kind, tmp, False) for lb, py, kind in specs]
        try:
            for ch in children:
                classes[ch.label] = ch.loop_class
            for rep in range(a.micro_reps):
                for name, scale in WORKLOADS.items():
                    if name not in a.micro_workloads.split(","):
                        continue
                    n = max(1, int(a.micro_n * scale))
                    for ch in children:          # interleaved: a drift hits all alike
                        r = ch.run(name, n)
                        per = r["secs"] / n
                        key = (ch.label, name)
                        best[key] = min(best.get(key, per), per)
                print(f"# micro rep {rep + 1}/{a.micro_reps} done", file=sys.stderr, flush=True)
        finally:
            for ch in children:
                ch.close()
        if a.micro_callgrind:
            if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
                raise B.BenchError("valgrind (Debian package valgrind) is needed")
            n_cg = max(100, a.micro_n // 10)
            for lb, py, kind in specs:
                ch = Child(lb, py, kind, tmp, True)
                try:
                    for name, scale in WORKLOADS.items():
                        if name == "sleep_1ms" or name not in a.micro_workloads.split(","):
                            continue            # sleep_1ms: a latency, not work
                        n = max(1, int(n_cg * scale))
                        ch.run(name, n)         # warm: first-call costs uncounted
                        irs[(lb, name)] = ch.counted(name, n) / n
                        print(f"# callgrind {lb} {name}: {irs[(lb, name)]:,.0f} Ir/op",
                              file=sys.stderr, flush=True)
                finally:
                    ch.close()
    labels = [lb for lb, _, _ in specs]
    print("\n#### micro: the event loop alone, in process (bench/aio_micro.py)\n")
    print(f"- --micro-n {a.micro_n}, best of {a.micro_reps} interleaved runs per loop "
          f"(wall clock: the machine's load moves it)"
          + (f"; callgrind at n/10 ({max(100, a.micro_n // 10)})" if a.micro_callgrind else ""))
    for lb in labels:
        print(f"  - {lb}: {classes.get(lb, '?')}")
    print()
    ref = "uvloop" if "uvloop" in labels else labels[-1]
    others = [lb for lb in labels if lb != ref]
    head = ["workload"] + [f"{lb} ns/op" for lb in labels] + [f"{lb} vs {ref}" for lb in others]
    if irs:
        head += [f"{lb} Ir/op" for lb in labels] + [f"{lb} vs {ref} (Ir)" for lb in others]
    rows = []
    for name in WORKLOADS:
        if (labels[0], name) not in best:
            continue
        uv = best[(ref, name)]
        row = [name] + [f"{best[(lb, name)] * 1e9:,.0f}" for lb in labels]
        # ops/s relative to uvloop's: >= 1.00 is not slower (for sleep_1ms:
        # how close to 1 ms a sleep ends, relative to uvloop's)
        row += [f"{uv / best[(lb, name)]:.2f}" for lb in others]
        if irs:
            if (labels[0], name) in irs:
                uvi = irs[(ref, name)]
                row += [f"{irs[(lb, name)]:,.0f}" for lb in labels]
                row += [f"{uvi / irs[(lb, name)]:.2f}" for lb in others]
            else:
                row += ["-"] * (2 * len(labels) - 1)
        rows.append(row)
    print(B.table(head, rows))


class Micro:
    """asgi_hello.main's `extra`: this script's options and its micro part."""

    @staticmethod
    def add_arguments(ap) -> None:
        ap.add_argument("--parts", default="http,micro", help="http,micro (both)")
        ap.add_argument("--micro-n", type=int, default=20000,
                        help="operations per micro workload run (20000)")
        ap.add_argument("--micro-reps", type=int, default=3,
                        help="interleaved runs per micro workload and loop, best kept (3)")
        ap.add_argument("--micro-callgrind", action="store_true",
                        help="also count each micro workload's instructions (valgrind)")
        ap.add_argument("--micro-loops", default="sockherd,asyncio,uvloop",
                        help="the loops of the micro part (sockherd,asyncio,uvloop)")
        ap.add_argument("--micro-workloads", default=",".join(WORKLOADS),
                        help="the micro workloads (default: all): " + ",".join(WORKLOADS))
        ap.add_argument("--micro-checkout", action="append", default=[], metavar="DIR",
                        help="sockherd trees whose loop the micro part measures "
                             "(repeatable; default: --checkout)")

    @staticmethod
    def after(a, checkout: str) -> None:
        if "micro" in a.parts.split(","):
            micro(a, checkout)


if __name__ == "__main__":
    # only the micro part: no app served (asgi_hello's loop over no app)
    if any(x in ("--parts=micro",) for x in sys.argv) or \
            ("--parts" in sys.argv and sys.argv[sys.argv.index("--parts") + 1] == "micro"):
        sys.argv += ["--apps", ""]
    try:
        sys.exit(AH.main(APPS, __doc__, "asgi_loop: timers and callbacks under ASGI apps, "
                         "2 worker processes each; the loop alone in process", Micro))
    except B.BenchError as e:
        print(f"asgi_loop: {e}", file=sys.stderr)
        sys.exit(2)
