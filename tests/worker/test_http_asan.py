"""The native HTTP extension under AddressSanitizer + UBSan: it is compiled
again with the sanitizers (same sources, llhttp's included), and
test_http_parser.py (its strictness cases, the split-anywhere and garbage
hypothesis fuzzing), test_http_review.py (the adversarial review's cases),
test_http_smuggling.py and test_http_limits.py (the raw line scanner's
refusals and limits, over real sockets),
test_wsgi.py (the whole engine: loop turns, connections, responses,
over real sockets), test_parked_response_body.py (a body sent from the loop:
its tail, its resumed iterator, its end however it comes),
test_app_containment.py (whatever an app raises or
hands back, start_response's attributes it sets included),
test_engine_fuzz.py (generated and garbage requests
split anywhere, over real sockets) and test_http_framing_fuzz.py /
test_http_framing_known.py (the whole request path framed against a strict
reference, on the Parser and on sockets; FUZZ_HTTP_EXAMPLES, 100 here unless
set, passes through for bench/fuzz_http.sh's longer runs) and
test_body_buffer_engine.py (a body read in the loop before the app runs:
the held request's edges), test_dispatch_spill_queue.py (per-request
dispatch: the spill queue), the responses of issue 18 §4
(test_response_streaming.py, test_response_headers.py,
test_pipelined_output.py, test_http_refusals.py) and the ASGI adapter's
(test_asgi_http.py, test_asgi_app_errors.py, test_asgi_flow_control.py,
test_aio_loop.py, and its extensions': test_asgi_pathsend.py,
test_asgi_trailers.py, test_asgi_body_timeout.py), the trusted proxy headers' (test_forwarded_headers.py,
test_forwarded_asgi.py: garbage values included) run against that build in a child interpreter
with libasan preloaded (conftest.py swaps it in). Any sanitizer report
fails the run."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

# bench/fuzz_http.sh --asan lengthens the run: FUZZ_HTTP_TIMEOUT seconds more
LONGER = int(os.environ.get("FUZZ_HTTP_TIMEOUT", "0"))
pytestmark = pytest.mark.timeout(600 + LONGER)

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "worker" / "native"
LLHTTP = Path("/usr/share/llhttp")


def build_asan(tmp_path) -> dict:
    """The extension built again with ASan + UBSan into tmp_path; the
    environment that makes a child interpreter load it (conftest.py)."""
    so = tmp_path / ("_http" + sysconfig.get_config_var("EXT_SUFFIX"))
    flags = ["-DLLHTTP_STRICT_MODE=1", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
             "-fvisibility=hidden",
             "-fno-sanitize-recover=all", "-g", "-O1", "-std=gnu11", "-shared", "-fPIC"]
    # every file of the extension, as setup.py builds it
    sources = [*sorted(NATIVE.glob("*.c")),
               LLHTTP / "api.c", LLHTTP / "http.c", LLHTTP / "llhttp.c"]
    subprocess.run(["gcc", *flags, f"-I{NATIVE}", f"-I{ROOT / 'fdcore'}", "-I/usr/share/include/llhttp",
                    f"-I{sysconfig.get_paths()['include']}", *map(str, sources),
                    "-lssl", "-lcrypto", "-o", str(so)],        # TLS (conn_tls.c)
                   check=True, timeout=300)
    libasan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                             text=True, check=True).stdout.strip()
    return dict(os.environ, SOCKHERD_HTTP_MODULE=str(so), LD_PRELOAD=libasan,
                # CPython's own allocations are not ours to judge (leaks at exit)
                ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
                UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
                PYTHONMALLOC="malloc")


def run_under_asan(env: dict, files: list[str], timeout: float) -> None:
    """pytest on files (of tests/worker) in a child with the sanitizer
    build; fails on a failed test or any sanitizer report."""
    # -s: a sanitizer report goes to fd 2, which pytest would otherwise swallow
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                          "-p", "no:xdist",
                          *(str(ROOT / "tests" / "worker" / f) for f in files)],
                         env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    report = run.stdout[-3000:] + run.stderr[-6000:]
    assert run.returncode == 0, report
    assert "ERROR: AddressSanitizer" not in run.stderr and "runtime error" not in run.stderr, report
    assert " passed" in run.stdout, report


def test_parser_suite_under_asan_and_ubsan(tmp_path):
    env = build_asan(tmp_path)
    # the framing fuzz's share of this run: tens of seconds unless asked for more
    env["FUZZ_HTTP_EXAMPLES"] = os.environ.get("FUZZ_HTTP_EXAMPLES", "100")
    run_under_asan(env, [
        "test_http_parser.py", "test_http_review.py", "test_http_smuggling.py",
        "test_http_limits.py", "test_wsgi.py", "test_app_containment.py", "test_engine_fuzz.py",
        "test_http_framing_fuzz.py", "test_http_framing_known.py", "test_http_pipeline_eof.py",
        "test_parked_response_body.py", "test_body_buffer_engine.py",
        "test_dispatch_spill_queue.py", "test_response_streaming.py",
        "test_response_headers.py", "test_pipelined_output.py", "test_http_refusals.py",
        "test_asgi_http.py", "test_asgi_app_errors.py", "test_asgi_flow_control.py",
        "test_aio_loop.py", "test_asgi_pathsend.py", "test_asgi_trailers.py",
        "test_asgi_body_timeout.py", "test_forwarded_headers.py", "test_forwarded_asgi.py"],
        timeout=700 + LONGER)
