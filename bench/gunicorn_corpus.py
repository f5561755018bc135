"""Replays gunicorn's request corpus (tests/requests/{valid,invalid} in its
sdist or checkout) over real sockets to the sockherd engine with its default
settings, and says how many valid cases are served as gunicorn expects and
how many invalid ones are refused.

    .venv/bin/python bench/gunicorn_corpus.py [--source DIR] [--version V] [-v]

Without --source it fetches gunicorn's sdist from PyPI (`pip download
--no-deps --no-binary :all: gunicorn==V`, which ships tests/requests) into a
temporary directory; --source takes an extracted sdist or a gunicorn checkout
(e.g. `git archive` from a clone) instead. Each case is a `.http` file
(gunicorn's escapes: the file's newlines are layout, `\\r\\n`, `\\n`, `\\t`,
`\\0`, `\\xHH` are bytes) and a `.py` beside it naming the expected
request(s) (valid) or the exception gunicorn raises (invalid); the `.py` is
run against stand-ins for the few gunicorn names it imports, so gunicorn
itself is not needed.

Valid: an HTTP/1.1 request without Host gets `Host: localhost` (we refuse
those, RFC 9112 §3.2), then each request the app is given must match the
expectation: method, raw target, path, query, headers (as the environ has
them), body. Invalid: the app must be given nothing and the answer must be
4xx/5xx or a close. A case whose .py sets a gunicorn setting (cfg.set) is
still run with sockherd's defaults and listed with that setting."""
from __future__ import annotations

import argparse
import glob
import os
import re
import select
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import types
import urllib.parse

ESCAPE = re.compile(rb"\\(r\\n|n|t|0|x[0-9A-Fa-f]{2})")
ESCAPED = {b"r\\n": b"\r\n", b"n": b"\n", b"t": b"\t", b"0": b"\x00"}


def load_http(path: str) -> bytes:
    raw = open(path, "rb").read().replace(b"\n", b"")

    def one(m):
        e = m.group(1)
        return ESCAPED.get(e) or bytes([int(e[1:], 16)])
    return ESCAPE.sub(one, raw)


class _Cfg:
    """Stands for gunicorn.config.Config: records what a case sets."""

    def __init__(self):
        self.settings = {}

    def set(self, name, value):
        self.settings[name] = value


def _stand_ins() -> None:
    """gunicorn, gunicorn.config and gunicorn.http.errors as the .py files
    use them: Config, and any exception class by name."""
    errors = types.ModuleType("gunicorn.http.errors")
    made = {}

    def exc(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return made.setdefault(name, type(name, (Exception,), {}))
    errors.__getattr__ = exc
    config = types.ModuleType("gunicorn.config")
    config.Config = _Cfg
    for name, mod in (("gunicorn", types.ModuleType("gunicorn")),
                      ("gunicorn.http", types.ModuleType("gunicorn.http")),
                      ("gunicorn.config", config), ("gunicorn.http.errors", errors)):
        sys.modules.setdefault(name, mod)


def load_py(path: str) -> tuple[object, dict]:
    """(the expected request(s) or exception class, the settings it sets)."""
    _stand_ins()
    ns = {"uri": lambda raw: raw, "cfg": _Cfg(), "__name__": "case"}
    exec(compile(open(path).read(), path, "exec"), ns)
    return ns["request"], ns["cfg"].settings


# ---- the server ------------------------------------------------------------------------------

class Recorder:
    """The app: each request's environ (the parts compared) and body, by
    client port."""

    def __init__(self):
        self.seen, self.lock = {}, threading.Lock()

    def __call__(self, environ, start_response):
        body = environ["wsgi.input"].read()
        got = {k: v for k, v in environ.items() if isinstance(v, str)}
        got["body"] = body
        with self.lock:
            self.seen.setdefault(int(environ["REMOTE_PORT"]), []).append(got)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]


def start_server(app):
    from sockherd.fdcore import Table
    from sockherd.worker.loop import Loop
    from sockherd.worker.wsgi import make_handler

    table = Table(1, 1)
    loop = Loop(table, make_handler(app, {"threads": 1, "header_timeout": 5.0}))
    srv = socket.create_server(("127.0.0.1", 0), backlog=64)
    addr = srv.getsockname()                # the loop takes the socket over
    loop.add_listener(srv)
    loop.start()
    return loop, table, addr


def exchange(addr, data: bytes) -> tuple[int, bytes, bool]:
    """(client port, what came back, whether the server closed in time)."""
    with socket.create_connection(addr, timeout=10) as c:
        port = c.getsockname()[1]
        try:
            c.sendall(data)
            c.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        out, deadline = b"", time.monotonic() + 10
        while time.monotonic() < deadline:
            select.select([c], [], [], max(0.0, deadline - time.monotonic()))
            try:
                chunk = c.recv(65536)
            except ConnectionResetError:
                return port, out, True
            except BlockingIOError:
                continue
            if not chunk:
                return port, out, True
            out += chunk
    return port, out, False


def statuses(out: bytes) -> list[int]:
    return [int(s) for s in re.findall(rb"(?:^|\n)HTTP/1\.1 ([0-9]{3}) ", out)]


# ---- the comparison ---------------------------------------------------------------------------

def with_host(data: bytes, expect: list) -> tuple[bytes, int]:
    """data with `Host: localhost` after the request line of each HTTP/1.1
    request that has no Host; how many were added."""
    added, pos = 0, 0
    for req in expect:
        line = b"%s %s HTTP/%d.%d\r\n" % (req["method"].encode(), req["uri"].encode("latin-1"),
                                         *req["version"])
        at = data.find(line, pos)
        if at < 0:
            return data, added                  # left as it is; the mismatch will say
        pos = at + len(line)
        if req["version"] == (1, 1) and not any(n.upper() == "HOST" for n, _ in req["headers"]):
            data = data[:pos] + b"Host: localhost\r\n" + data[pos:]
            added += 1
    return data, added


def environ_key(name: str) -> str:
    name = name.upper().replace("-", "_")
    return name if name in ("CONTENT_TYPE", "CONTENT_LENGTH") else "HTTP_" + name


def mismatches(req: dict, env: dict) -> list[str]:
    out = []
    raw = req["uri"]
    want = {"REQUEST_METHOD": req["method"], "RAW_URI": raw,
            "SERVER_PROTOCOL": "HTTP/%d.%d" % req["version"]}
    if raw.startswith("/"):                     # origin-form: absolute-path [ "?" query ]
        path, _, query = raw.partition("#")[0].partition("?")
        want["PATH_INFO"] = urllib.parse.unquote_to_bytes(path).decode("latin-1")
        want["QUERY_STRING"] = query
    headers = {}
    for name, value in req["headers"]:
        if "_" not in name:                     # names with '_' are dropped (no spoofing)
            headers.setdefault(environ_key(name), []).append(value)
    for key, values in headers.items():
        want[key] = ",".join(values)
    for key, value in want.items():
        got = env.get(key)
        if got != value and not (key.startswith("HTTP_") and got is not None
                                 and got.replace(", ", ",") == value.replace(", ", ",")):
            out.append(f"{key}: got {got!r}, want {value!r}")
    body = req["body"].encode("latin-1") if isinstance(req["body"], str) else req["body"]
    if env["body"] != body:
        out.append(f"body: got {env['body'][:60]!r}, want {req['body'][:60]!r}")
    return out


def run(source: str, verbose: bool) -> int:
    app = Recorder()
    loop, table, addr = start_server(app)
    results = {"valid": [0, 0], "invalid": [0, 0]}
    report = []
    try:
        for kind in ("valid", "invalid"):
            for http in sorted(glob.glob(os.path.join(source, "tests", "requests", kind, "*.http"))):
                name = f"{kind}/{os.path.basename(http)[:-5]}"
                expect, settings = load_py(http[:-5] + ".py")
                data = load_http(http)
                note = f" (gunicorn setting {settings})" if settings else ""
                if kind == "valid":
                    expect = expect if isinstance(expect, list) else [expect]
                    data, _ = with_host(data, expect)
                port, out, closed = exchange(addr, data)
                with app.lock:
                    seen = app.seen.pop(port, [])
                codes = statuses(out)
                results[kind][1] += 1
                if kind == "valid":
                    bad = [] if len(seen) == len(expect) else [
                        f"{len(seen)} request(s) served, {len(expect)} expected; answers {codes}"]
                    for req, env in zip(expect, seen):
                        bad += mismatches(req, env)
                else:
                    bad = [] if not seen else [f"served {[e['RAW_URI'] for e in seen]}"]
                    if any(c < 400 for c in codes) or not closed:
                        bad.append(f"answers {codes}, closed {closed}")
                if not bad:
                    results[kind][0] += 1
                    if verbose:
                        report.append(f"ok   {name}{note} {codes}")
                else:
                    want = "" if kind == "valid" else f" (gunicorn: {expect.__name__})"
                    report.append(f"FAIL {name}{note}{want}: " + "; ".join(bad))
                    if verbose:
                        report.append(f"     input {data[:300]!r}")
    finally:
        loop.stop()
        table.close()
    print("\n".join(report))
    v, i = results["valid"], results["invalid"]
    print(f"valid passed {v[0]}/{v[1]}, invalid rejected {i[0]}/{i[1]}")
    return 0 if v[0] == v[1] and i[0] == i[1] else 1


def fetch_sdist(version: str, into: str) -> str:
    spec = f"gunicorn=={version}" if version else "gunicorn"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                    ":all:", spec, "-d", into], check=True)
    [sdist] = glob.glob(os.path.join(into, "gunicorn-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        tar.extractall(into, filter="data")
    [root] = [p for p in glob.glob(os.path.join(into, "gunicorn-*")) if os.path.isdir(p)]
    print(f"corpus: {os.path.basename(sdist)} from PyPI")
    return root


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", help="an extracted gunicorn sdist or checkout (default: PyPI)")
    ap.add_argument("--version", default="27.0.1", help="the sdist to fetch (default 27.0.1)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    if args.source:
        return run(args.source, args.verbose)
    with tempfile.TemporaryDirectory() as tmp:
        return run(fetch_sdist(args.version, tmp), args.verbose)


if __name__ == "__main__":
    sys.exit(main())
