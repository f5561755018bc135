"""The native engine's layers (issue 22 §1): worker/native is a connection
layer, an HTTP/1 codec and two adapters beside each other (WSGI, ASGI:
each calls only the codec and the connection layer, never the other),
with the assembly on top
(worker/native/conn.h draws them), and no C file calls back up into one
that calls it: the connection layer reaches the codec only through struct
conn_ops, the codec the adapter only through struct h1_app.

Checked on the code the compiler sees, not on comments: every file is
compiled on its own and the functions it calls in another file of the
extension (nm's undefined symbols, matched with the file that defines
each) must all be of a file below it in the order below. A new file must
be given its place here; a call upward (hconn.c calling respond() was the
finding that started this) fails the test with the call named.

worker/aio_native (the _aio extension: a loop thread's asyncio loop in
C) is layered the same way, as its own stack: it calls no file of
worker/native (another extension) and none of them calls it."""
from __future__ import annotations

import re
import subprocess
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "worker" / "native"
AIO = ROOT / "worker" / "aio_native"

# bottom up; a file may call the files before it, never one after it
LAYERS = {
    "connection": ["netmatch", "proxy_proto", "fwd_trust", "conn_timers", "conn_io", "conn_report", "conn_events", "conn_proxy",
                   "conn_tls", "conn_tls_info", "conn_tls_load", "conn_tls_tickets", "conn_tls_ctx", "conn_type", "dispatch", "engine_accept",
                   "engine"],
    "http1 codec": ["httpscan", "httplist", "httptarget", "httpfields", "httpcheck", "httpparse",
                    "h1_parser", "fwd_syntax", "fwd_fields", "h1_head", "h1_head_asgi", "h1_response",
                    "h1_timers", "h1_conn"],
    # issue 23: the WebSocket frame codec beside the HTTP/1 one (it calls
    # nothing of the engine; ws_deflate is its RFC 7692 inflate/deflate,
    # ws_py its Python face)
    "websocket codec": ["ws_deflate", "ws_frame", "ws_py"],
    "wsgi adapter": ["wsgi_environ", "wsgi_forwarded", "wsgi_respond", "wsgi_body", "wsgi_app"],
    "asgi adapter": ["asgi_forwarded", "asgi_scope", "asgi_end", "asgi_ext", "asgi_call", "asgi_app",
                     "asgi_ws_frames", "asgi_ws_ping", "asgi_ws_deny", "asgi_ws_send", "asgi_ws_call",
                     "asgi_ws"],
    "assembly": ["server", "server_type", "httpmodule"],
    # the _aio extension, bottom up: create_task/create_future, the
    # handles and the ready pass, call_soon/call_at/call_later bound to a
    # loop, the iteration (_run_once and the turn), the module
    "asyncio loop": ["tasks", "handles", "callers", "runner", "aio"],
}
# the adapters sit side by side: neither calls the other (both are above
# the codec, below the assembly)
BESIDE = {"wsgi adapter": "asgi adapter", "asgi adapter": "wsgi adapter"}
ORDER = [name for files in LAYERS.values() for name in files]
LAYER_OF = {name: layer for layer, files in LAYERS.items() for name in files}

# which headers each layer's header may include (a type of the layer above
# would be a dependency upward too)
HEADERS = {
    "conn.h": set(),
    "netmatch.h": set(),
    "forwarded.h": {"netmatch.h"},
    "fwd_syntax.h": set(),
    "conn_tls.h": {"conn.h"},
    "engine.h": {"conn.h", "httpparse.h", "forwarded.h"},
    "h1.h": {"engine.h", "httpparse.h"},
    "wsgi.h": {"h1.h"},
    "asgi.h": {"h1.h"},
    "ws.h": set(),
    "asgi_ws.h": {"asgi.h", "ws.h"},
}


def _sources() -> list[Path]:
    return sorted(NATIVE.glob("*.c")) + sorted(AIO.glob("*.c"))


def _calls(tmp_path: Path) -> dict[str, dict[str, set[str]]]:
    """file -> {other file -> the functions of it that file calls}"""
    include = sysconfig.get_paths()["include"]
    defined: dict[str, str] = {}
    undefined: dict[str, set[str]] = {}
    for src in _sources():
        obj = tmp_path / (src.stem + ".o")
        # -O0: the same calls between our files as -O2 (only libc's
        # memcpy/memset/strlen show up undefined besides), at half the CPU
        subprocess.run(["gcc", "-std=gnu11", "-O0", "-fPIC", "-DLLHTTP_STRICT_MODE=1",
                        f"-I{src.parent}", f"-I{ROOT / 'fdcore'}", "-I/usr/share/include/llhttp",
                        f"-I{include}", "-c", str(src), "-o", str(obj)],
                       check=True, timeout=120)
        out = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True,
                             timeout=30).stdout
        undefined[src.stem] = set()
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] == "T":
                defined[parts[2]] = src.stem
            elif len(parts) == 2 and parts[0] == "U":
                undefined[src.stem].add(parts[1])
    calls: dict[str, dict[str, set[str]]] = {}
    for name, syms in undefined.items():
        for sym in syms:
            if sym in defined and defined[sym] != name:
                calls.setdefault(name, {}).setdefault(defined[sym], set()).add(sym)
    return calls


def test_every_native_file_has_its_place_in_a_layer():
    stems = [src.stem for src in _sources()]
    assert len(stems) == len(set(stems)), "a file name in both worker/native and worker/aio_native"
    files = set(stems)
    assert files - set(ORDER) == set(), "a native file with no layer: add it to LAYERS"
    assert set(ORDER) - files == set(), "LAYERS names a file that is gone"


@pytest.mark.long                          # 42 files compiled: scheduled first
def test_no_file_calls_a_file_above_it(tmp_path):
    calls = _calls(tmp_path)
    upward = []
    for caller, callees in sorted(calls.items()):
        for callee, syms in sorted(callees.items()):
            if ORDER.index(callee) > ORDER.index(caller) or \
                    BESIDE.get(LAYER_OF[caller]) == LAYER_OF[callee]:
                upward.append(f"{caller}.c ({LAYER_OF[caller]}) calls {callee}.c "
                              f"({LAYER_OF[callee]}): {sorted(syms)}")
    assert not upward, "calls up the layers:\n" + "\n".join(upward)
    # the check sees the calls at all: the codec does call the connection layer
    assert "conn_io" in calls.get("h1_conn", {})
    # the ASGI adapter calls only the codec and the connection layer
    for name in LAYERS["asgi adapter"]:
        below = {LAYER_OF[callee] for callee in calls.get(name, {})}
        assert below <= {"connection", "http1 codec", "websocket codec", "asgi adapter"}, \
            (name, below)
    # the frame codec is below every adapter and calls nothing of the engine
    # (only its own inflate/deflate)
    assert set(calls.get("ws_frame", {})) <= {"ws_deflate"}
    assert set(calls.get("ws_deflate", {})) == set()
    assert "ws_frame" in calls.get("asgi_ws_frames", {})
    assert "h1_response" in calls.get("asgi_call", {})
    # the two extensions call nothing of each other; the loop's iteration
    # runs the handles' ready pass (the check sees _aio's calls too)
    aio = set(LAYERS["asyncio loop"])
    for name in ORDER:
        assert (set(calls.get(name, {})) <= aio) == (name in aio) or not calls.get(name), \
            (name, sorted(calls.get(name, {})))
    assert "handles" in calls.get("runner", {})


def test_layer_headers_include_nothing_above_them():
    for header, allowed in HEADERS.items():
        text = (NATIVE / header).read_text()
        ours = {inc for inc in re.findall(r'#include "([^"]+)"', text)
                if (NATIVE / inc).exists()}
        assert ours <= allowed, f"{header} includes {sorted(ours - allowed)}"
