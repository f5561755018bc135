"""Native builds the tests make once per run, shared by every xdist worker.

The sanitizer tests compile the same programs again and again: the fd core's
stress program under TSAN (tests/test_c_sanitizers.py's scenarios and
tests/test_c_mutations.py's controls), the repro programs under ASAN (their
sanitizer test and every mutant's control), and the HTTP extension under
ASAN (tests/worker/test_http_asan.py's chunks, test_proxy_protocol_asan.py,
tests/ws/test_ws_asan.py). Each build is named by a digest of what goes into
it (the compiler flags and the bytes of every source and header), so two
builds share an artefact only when they would produce the same one; a
mutated core copy has other bytes, hence its own build.

The artefacts live in the run's common temporary directory (the parent of
each xdist worker's basetemp), one lock file per artefact: the first worker
that needs one builds it while the others wait on the lock, then everyone
reuses it. Nothing survives the run (pytest's basetemp rotation removes it),
so a stale build is never picked up by a later run."""
from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path
from typing import Callable, Iterable


def run_dir(basetemp: Path, xdist_worker: bool) -> Path:
    """The directory every process of this pytest run shares: an xdist
    worker's basetemp is a child of it (popen-gwN), else basetemp itself.
    (Asked of the config, not of PYTEST_XDIST_WORKER, which the children a
    worker starts inherit.)"""
    return basetemp.parent if xdist_worker else basetemp


def digest(flags: Iterable[str], files: Iterable[Path | str]) -> str:
    """A name for the build of `files` with `flags`: their order, names and
    bytes included (a header edited, a source mutated: another digest)."""
    h = hashlib.sha256()
    for flag in flags:
        h.update(b"F" + flag.encode() + b"\0")
    for f in files:
        p = Path(f)
        h.update(b"P" + str(p).encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()[:24]


def build_once(root: Path, name: str, key: str, build: Callable[[Path], object]) -> Path:
    """The artefact `name` of build `key` under root: build(out) writes it
    at out the first time (any worker of the run), later calls only wait
    for it. A failed build leaves nothing behind: the next call tries again
    and reports the failure itself."""
    where = root / "shared-builds" / key
    where.mkdir(parents=True, exist_ok=True)
    out = where / name
    with open(where / ".lock", "w") as lock:
        # held for the build: another worker asking for it waits here
        # instead of compiling the same thing beside it on the same cores
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not out.exists():
                partial = where / f".{name}.{os.getpid()}"
                build(partial)
                partial.rename(out)   # whole or absent, never half-written
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return out
