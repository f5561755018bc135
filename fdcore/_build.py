"""cffi builder for sockherd.fdcore._fdcore (out-of-line API mode).

setup.py names this file in cffi_modules. The C sources are compiled as they
are; the cdef below is kept in step with fd.h by hand (cffi cannot parse the
atomics in fd-t.h), and test_fdcore_api checks every declared function exists.
"""
from cffi import FFI

# setuptools wants paths relative to setup.py, with forward slashes.
HERE = "fdcore"
SOURCES = ["fd.c", "poller.c"]
HEADERS = ["fd-t.h", "fd.h"]

CDEF = """
const char *fdc_version(void);
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "sockherd.fdcore._fdcore",
    '#include "fd.h"',
    sources=[f"{HERE}/{s}" for s in SOURCES],
    depends=[f"{HERE}/{h}" for h in HEADERS],
    include_dirs=[HERE],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
