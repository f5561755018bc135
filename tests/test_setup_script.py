"""make.sh, the README's entry point on a bare Debian machine: without make
it installs make with apt-get, then hands over to make; with make present it
goes straight to make. apt-get and make are stand-ins here that record their
arguments (the real install is what `.ci/run` does on a fresh machine)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(30)

STUB = """#!/bin/sh
echo "$(basename "$0") $*" >> "{log}"
"""


def run_script(tmp_path: Path, with_make: bool) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "log"
    tools = ["apt-get"] + (["make"] if with_make else [])
    for tool in tools:
        (bin_dir / tool).write_text(STUB.format(log=log))
        (bin_dir / tool).chmod(0o755)
    if not with_make:
        # the stand-in apt-get "installs" make by creating the stand-in make
        (bin_dir / "apt-get").write_text(STUB.format(log=log) + f"""
if [ "$1" = install ]; then printf '%s' '{STUB.format(log=log)}' > "{bin_dir}/make"; chmod 755 "{bin_dir}/make"; fi
""")
    # a PATH with the stand-ins and the shell's basics, but no real make
    for tool in ("dirname", "basename", "sh", "chmod"):
        real = shutil.which(tool)
        if real and not (bin_dir / tool).exists():
            os.symlink(real, bin_dir / tool)
    env = {"PATH": str(bin_dir)}
    res = subprocess.run([shutil.which("sh"), str(ROOT / "make.sh"), "test"], env=env,
                         capture_output=True, text=True, timeout=20)
    return res, (log.read_text().splitlines() if log.exists() else [])


def test_without_make_installs_it_then_runs_make(tmp_path):
    res, log = run_script(tmp_path, with_make=False)
    assert res.returncode == 0, res.stderr
    assert log == ["apt-get update -qq", "apt-get install -y -qq make", "make test"]
    assert "installing make" in res.stderr


def test_with_make_goes_straight_to_make(tmp_path):
    res, log = run_script(tmp_path, with_make=True)
    assert res.returncode == 0, res.stderr
    assert log == ["make test"]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "\n    sh make.sh test\n" in readme
    assert ci.rstrip().endswith("sh make.sh test")


def test_the_readme_reads_in_five_minutes_and_its_links_hold():
    """Issue 36 §7: the README was 1,142 lines, the newcomer's steps among
    internals; now under 250, the rest in docs/, each file it names there."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250, len(readme.splitlines())
    named = set(re.findall(r"\]\(((?:docs|bench)/[^)#]+)\)", readme))
    assert {"docs/guide.md", "docs/settings.md", "docs/install.md"} <= named, named
    for path in named:
        assert (ROOT / path).is_file(), path
