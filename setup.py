import glob
import os
import shutil

from setuptools import Extension, setup

# llhttp's C sources come from Debian's node-llhttp (DESIGN.md section 1);
# setuptools takes relative paths only, so they are copied into build/ (never
# committed) and compiled into the HTTP extension
LLHTTP, COPY = "/usr/share/llhttp", "build/llhttp"
os.makedirs(COPY, exist_ok=True)
for name in ("api.c", "http.c", "llhttp.c"):
    shutil.copy2(f"{LLHTTP}/{name}", f"{COPY}/{name}")

# an undeclared function is an error, not an int assumed: CPython 3.13 took
# two private functions out of its headers and the build went on (pycompat.h)
CFLAGS = ["-std=gnu11", "-O2", "-Wall", "-Werror=implicit-function-declaration"]

setup(
    cffi_modules=["fdcore/_build.py:ffibuilder"],
    ext_modules=[Extension(
        "sockherd.worker._http",
        # every file of worker/native (its layers: worker/native/conn.h)
        sources=sorted(glob.glob("worker/native/*.c")) +
                [f"{COPY}/api.c", f"{COPY}/http.c", f"{COPY}/llhttp.c"],
        # fdcore's headers for its types: its functions are reached through
        # the addresses the cffi module hands over (worker/native/conn.h)
        include_dirs=["worker/native", "fdcore", "/usr/share/include/llhttp"],
        depends=sorted(glob.glob("worker/native/*.h")) + ["fdcore/fd.h", "fdcore/fd-t.h"],
        # llhttp.c holds two parsers and compiles the loose one unless told
        # (it skips any two bytes after chunk data: request smuggling; review)
        define_macros=[("LLHTTP_STRICT_MODE", "1")],
        # TLS in the engine (worker/native/conn_tls.c): Debian's libssl-dev
        libraries=["ssl", "crypto",
                   # permessage-deflate (worker/native/ws_deflate.c): Debian's zlib1g-dev
                   "z"],
        # hidden: the layers' functions are called across files, but are
        # the extension's own (no PLT call, no symbol of another library
        # taking their place); PyInit__http is exported by PyMODINIT_FUNC
        extra_compile_args=CFLAGS + ["-fvisibility=hidden"],
    ), Extension(
        # a loop thread's asyncio handles and ready pass (worker/aio.py)
        "sockherd.worker._aio",
        sources=["worker/aio_native/aio.c", "worker/aio_native/tasks.c", "worker/aio_native/handles.c",
                 "worker/aio_native/callers.c", "worker/aio_native/runner.c"],
        depends=["worker/aio_native/aio.h"],
        extra_compile_args=CFLAGS,
    ), Extension(
        # the ipc layer's nesting bound, walked in C (ipc/nesting.py)
        "sockherd.ipc._depth",
        sources=["ipc/native/depth.c"],
        extra_compile_args=CFLAGS,
    )],
)
