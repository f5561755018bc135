"""The WebSocket codec and adapter under AddressSanitizer + UBSan: the
native extension compiled again with the sanitizers (as
tests/worker/test_http_asan.py does) and, in a child interpreter with
libasan preloaded, the frame codec's rules (test_ws_frame_codec.py), its
fuzz against the Python model (test_ws_frame_fuzz.py; FUZZ_WS_EXAMPLES,
200 here unless set: bench/fuzz_ws.sh --asan runs longer) and the
in-process engine's WebSocket cases over real sockets
(test_ws_protocol.py). conftest.py swaps the build in. Any sanitizer
report fails the run."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

LONGER = int(os.environ.get("FUZZ_WS_TIMEOUT", "0"))
pytestmark = pytest.mark.timeout(600 + LONGER)

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "worker" / "native"
LLHTTP = Path("/usr/share/llhttp")
HERE = Path(__file__).resolve().parent


def test_ws_suite_under_asan_and_ubsan(tmp_path):
    so = tmp_path / ("_http" + sysconfig.get_config_var("EXT_SUFFIX"))
    flags = ["-DLLHTTP_STRICT_MODE=1", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
             "-fvisibility=hidden", "-fno-sanitize-recover=all", "-g", "-O1", "-std=gnu11",
             "-shared", "-fPIC"]
    sources = [*sorted(NATIVE.glob("*.c")), LLHTTP / "api.c", LLHTTP / "http.c",
               LLHTTP / "llhttp.c"]
    subprocess.run(["gcc", *flags, f"-I{NATIVE}", f"-I{ROOT / 'fdcore'}",
                    "-I/usr/share/include/llhttp", f"-I{sysconfig.get_paths()['include']}",
                    *map(str, sources), "-lssl", "-lcrypto",   # TLS (conn_tls.c)
                    "-o", str(so)], check=True, timeout=300)
    libasan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                             text=True, check=True).stdout.strip()
    env = dict(os.environ, SOCKHERD_HTTP_MODULE=str(so), LD_PRELOAD=libasan,
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1", PYTHONMALLOC="malloc",
               FUZZ_WS_EXAMPLES=os.environ.get("FUZZ_WS_EXAMPLES", "200"))
    files = [HERE / "test_ws_frame_codec.py", HERE / "test_ws_frame_fuzz.py",
             HERE / "test_ws_protocol.py"]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                          "-p", "no:xdist", *[str(f) for f in files if f.exists()]],
                         env=env, capture_output=True, text=True, timeout=500 + LONGER, cwd=ROOT)
    report = run.stdout[-3000:] + run.stderr[-6000:]
    assert run.returncode == 0, report
    assert "ERROR: AddressSanitizer" not in run.stderr and "runtime error" not in run.stderr, report
    assert " passed" in run.stdout, report
    # the build under test was the sanitizer's, not the installed module
    assert "asan-build" in run.stdout, report
