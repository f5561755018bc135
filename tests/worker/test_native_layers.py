"""The native engine's layers (issue 37): a folder each under worker/native
(worker/native/layers.py says which folder stands on which), the assembly
at its root.

Two rules, both checked on what the compiler sees, not on comments:
- includes: every file is compiled with only its own folder's and the
  folders below its include directories, as setup.py builds it, so a
  header of a layer above is not found (and no include may name a path:
  `"../x.h"` would step around that);
- calls: the functions a file calls in another file of the extension
  (nm's undefined symbols, matched with the file that defines each) are
  of its own folder or a folder it stands on, and within a folder of a
  file before it in FILE_ORDER. Data follows the same rule across
  folders (an exception object, a type object: the layer that raises or
  checks it holds it, the module's init fills it); within a folder it is
  the folder's own. A call upward (hconn.c calling respond() was the
  finding that started this) fails with the call named.
Both checks are seen failing on a planted violation.

worker/aio_native (the _aio extension: a loop thread's asyncio loop in
C) is layered by file order the same way, as its own stack: it calls no
file of worker/native (another extension) and none of them calls it."""
from __future__ import annotations

import re
import runpy
import subprocess
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "worker" / "native"
AIO = ROOT / "worker" / "aio_native"
LAYERS = runpy.run_path(str(NATIVE / "layers.py"))
STANDS_ON = LAYERS["STANDS_ON"]

# each folder's files bottom up: a file may call the ones before it in its
# folder (and anything of the folders it stands on), never one after it
FILE_ORDER = {
    "parse": ["netmatch", "proxy_proto", "fwd_syntax",
              "httpscan", "httplist", "httptarget", "httpfields", "httpcheck", "httpparse"],
    "conn": ["fwd_trust", "conn_timers", "conn_io", "conn_report", "conn_events", "conn_proxy",
             "conn_tls", "conn_tls_info", "conn_tls_load", "conn_tls_tickets", "conn_tls_ctx",
             "conn_type"],
    "engine": ["dispatch", "engine_accept", "engine"],
    "proto/http1": ["h1_parser", "fwd_fields", "h1_head", "h1_head_asgi", "h1_response",
                    "h1_timers", "h1_conn"],
    # the WebSocket frame codec (issue 23): ws_deflate is its RFC 7692
    # inflate/deflate, ws_py its Python face
    "proto/ws": ["ws_deflate", "ws_frame", "ws_py"],
    "app/wsgi": ["wsgi_tls", "wsgi_environ", "wsgi_forwarded", "wsgi_respond", "wsgi_body", "wsgi_app"],
    "app/asgi": ["asgi_tls", "asgi_forwarded", "asgi_scope", "asgi_end", "asgi_ext", "asgi_call", "asgi_app",
                 "asgi_ws_frames", "asgi_ws_ping", "asgi_ws_deny", "asgi_ws_send", "asgi_ws_call",
                 "asgi_ws"],
    ".": ["server", "server_type", "httpmodule"],
    # the _aio extension, bottom up: create_task/create_future, the
    # handles and the ready pass, call_soon/call_at/call_later bound to a
    # loop, the iteration (_run_once and the turn), the module
    "aio": ["tasks", "handles", "callers", "runner", "aio"],
}
FOLDER = {name: folder for folder, names in FILE_ORDER.items() for name in names}
POS = {name: i for names in FILE_ORDER.values() for i, name in enumerate(names)}

# the headers a header may include of its own folder (the folders above
# it are out of its reach already; this keeps a folder's own headers in
# their order too)
HEADERS = {
    "conn/conn.h": set(),
    "parse/netmatch.h": set(),
    "conn/forwarded.h": {"netmatch.h"},
    "parse/fwd_syntax.h": set(),
    "conn/conn_tls.h": {"conn.h"},
    "conn/server.h": {"conn.h", "httpparse.h", "forwarded.h"},
    "engine/engine.h": {"server.h"},
    "proto/http1/h1.h": {"engine.h", "httpparse.h"},
    "app/wsgi/wsgi.h": {"h1.h"},
    "app/asgi/asgi.h": {"h1.h"},
    "proto/ws/ws.h": set(),
    "app/asgi/asgi_ws.h": {"asgi.h", "ws.h"},
    "assembly.h": {"engine.h"},
}


def _folder(src: Path) -> str:
    return "aio" if src.parent == AIO else LAYERS["folder_of"](src)


def _includes(src: Path) -> list[str]:
    if src.parent == AIO:
        return [f"-I{AIO}"]
    dirs = LAYERS["include_dirs"](LAYERS["folder_of"](src))
    return [f"-I{d}" for d in dirs] + [f"-I{ROOT / d}" if not d.startswith("/") else f"-I{d}"
                                       for d in LAYERS["EXTERNAL_INCLUDES"]]


def _compile(src: Path, obj: Path, includes: list[str]) -> subprocess.CompletedProcess:
    # -O0: the same calls between our files as -O2 (only libc's
    # memcpy/memset/strlen show up undefined besides), at half the CPU
    return subprocess.run(["gcc", "-std=gnu11", "-O0", "-fPIC", "-DLLHTTP_STRICT_MODE=1",
                           *includes, f"-I{sysconfig.get_paths()['include']}",
                           "-c", str(src), "-o", str(obj)],
                          capture_output=True, text=True, timeout=120)


def _symbols(obj: Path) -> tuple[set[str], set[str]]:
    """(what obj defines: its functions and its data, such as the module's
    exception objects and the type objects; the symbols it leaves
    undefined)"""
    out = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True,
                         timeout=30).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TDBRC":
            defined.add(parts[2])
            if parts[1] != "T":
                DATA.add(parts[2])
        elif len(parts) == 2 and parts[0] == "U":
            undefined.add(parts[1])
    return defined, undefined


DATA: set[str] = set()        # the defined symbols that are data, not functions


def _sources() -> list[Path]:
    return LAYERS["sources"]() + sorted(AIO.glob("*.c"))


def _calls(tmp_path: Path, planted: dict[str, Path] | None = None,
           defined_out: dict[str, str] | None = None) -> dict[str, dict[str, set[str]]]:
    """file -> {other file -> the functions of it that file calls}; every
    file compiled with its layer's include directories only. `planted`:
    extra objects, by the file name they stand for; `defined_out` gets
    function -> the file defining it."""
    defined: dict[str, str] = {}
    undefined: dict[str, set[str]] = {}
    objects = {}
    for src in _sources():
        obj = tmp_path / (src.stem + ".o")
        done = _compile(src, obj, _includes(src))
        assert done.returncode == 0, f"{src.relative_to(ROOT)} does not build in its layer:\n" \
                                     + done.stderr
        objects[src.stem] = obj
    objects.update(planted or {})
    for name, obj in objects.items():
        syms, missing = _symbols(obj)
        defined.update({sym: name for sym in syms if name not in (planted or {})})
        undefined[name] = missing
    if defined_out is not None:
        defined_out.update(defined)
    calls: dict[str, dict[str, set[str]]] = {}
    for name, syms in undefined.items():
        for sym in syms:
            if sym in defined and defined[sym] != name:
                calls.setdefault(name, {}).setdefault(defined[sym], set()).add(sym)
    return calls


def _upward(calls: dict[str, dict[str, set[str]]]) -> list[str]:
    found = []
    for caller, callees in sorted(calls.items()):
        for callee, syms in sorted(callees.items()):
            mine, theirs = FOLDER[caller], FOLDER[callee]
            # within a folder the order is the calls': its data (a type
            # object, interned keys) is the folder's own, wherever held
            ok = (POS[callee] < POS[caller] or syms <= DATA) if mine == theirs else \
                theirs in STANDS_ON.get(mine, ())
            if not ok:
                found.append(f"{caller}.c ({mine}/) calls {callee}.c ({theirs}/): {sorted(syms)}")
    return found


def test_every_native_file_is_in_the_folder_of_its_layer():
    seen = {}
    for src in _sources():
        assert src.stem not in seen, f"{src.stem}.c in both {seen[src.stem]} and {src.parent}"
        seen[src.stem] = _folder(src)
    listed = {name: folder for name, folder in FOLDER.items()}
    assert set(seen) - set(listed) == set(), "a native file with no place: add it to FILE_ORDER"
    assert set(listed) - set(seen) == set(), "FILE_ORDER names a file that is gone"
    moved = {name: (folder, listed[name]) for name, folder in seen.items() if folder != listed[name]}
    assert not moved, f"files in another folder than FILE_ORDER's (is, listed): {moved}"
    # every folder of the tree is a layer of layers.py (no C outside them)
    folders = {LAYERS["folder_of"](p) for p in NATIVE.rglob("*.[ch]")}
    assert folders <= set(STANDS_ON), sorted(folders - set(STANDS_ON))
    # and the build builds them all (setup.py compiles layers.py's sources)
    assert {p.resolve() for p in NATIVE.rglob("*.c")} == set(LAYERS["sources"]())


def test_no_include_names_a_path():
    """`#include "../proto/http1/h1.h"` would find a header above without
    the include directories: the layers' headers are included by name."""
    named = [f"{p.relative_to(NATIVE)}: {inc}" for p in NATIVE.rglob("*.[ch]")
             for inc in re.findall(r'#\s*include\s*"([^"]+)"', p.read_text()) if "/" in inc]
    assert not named, named


def test_a_header_of_a_layer_above_is_not_found(tmp_path):
    """The build's include directories are the rule: a connection-layer
    file that includes the codec's header does not build there, and builds
    where the codec is below (an adapter)."""
    src = tmp_path / "planted.c"
    src.write_text('#include "h1.h"\nint planted(void) { return 0; }\n')
    ext = [f"-I{ROOT / d}" if not d.startswith("/") else f"-I{d}"
           for d in LAYERS["EXTERNAL_INCLUDES"]]
    as_conn = _compile(src, tmp_path / "a.o",
                       [f"-I{d}" for d in LAYERS["include_dirs"]("conn")] + ext)
    assert as_conn.returncode != 0 and "h1.h" in as_conn.stderr, as_conn.stderr
    as_wsgi = _compile(src, tmp_path / "b.o",
                       [f"-I{d}" for d in LAYERS["include_dirs"]("app/wsgi")] + ext)
    assert as_wsgi.returncode == 0, as_wsgi.stderr
    # and the two adapters do not see each other's headers
    src.write_text('#include "asgi.h"\n')
    assert _compile(src, tmp_path / "c.o",
                    [f"-I{d}" for d in LAYERS["include_dirs"]("app/wsgi")] + ext).returncode != 0


@pytest.mark.long                          # every native file compiled: scheduled first
def test_no_file_calls_a_file_above_it(tmp_path):
    # a planted call up: a "connection" file calling the codec's h1_rearm
    planted_src = tmp_path / "planted_up.c"
    # and a use of the codec's exception object (data, not a call)
    planted_src.write_text("void h1_rearm(void *c); extern void *HttpError;\n"
                           "void *planted(void *c) { h1_rearm(c); return HttpError; }\n")
    planted_obj = tmp_path / "planted_up.o"
    assert _compile(planted_src, planted_obj, []).returncode == 0
    FOLDER["planted_up"], POS["planted_up"] = "conn", len(FILE_ORDER["conn"])
    try:
        defined: dict[str, str] = {}
        calls = _calls(tmp_path, {"planted_up": planted_obj}, defined)
        found = _upward(calls)
    finally:
        del FOLDER["planted_up"], POS["planted_up"]
    planted = [line for line in found if line.startswith("planted_up.c")]
    assert "h1_rearm" in " ".join(planted) and "HttpError" in " ".join(planted), found
    upward = [line for line in found if not line.startswith("planted_up.c")]
    assert not upward, "calls up the layers:\n" + "\n".join(upward)
    calls.pop("planted_up")
    # the check sees the calls at all: the codec does call the connection layer
    assert "conn_io" in calls.get("h1_conn", {})
    # the connection layer and the engine call no HTTP parser of parse/ (it
    # is below them only for the limits the Server holds: layers.py)
    for name in FILE_ORDER["conn"] + FILE_ORDER["engine"]:
        http = {callee for callee in calls.get(name, {}) if callee.startswith("http")}
        assert not http, (name, http)
    # the ASGI adapter calls nothing of the WSGI one (STANDS_ON: beside)
    for name in FILE_ORDER["app/asgi"]:
        assert not {FOLDER[c] for c in calls.get(name, {})} & {"app/wsgi", "."}, name
    # the frame codec calls nothing of the engine (only its own inflate/deflate)
    assert set(calls.get("ws_frame", {})) <= {"ws_deflate"}
    assert set(calls.get("ws_deflate", {})) == set()
    assert "ws_frame" in calls.get("asgi_ws_frames", {})
    assert "h1_response" in calls.get("asgi_call", {})
    # the two extensions call nothing of each other; the loop's iteration
    # runs the handles' ready pass (the check sees _aio's calls too)
    for name in FOLDER:
        callees = {FOLDER[c] for c in calls.get(name, {})}
        assert not callees or (callees <= {"aio"}) == (FOLDER[name] == "aio"), (name, callees)
    assert "handles" in calls.get("runner", {})
    # the tables through which a layer reaches the one above: a struct
    # conn_ops holds the codec's functions only (never an adapter's, as
    # it once held WSGI's and ASGI's), a struct app_ops the adapter's
    tables = _tables((NATIVE / "server.c").read_text())
    assert {"h1_conn_ops", "wsgi_app_ops", "asgi_app_ops"} <= set(tables), sorted(tables)
    for table, (kind, fns) in tables.items():
        layers = {FOLDER[defined[fn]] for fn in fns}
        want = {"proto/http1"} if kind == "conn_ops" else {"app/wsgi", "app/asgi"}
        assert layers and len(layers) == 1 and layers <= want, (table, kind, layers)


def _tables(text: str) -> dict[str, tuple[str, set[str]]]:
    """The tables a C file fills: name -> (struct, the functions named)."""
    found = {}
    for m in re.finditer(r"struct (conn_ops|app_ops) (\w+) = \{(.*?)\n\};", text, re.S):
        fns = set(re.findall(r"\.\w+ = (\w+)", re.sub(r"/\*.*?\*/", "", m.group(3), flags=re.S)))
        found[m.group(2)] = (m.group(1), fns)
    return found


def test_the_tables_are_read_where_the_layers_fill_them():
    """_tables() sees a table that names an adapter's function in the
    connection layer's table (the shape this rule forbids)."""
    planted = "static const struct conn_ops bad = {\n\t.open = h1_open,\n\t.owed = wsgi_owed, /* x */\n};\n"
    assert _tables(planted) == {"bad": ("conn_ops", {"h1_open", "wsgi_owed"})}


def test_layer_headers_include_nothing_above_them():
    for header, allowed in HEADERS.items():
        text = (NATIVE / header).read_text()
        ours = {inc for inc in re.findall(r'#include "([^"]+)"', text)
                if any(NATIVE.rglob(inc))}
        assert ours <= allowed, f"{header} includes {sorted(ours - allowed)}"
