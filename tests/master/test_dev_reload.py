"""--reload (issue 24 §5) on a real master and workers: an edit of the
app's package reloads it as HUP does (no failed request while the file is
saved under load), an edit that breaks the import is a refused reload with
its traceback in the terminal and the last good code serving, extra files
and the include/exclude patterns decide what counts, and Ctrl-C drains an
in-flight request instead of cutting it."""
from __future__ import annotations

import http.client
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from test_reload import Clients, get
from test_run import master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)
pytest.importorskip("watchfiles")

VIEWS = """
import time
VERSION = {version!r}
{extra}
def app(environ, start_response):
    if environ["PATH_INFO"] == "/slow":
        open("slow.started", "w").close()       # the test's sign: in the app
        time.sleep(1.5)
    body = ("%s %s" % (VERSION, environ["PATH_INFO"])).encode()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [body]
"""


def write_pkg(root: Path, version: str, extra: str = "") -> None:
    """devpkg/views.py (the app), devpkg/__init__.py; the write is a
    rename, as editors save (the file is never seen half written)."""
    pkg = root / "devpkg"
    pkg.mkdir(exist_ok=True)
    if not (pkg / "__init__.py").exists():
        (pkg / "__init__.py").touch()
    tmp = root / ".views.tmp"
    tmp.write_text(VIEWS.format(version=version, extra=extra))
    os.replace(tmp, pkg / "views.py")


def answers(port: int, version: str) -> None:
    wait_for(lambda: get(port).startswith(version + " "), 30, f"{version} answers")


def test_a_saved_edit_reloads_without_a_failed_request(master, tmp_path):
    write_pkg(tmp_path, "v1")
    m = master("devpkg.views:app", "-w", "2", "--reload")
    m.wait_log(r"reload: watching " + re.escape(str(tmp_path)))
    answers(m.port, "v1")
    clients = Clients(m.port, fresh=2, kept=2)
    try:
        wait_for(lambda: clients.ok > 20, 10, "traffic")
        for i in (2, 3):
            write_pkg(tmp_path, f"v{i}")
            m.wait_log(r"reload: devpkg/views\.py changed", count=i - 1)
            wait_for(lambda: f"v{i}" in clients.versions[-5:], 30, f"v{i} answers")
        # each save is a reload (one saved while the first starts waits for it)
        m.wait_log(r"reload: generation \d+ serving", count=2)
    finally:
        clients.stop()
    assert clients.failures == [], clients.failures[:5]


def test_an_edit_that_breaks_the_import_is_refused_and_the_last_good_code_serves(
        master, tmp_path):
    write_pkg(tmp_path, "v1")
    m = master("devpkg.views:app", "-w", "1", "--reload", ready=1)
    answers(m.port, "v1")
    write_pkg(tmp_path, "v2", "def broken(:\n    pass")
    m.wait_log(r"reload refused \(generation 2\)")
    text = m.text()
    # the traceback as Python prints it, file and line, in the terminal
    assert "SyntaxError" in text and "devpkg/views.py" in text, text
    assert get(m.port).startswith("v1 ")
    write_pkg(tmp_path, "v3")
    answers(m.port, "v3")


def test_extra_files_and_patterns_decide_what_reloads(master, tmp_path):
    write_pkg(tmp_path, "v1")
    settings = tmp_path / "feature.flags"
    settings.write_text("a\n")
    m = master("devpkg.views:app", "-w", "1", "--reload", "--reload-extra-files",
               str(settings), "--reload-exclude", "generated_*", ready=1)
    answers(m.port, "v1")
    # neither counts: a data file of the package (not *.py) and an excluded module
    (tmp_path / "devpkg" / "notes.txt").write_text("x")
    (tmp_path / "devpkg" / "generated_schema.py").write_text("X = 1\n")
    # then an extra file does: one reload, naming only it
    settings.write_text("b\n")
    m.wait_log(r"reload: generation 2 serving")
    changed = re.findall(r"reload: (.*) changed", m.text())
    assert changed == ["feature.flags"], changed
    # a source file of the package does as well
    write_pkg(tmp_path, "v2")
    answers(m.port, "v2")
    assert re.findall(r"reload: (.*) changed", m.text()) == ["feature.flags",
                                                             "devpkg/views.py"]


def test_ctrl_c_lets_the_request_in_flight_end(master, tmp_path):
    write_pkg(tmp_path, "v1")
    m = master("devpkg.views:app", "-w", "1", "--reload", ready=1)
    answers(m.port, "v1")
    got: list = []

    def slow() -> None:
        c = http.client.HTTPConnection("127.0.0.1", m.port, timeout=10)
        try:
            c.request("GET", "/slow")
            r = c.getresponse()
            got.append((r.status, r.read()))
        except Exception as exc:  # noqa: BLE001 - the outcome is the test
            got.append(exc)

    t = threading.Thread(target=slow)
    t.start()
    wait_for(lambda: (tmp_path / "slow.started").exists(), 10, "the slow request in the app")
    # Ctrl-C in a terminal sends INT to the whole foreground group; the
    # workers ignore it (worker/bootstrap.py): the master's is what counts
    m.proc.send_signal(signal.SIGINT)
    t.join(10)
    assert got == [(200, b"v1 /slow")], got
    assert m.proc.wait(10) == 0
    assert "INT: draining in-flight requests" in m.text()


DJANGO_LIKE = {
    # the standard layout: the app spec names mysite.wsgi, the views are in
    # another package of the project, imported by it
    "manage.py": "",
    "mysite/__init__.py": "",
    "mysite/wsgi.py": "from notes.views import app as application\n",
    "notes/__init__.py": "",
}


def write_views(root: Path, version: str, extra: str = "") -> None:
    tmp = root / ".views.tmp"
    tmp.write_text(VIEWS.format(version=version, extra=extra))
    os.replace(tmp, root / "notes" / "views.py")


def test_an_edit_of_a_nested_module_of_the_project_reloads(master, tmp_path):
    """Issue 36 §4: --reload watched the app's top-level package only
    (mysite/), so the edits of notes/views.py, where a Django project's
    code is, never reloaded. Now the project (the working directory) is
    watched: the edit is served within 2 s of the save, and a broken one
    is refused with the last good code serving."""
    for name, text in DJANGO_LIKE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    write_views(tmp_path, "v1")
    m = master("mysite.wsgi:application", "-w", "1", "--reload", ready=1)
    m.wait_log(r"reload: watching " + re.escape(str(tmp_path)))
    answers(m.port, "v1")
    write_views(tmp_path, "v2")
    saved = time.monotonic()
    wait_for(lambda: get(m.port).startswith("v2 "), 30, "v2 answers")
    assert time.monotonic() - saved < 2.0, time.monotonic() - saved
    assert "on probation" not in m.text()          # --reload: no probation by default
    write_views(tmp_path, "v3", "def broken(:\n    pass")
    m.wait_log(r"reload refused \(generation 3\)")
    assert get(m.port).startswith("v2 ")
    write_views(tmp_path, "v4")
    answers(m.port, "v4")


def test_reload_dir_watches_those_instead(master, tmp_path):
    """uvicorn's --reload-dir: the directories named, not the working
    directory (the app's package is watched anyway)."""
    write_pkg(tmp_path, "v1")
    (tmp_path / "other").mkdir()
    m = master("devpkg.views:app", "-w", "1", "--reload", "--reload-dir", "other", ready=1)
    m.wait_log(r"reload: watching " + re.escape(str(tmp_path / "other")) + ", "
               + re.escape(str(tmp_path / "devpkg")) + r" \(")
    (tmp_path / "loose.py").write_text("X = 1\n")            # outside both: no reload
    (tmp_path / "other" / "mod.py").write_text("X = 1\n")
    m.wait_log(r"reload: other/mod\.py changed")
    assert "loose.py changed" not in m.text()
