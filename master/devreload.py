"""--reload: a development server that reloads when the code changes.

A watcher thread (watchfiles, Rust's notify underneath: inotify here)
follows the app's package and the extra paths; a batch of changes it
reports is handed to the master's loop (`Supervisor.run_in_loop`), which
reloads exactly as a HUP does. So the development reload inherits the
reload contract instead of having one of its own: the new generation
starts beside the serving one and takes over only once every worker is
READY (a page loading while the file is saved never fails), and an edit
that breaks the import is a refused reload: the worker's traceback is
logged as it failed, and the last good generation serves on. uvicorn
instead kills and restarts its one server process, and gunicorn's
--reload restarts workers as they are: both drop what is in flight and
serve nothing while a broken edit is fixed.

What is watched (issue 36 §4: the app's package alone missed most edits
of a real project, notes/views.py of a Django project among them): the
project, the working directory (chdir, else the current directory), as
uvicorn watches it, or the reload_dirs instead (uvicorn's --reload-dir);
the directory of the app's top-level package (found with importlib's
finders on the worker's sys.path: chdir and pythonpath first, as the
worker will import it; nothing is imported here) and the pythonpath
directories, where they lie outside it; then every path of
reload_extra_files. A change counts when the file's name matches
reload_include (`*.py`) or it is one of reload_extra_files, and no part of
its path matches reload_exclude or watchfiles' own ignore list (.git,
__pycache__, editors' swap files).

Debounce: watchfiles yields a batch once no change came for 50 ms (an
editor's save is several writes and a rename) and at most every 1.6 s
during a continuous stream; a batch that arrives while a reload runs is
queued behind it (`_reload(queue=True)`), never lost, and batches queued
meanwhile are one reload, not several.
"""
from __future__ import annotations

import fnmatch
import importlib.machinery
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger("sockherd.master")

# Ctrl-C in --reload mode drains in-flight requests this long at most (uvicorn
# waits for them as well; a second Ctrl-C stops at once)
DEV_DRAIN = 5.0


class MissingWatchfiles(ValueError):
    """--reload cannot watch: the start fails with this said."""


def watched_paths(settings) -> list[Path]:
    """The directories and files --reload follows for settings: the
    project (the working directory, chdir's, as uvicorn watches; or
    reload_dirs, uvicorn's --reload-dir, instead), the app's package and
    the pythonpath directories where they lie outside it, and
    reload_extra_files. A path inside one already watched is not added."""
    base = Path(settings.chdir or os.getcwd()).resolve()
    paths: list[Path] = []

    def add(p: Path) -> None:
        if not any(p == q or (q.is_dir() and p.is_relative_to(q)) for q in paths):
            paths.append(p)

    for d in [(base / d).resolve() for d in settings.reload_dirs] or [base]:
        add(d)
    add(app_root(settings.app, base, settings.pythonpath))
    for d in settings.pythonpath:
        add((base / d).resolve())
    for extra in settings.reload_extra_files:
        add((base / extra).resolve())
    return paths


def app_root(app: str, base: Path, pythonpath) -> Path:
    """The directory holding the app's code: its top-level package's, else
    the directory of its module, else base."""
    if not app:
        return base
    top = app.partition(":")[0].split(".")[0]
    search = [str((base / p).resolve()) for p in pythonpath] + [str(base)]
    spec = importlib.machinery.PathFinder.find_spec(top, search)
    if spec is None:
        return base
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0]).resolve()
    if spec.origin:
        return Path(spec.origin).resolve().parent
    return base


class ChangeFilter:
    """watchfiles' watch_filter: (change, path) -> whether it counts."""

    def __init__(self, include, exclude, extra_files) -> None:
        from watchfiles import DefaultFilter

        self.default = DefaultFilter()
        self.include = tuple(include)
        self.exclude = tuple(exclude)
        self.extra = {str(p) for p in extra_files}

    def __call__(self, change, path: str) -> bool:
        if not self.default(change, path):
            return False
        if path in self.extra:
            return True
        parts = Path(path).parts
        if any(fnmatch.fnmatch(part, pat) for part in parts for pat in self.exclude):
            return False
        return any(fnmatch.fnmatch(parts[-1], pat) for pat in self.include)


class Watcher:
    """The watcher thread as a master extra (Supervisor.add_extra): no fds
    of its own, closed with the master."""

    def __init__(self, sup, paths: list[Path], flt: ChangeFilter) -> None:
        self.sup, self.paths, self.filter = sup, paths, flt
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sockherd-reload", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        from watchfiles import watch

        # its "N changes detected" at INFO would double our own line
        logging.getLogger("watchfiles").setLevel(logging.WARNING)
        try:
            for changes in watch(*self.paths, watch_filter=self.filter, stop_event=self.stop,
                                 raise_interrupt=False, rust_timeout=1000):
                if changes:
                    self.sup.run_in_loop(lambda c=changes: self._changed(c))
        except Exception:                               # noqa: BLE001 - a dead watcher is said
            log.exception("reload: the file watcher failed: files are not watched any more")

    def _changed(self, changes) -> None:
        if self.sup.stopping:
            return
        names = sorted({os.path.relpath(p) for _, p in changes})
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        log.info("reload: %s changed", shown)
        self.sup._reload(queue=True)

    # the extra's interface (Supervisor.add_extra)
    def fds(self) -> list[int]:
        return []

    def poll(self) -> None:
        pass

    def next_deadline(self):
        return None

    def close(self) -> None:
        self.stop.set()


def attach(sup) -> None:
    """--reload: start the watcher. Raises MissingWatchfiles when the
    package is not installed (the start fails with that said)."""
    settings = sup.settings
    if not settings.reload:
        return
    try:
        import watchfiles  # noqa: F401
    except ImportError:
        raise MissingWatchfiles(
            "--reload needs the watchfiles package: pip install 'sockherd[reload]'") from None
    paths = watched_paths(settings)
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise MissingWatchfiles(f"--reload: no such file or directory: {', '.join(missing)}")
    base = Path(settings.chdir or os.getcwd()).resolve()
    extra = [(base / p).resolve() for p in settings.reload_extra_files]
    watcher = Watcher(sup, paths, ChangeFilter(settings.reload_include, settings.reload_exclude,
                                               extra))
    sup.add_extra(watcher)
    watcher.start()
    log.info("reload: watching %s (%s)", ", ".join(str(p) for p in paths),
             ", ".join(settings.reload_include))
