"""`sockherd ctl`'s command line and tables against a real master: the
ctl options after the command's words, and units in the tables."""
from __future__ import annotations

import json
import re

import pytest

from test_control import ctl
from test_run import master  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)


def test_json_is_accepted_after_the_command_as_well_as_before(master, tmp_path):
    """Defect: `ctl status --json` (and `show proc --json`, `watch --json`)
    was a usage error (exit 2, 'unrecognized arguments: --json'): only
    `ctl --json status` worked."""
    m = master("-w", "1", ready=1)
    for words in (("status", "--json"), ("show", "proc", "--json"),
                  ("show", "proc", "--json", "--threads"), ("--json", "status")):
        done = ctl(tmp_path, *words)
        assert done.returncode == 0, (words, done.stderr)
        got = json.loads(done.stdout)
        pid = got["pid"] if "pid" in got else got["master"]["pid"]
        assert pid == m.proc.pid, words
    threads = json.loads(ctl(tmp_path, "show", "proc", "--threads", "--json").stdout)
    assert threads["workers"][0]["threads"], threads


def test_show_proc_uptime_has_a_unit(master, tmp_path):
    """Defect: `ctl show proc`'s UPTIME column was a bare number (12.3) with
    no unit."""
    master("-w", "1", ready=1)
    table = ctl(tmp_path, "show", "proc").stdout
    lines = table.splitlines()
    col = lines[0].index("UPTIME")              # columns are padded to their header
    for line in lines[1:3]:                     # master and worker 1.0
        assert re.fullmatch(r"\d+(\.\d)?(s|min|h|d)", line[col:].split()[0]), table
