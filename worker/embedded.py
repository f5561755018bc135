"""The embedded default app: what bare `sockherd run` serves.

The live status page (master/status_page.py): master -> generations ->
workers -> thread groups -> threads with their fdcore counters, the same
tree the metrics listener's /-/status shows. The worker that answers asks
its master over the control channel (`show proc --threads`, as
`sockherd ctl` would); when it cannot (control off, a tcp:// endpoint that
needs keys, a master too busy to answer in ASK_TIMEOUT), the page shows
what this worker knows of itself and says why.

    /  and  /-/status    the page (it refreshes itself from the JSON)
    /-/status.json       the tree, and the page's fragment rendered from it
    anything else        404

The control endpoint comes from the settings as the worker got them (its
loop's `config`, when the bootstrap sets it), else from the environment the
master passed on (SOCKHERD_RUNTIME_DIR, SOCKHERD_CONTROL, XDG_RUNTIME_DIR),
which is where a master without those settings put it. A tree whose master
is not our parent is another instance's (a shared default runtime
directory): never shown as ours.
"""
from __future__ import annotations

import logging
import os

from sockherd.master import status_page
from sockherd.worker import report

log = logging.getLogger("sockherd.worker")

ASK_TIMEOUT = 2.0          # per control request; the page is served from a loop thread


def _settings(loop) -> dict:
    cfg = getattr(loop, "config", None)
    if cfg is not None:
        return cfg
    return {"runtime_dir": os.environ.get("SOCKHERD_RUNTIME_DIR", ""),
            "control": os.environ.get("SOCKHERD_CONTROL", "")}


def _pid_at(endpoint: str) -> int:
    """The pid of the master serving endpoint (0: no answer)."""
    from sockherd.master import ctl

    try:
        return int(ctl.request(endpoint, "status", timeout=ASK_TIMEOUT)["pid"])
    except (ctl.CtlError, KeyError, TypeError, ValueError):
        return 0


def _from_master(loop) -> dict:
    """The master's tree (as inspect.tree gives it, with each worker's
    threads); raises LookupError saying why not."""
    from sockherd.master import control, ctl

    cfg = _settings(loop)
    endpoint = control.endpoint_of(cfg)
    if endpoint is None:
        raise LookupError("the control channel is off")
    if endpoint.startswith("ipc://") and not os.path.exists(endpoint[len("ipc://"):]) and \
            not cfg.get("runtime_dir") and not cfg.get("control"):
        # the master's own directory is named after the binds it started
        # with; a reload may have changed them: the one of our master
        endpoint = next((ep for ep in control.masters(control.default_runtime_dirs())
                         if _pid_at(ep) == os.getppid()), endpoint)
    if endpoint.startswith("ipc://") and not os.path.exists(endpoint[len("ipc://"):]):
        raise LookupError(f"no control socket at {endpoint}")   # else a wait for nobody
    try:
        # two rounds of questions in the master (figures, then threads)
        tree = ctl.request(endpoint, "show proc", {"threads": True}, timeout=2 * ASK_TIMEOUT)
    except ctl.CtlError as exc:
        raise LookupError(f"{endpoint}: {exc}") from None
    if tree["master"]["pid"] != os.getppid():
        raise LookupError(f"{endpoint} is another master's (pid {tree['master']['pid']})")
    return tree


def own_tree(loop) -> dict:
    """What this worker knows without its master: itself, below its parent."""
    gen, idx = getattr(loop, "identity", (0, 0))
    stats = report.answer(loop, "proc")
    return {
        "master": {"pid": os.getppid()},
        "workers": [{
            "worker": f"{gen}.{idx}", "generation": gen, "index": idx, "pid": os.getpid(),
            "state": "draining" if loop.draining else "ready",
            "role": "draining" if loop.draining else "serving", "uptime": stats["uptime"],
            "connections": stats["connections"], "stats": stats,
            "threads": report.answer(loop, "activity")["threads"],
        }],
    }


def gather(loop) -> tuple[dict, str]:
    """(tree, note): the master's tree, or this worker's own with the reason."""
    gen, idx = getattr(loop, "identity", (0, 0))
    try:
        return _from_master(loop), f"answered by worker {gen}.{idx}, pid {os.getpid()}"
    except Exception as exc:                     # noqa: BLE001 - said on the page
        if not isinstance(exc, LookupError):
            log.debug("status page: asking the master failed", exc_info=True)
        return own_tree(loop), (f"the master's view is not available ({exc}); this is "
                                f"worker {gen}.{idx} alone")


def status_app(environ, start_response):
    """The embedded page as a WSGI app (served by the wsgi interface, so
    it gets the same strict parsing and keep-alive as any app)."""
    path = environ.get("PATH_INFO", "")
    if path not in ("/", "", "/-/status", "/-/status.json"):
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: the status page is at /\n"]
    if environ["REQUEST_METHOD"] not in ("GET", "HEAD"):
        start_response("405 Method Not Allowed", [("Content-Type", "text/plain"),
                                                  ("Allow", "GET, HEAD")])
        return [b"GET or HEAD only\n"]
    tree, note = gather(environ["sockherd.loop"])
    if path.endswith(".json"):
        body = status_page.document(tree, note=note)
        ctype = "application/json"
    else:
        body = status_page.page(status_page.render(tree, note=note),
                                json_url=environ.get("SCRIPT_NAME", "") + "/-/status.json")
        ctype = "text/html; charset=utf-8"
    start_response("200 OK", [("Content-Type", ctype), ("Cache-Control", "no-store")])
    return [body]
