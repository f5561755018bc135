"""The native HTTP extension (worker/native, llhttp's sources included)
compiled again with AddressSanitizer + UBSan, and pytest runs of test files
against that build in a child interpreter with libasan preloaded
(tests/worker/conftest.py swaps the build in when SOCKHERD_HTTP_MODULE
names it).

Used by tests/worker/test_http_asan.py, test_proxy_protocol_asan.py and
tests/ws/test_ws_asan.py through the conftest's http_asan_env fixture: the
extension is compiled once per test run and shared by all of them
(tests/shared_builds.py), instead of once per test file."""
from __future__ import annotations

import os
import runpy
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from shared_builds import digest

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "worker" / "native"
LAYERS = runpy.run_path(str(NATIVE / "layers.py"))      # a folder a layer
LLHTTP = Path("/usr/share/llhttp")
FLAGS = ("-DLLHTTP_STRICT_MODE=1", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
         "-fvisibility=hidden", "-fno-sanitize-recover=all", "-g", "-O1", "-std=gnu11",
         "-shared", "-fPIC")
SO_NAME = "_http" + sysconfig.get_config_var("EXT_SUFFIX")
# what the child's conftest prints once it has put the build in place
SWAPPED = "sanitizer build in place:"


def sources() -> list[Path]:
    """Every file of the extension, as setup.py builds it."""
    return [*LAYERS["sources"](), LLHTTP / "api.c", LLHTTP / "http.c", LLHTTP / "llhttp.c"]


def build_key() -> str:
    headers = [*LAYERS["headers"](), *sorted((ROOT / "fdcore").glob("*.h"))]
    return digest(FLAGS, [*sources(), *headers])


def build(so: Path) -> Path:
    """Compiles the extension with the sanitizers into `so`: one compiler
    per source, as many at once as there are cores (the other xdist
    workers that need the build wait for it meanwhile), then the link."""
    objs = so.parent / f"{so.name}.o"
    objs.mkdir(exist_ok=True)
    includes = [f"-I{ROOT / 'fdcore'}", "-I/usr/share/include/llhttp",
                f"-I{sysconfig.get_paths()['include']}"]

    def compile_one(i_src):
        i, src = i_src
        obj = objs / f"{i:02d}-{src.stem}.o"
        # each layer with its own include directories, as setup.py builds it
        layer = ([f"-I{d}" for d in LAYERS["include_dirs"](LAYERS["folder_of"](src))]
                 if src.is_relative_to(NATIVE) else [])
        subprocess.run(["gcc", *FLAGS, *layer, *includes, "-c", str(src), "-o", str(obj)],
                       check=True, timeout=600)
        return str(obj)

    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        built = list(pool.map(compile_one, enumerate(sources())))
    subprocess.run(["gcc", *FLAGS, *built, "-lssl", "-lcrypto", "-lz",    # TLS (conn_tls.c), ws_deflate.c
                    "-o", str(so)], check=True, timeout=600)
    return so


def child_env(so: Path) -> dict:
    """The environment that makes a child interpreter load the build."""
    libasan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                             text=True, check=True).stdout.strip()
    return dict(os.environ, SOCKHERD_HTTP_MODULE=str(so), LD_PRELOAD=libasan,
                # CPython's own allocations are not ours to judge (leaks at exit)
                ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
                UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
                PYTHONMALLOC="malloc")


def run_under_asan(env: dict, files: list[str | Path], timeout: float) -> str:
    """pytest on files (names of tests/worker, or paths) in a child with the
    sanitizer build; fails on a failed test, on any sanitizer report, and
    if the child did not run that build. Returns the child's stdout."""
    paths = [str(f if Path(f).is_absolute() else ROOT / "tests" / "worker" / f) for f in files]
    # bench/fuzz_*.sh --asan: the round's seed reaches the child that generates
    # the inputs (the outer pytest's --hypothesis-seed stops at this process),
    # so a failing round is replayed by its seed
    seed = [f"--hypothesis-seed={env['FUZZ_SEED']}"] if env.get("FUZZ_SEED") else []
    # -s: a sanitizer report goes to fd 2, which pytest would otherwise swallow.
    # --basetemp of its own: children sharing /tmp/pytest-of-<user> prune one
    # another's numbered dirs at exit, and a dir gone under pytest's scandir
    # left it unclosed: a ResourceWarning, an error here (seen at -n 4)
    with tempfile.TemporaryDirectory(prefix="asan-child-") as base:
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                              "-p", "no:xdist", "--basetemp", base, *seed, *paths],
                             env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    report = run.stdout[-3000:] + run.stderr[-6000:]
    assert run.returncode == 0, report
    assert "ERROR: AddressSanitizer" not in run.stderr and "runtime error" not in run.stderr, report
    assert " passed" in run.stdout, report
    assert f"{SWAPPED} {env['SOCKHERD_HTTP_MODULE']}" in run.stdout, report
    return run.stdout
