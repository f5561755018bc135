import os
import runpy
import shutil

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# the engine's layers, a folder each (worker/native/layers.py)
LAYERS = runpy.run_path("worker/native/layers.py")

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



class layered_build_ext(build_ext):
    """Compiles the engine folder by folder, each with only its own and the
    lower layers' include directories (worker/native/layers.py): a file
    including a header of a layer above it fails to build. The objects are
    then linked with llhttp's into the one extension, as before."""

    def build_extension(self, ext):
        if ext.name != "sockherd.worker._http":
            return super().build_extension(ext)
        objects = []
        for folder in LAYERS["STANDS_ON"]:
            srcs = [os.path.relpath(p) for p in LAYERS["sources"]()
                    if LAYERS["folder_of"](p) == folder]
            dirs = [os.path.relpath(d) for d in LAYERS["include_dirs"](folder)]
            objects += self.compiler.compile(
                srcs, output_dir=self.build_temp, macros=ext.define_macros,
                include_dirs=dirs + ext.include_dirs, debug=self.debug,
                extra_postargs=ext.extra_compile_args, depends=ext.depends)
        ext.extra_objects = objects
        super().build_extension(ext)     # llhttp's sources, and the link


setup(
    cmdclass={"build_ext": layered_build_ext},
    cffi_modules=["fdcore/_build.py:ffibuilder"],
    ext_modules=[Extension(
        "sockherd.worker._http",
        # llhttp's sources; the engine's, folder by folder, are compiled by
        # layered_build_ext above and linked with them
        sources=[f"{COPY}/api.c", f"{COPY}/http.c", f"{COPY}/llhttp.c"],
        # fdcore's headers for its types: its functions are reached through
        # the addresses the cffi module hands over (worker/native/conn/conn.h)
        include_dirs=list(LAYERS["EXTERNAL_INCLUDES"]),
        # any of them changed: the whole extension is built again
        depends=[os.path.relpath(p) for p in LAYERS["sources"]() + LAYERS["headers"]()] +
                ["fdcore/fd.h", "fdcore/fd-t.h"],
        # llhttp.c holds two parsers and compiles the loose one unless told
        # (it skips any two bytes after chunk data: request smuggling; review)
        define_macros=[("LLHTTP_STRICT_MODE", "1")],
        # TLS in the engine (worker/native/conn/conn_tls.c): Debian's libssl-dev
        libraries=["ssl", "crypto",
                   # permessage-deflate (worker/native/proto/ws/ws_deflate.c): Debian's zlib1g-dev
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
