"""The package layout of DESIGN.md section 1, checked on the installed package."""
import importlib
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["master", "worker", "fdcore", "ipc"])
def test_subpackage_maps_to_top_level_folder(name):
    mod = importlib.import_module(f"sockherd.{name}")
    assert Path(mod.__file__).resolve().parent == ROOT / name


def test_sockherd_is_a_namespace_without_folder():
    import sockherd

    assert getattr(sockherd, "__file__", None) is None
    assert not (ROOT / "sockherd").exists()


def test_version_from_console_script():
    exe = Path(sys.executable).parent / "sockherd"
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"sockherd {version('sockherd')}"


def test_module_entry_point_help_lists_signals():
    out = subprocess.run(
        [sys.executable, "-m", "sockherd.master", "--help"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert "HUP" in out.stdout and "USR2" in out.stdout
