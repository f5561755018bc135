"""The native engine's layers: one folder each (docs/ARCHITECTURE.md draws
them). A folder's files see the headers of their own folder and of the
folders it stands on, nothing else: setup.py (and every other build of the
extension: the sanitizer one, the layer test's) compiles each folder with
exactly those include directories, so a file that includes a header of a
layer above it does not build. Calls are checked apart, on the compiled
objects (tests/worker/test_native_layers.py): a function may be called
only from its own folder or from a folder standing on it.

Read by setup.py and the tests with runpy: plain data and two functions,
no import of sockherd (the build runs before there is one)."""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent

# folder -> the folders below it that it stands on (their headers and their
# functions are its to use), bottom up. "." is the assembly: it stands on
# every layer and is the only one that names the tables joining them.
STANDS_ON: dict[str, tuple[str, ...]] = {
    # parsers and matchers: bytes (or addresses) in, facts out; no
    # connection, no socket, no Server. The HTTP/1 request parser is here,
    # below the connection layer, only because the Server still holds its
    # limits by value (conn/server.h): it moves up to proto/http1 when each
    # layer holds its own settings (issue 37, step 2)
    "parse": (),
    # one socket and its bytes: fd via fdcore, backpressure, timers, close,
    # TLS, the PROXY step, address trust; the Server every connection reads
    "conn": ("parse",),
    # the loop turn, accept and take, the group's shared queue
    "engine": ("conn", "parse"),
    # the HTTP/1 codec: request cycle, response heads, the only writer of
    # HTTP/1 bytes (the adapters still write some: step 3)
    "proto/http1": ("engine", "conn", "parse"),
    # the WebSocket frame codec: bytes to frames and back, no connection
    "proto/ws": (),
    # the adapters: shapes of the app's interface; side by side, neither
    # sees the other
    "app/wsgi": ("proto/http1", "engine", "conn", "parse"),
    "app/asgi": ("proto/ws", "proto/http1", "engine", "conn", "parse"),
    ".": ("app/wsgi", "app/asgi", "proto/ws", "proto/http1", "engine", "conn", "parse"),
}

# what every folder compiles against besides: fdcore's types (its functions
# are reached through struct fdc_api) and llhttp's header (Debian's
# node-llhttp); Python's own comes from the compiler's defaults
EXTERNAL_INCLUDES = ("fdcore", "/usr/share/include/llhttp")


def folder_of(path: Path) -> str:
    """The layer (its folder, relative to worker/native) of a native file."""
    rel = path.resolve().parent.relative_to(HERE)
    return "." if str(rel) == "." else rel.as_posix()


def include_dirs(folder: str) -> list[Path]:
    """The include directories a file of `folder` compiles with: its own,
    then those it stands on (no other folder of the engine)."""
    return [HERE / folder] + [HERE / below for below in STANDS_ON[folder]]


def sources() -> list[Path]:
    """Every C file of the engine, layer by layer, bottom up."""
    return [src for folder in STANDS_ON for src in sorted((HERE / folder).glob("*.c"))]


def headers() -> list[Path]:
    return [h for folder in STANDS_ON for h in sorted((HERE / folder).glob("*.h"))]
