"""The way back: an upgrade's new image that fails during its start-up
re-executes the previous image, so the pid and the service survive.

An upgrade (master/upgrade.py) checks the new image before the exec (it
imports the whole master and validates the settings), but some failures
only show after it: a module of the new image that breaks once it runs, a
setting refused by code the check does not reach, an exception anywhere
between the exec and the loop. Until the loop runs, the new image is the
only process holding the listeners and the workers' socketpairs, and when
it exits PDEATHSIG takes every worker with it (issue 19, finding 8: 226
requests ok, 555 refused in 8 s).

What goes across the upgrade's exec, beside the re-exec state: the record
of the previous image (PREVIOUS_VAR: its interpreter, its argv, its
working directory and its whole environment, so its PYTHONPATH and the
like come back with it). The new image takes the record out of its
environment first thing (no worker sees it), in `guarded()`, which wraps
the whole entry point (`python -m sockherd.master`, which is what an
upgrade execs). From there until the reload that follows the adoption has
settled (its generation serves, or it was refused and the adopted one serves
on: `serving()`, from the loop), the new image is on probation: any failure
in it re-executes the previous image, in place, with the fds it holds
(os._exit is wrapped meanwhile, so a call of it goes back too):

- before the new image took the re-exec state: the state as it came (its
  fds are still inheritable, untouched);
- once it took the state: that state again (its fds made inheritable);
- once the supervisor adopted the workers: the supervisor's own state
  (upgrade.state_of: also any worker it started meanwhile, to be drained).

The previous image comes back with ROLLBACK_VAR set: it adopts the
listeners and workers without starting a generation of its own (they are
its own generation, serving), and reports the upgrade failed with why (log,
the `upgrade_failed` event, `ctl status` / `ctl upgrade`, and the metrics'
sockherd_upgrades_failed_total).

What is covered: every Python exception (SystemExit and KeyboardInterrupt
too) raised from the entry point on, in any module imported after this
one (an ImportError of a later module, a SettingsError, a bug), in the
start-up and in the loop until the reload settled, and a non-zero exit
status returned before that; the sites that would close the listeners on
their way out (the supervisor's run(), the cli's failure to attach its
servers) go back first; os._exit called through the os module. What is
not: a death the process cannot see (SIGKILL, SIGSEGV, an abort or _exit()
in C code, os._exit bound before the guard: the pid ends, and
with it, by PDEATHSIG, the workers; nothing in the process can outlive
that); an interpreter that cannot start or import this module
(sockherd.master's own __init__ and this file, which imports the standard
library only); an exception the loop contains itself (it logs it and
carries on: no failure of the image); and anything after the reload
settled (the new image has served then; a reload that fails is refused
like any other, the adopted workers serving on).

No bouncing: the image the way back starts carries no previous image of its
own, and a bounce count (MAX_BOUNCES) is checked as well, so if it fails too
it ends like any failed start ("nothing left to go back to").
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys

PREVIOUS_VAR = "SOCKHERD_PREVIOUS_IMAGE"
ROLLBACK_VAR = "SOCKHERD_UPGRADE_ROLLBACK"
# the re-exec state's and the counters' variables (ipc.reexec, master.upgrade):
# named here again so that this module imports nothing of sockherd
STATE_VAR = "SOCKHERD_REEXEC_STATE"
COUNTERS_VAR = "SOCKHERD_UPGRADE_COUNTERS"
MAX_BOUNCES = 1                 # one way back per upgrade, never a second
RECORD_LIMIT = 64 * 1024        # one environment string: below MAX_ARG_STRLEN (128 KiB)

# the signals the master handles (supervisor.HANDLED): blocked across an
# exec, so that one arriving in between waits for the next image's handlers
HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGCHLD, signal.SIGTTIN,
           signal.SIGTTOU, signal.SIGHUP, signal.SIGUSR2, signal.SIGUSR1)

log = logging.getLogger("sockherd.master")

_probation: dict | None = None   # this image's start-up after an upgrade (arm())
_came_back: dict | None = None   # ROLLBACK_VAR of this image: why it was started again
_provider = None                 # () -> the state's variables, its fds made inheritable


def record() -> str:
    """This image, for the next one to come back to (PREVIOUS_VAR's value):
    what the exec of an upgrade would do to start it again. The whole
    environment if it fits in one environment string, else the variables
    that choose the interpreter and its import path."""
    env = {k: v for k, v in os.environ.items()
           if k not in (PREVIOUS_VAR, ROLLBACK_VAR, STATE_VAR, COUNTERS_VAR)}
    me = {"executable": sys.executable, "argv": sys.argv[1:], "cwd": os.getcwd(), "env": env}
    text = json.dumps(me)
    if len(text) > RECORD_LIMIT:
        me["env"] = {k: v for k, v in env.items()
                     if k.startswith(("PYTHON", "LD_", "SOCKHERD_"))
                     or k in ("PATH", "HOME", "VIRTUAL_ENV", "LANG", "TZ")}
        text = json.dumps(me)
    return text


def arm(environ=None) -> None:
    """At the entry point: takes this image's upgrade variables out of the
    environment (no worker sees them) and, after an upgrade's exec, keeps
    what the way back needs: the previous image, the state and counters as
    they came."""
    global _probation, _came_back, _provider
    env = os.environ if environ is None else environ
    previous = env.pop(PREVIOUS_VAR, None)
    rollback = env.pop(ROLLBACK_VAR, None)
    _provider = None
    _came_back = _decoded(rollback, ROLLBACK_VAR)
    if STATE_VAR not in env:
        _probation = None                   # a fresh start: nothing to go back to
        os._exit = _real_exit
        return
    _probation = {"previous": _decoded(previous, PREVIOUS_VAR), "rollback": _came_back,
                  "state": env[STATE_VAR], "counters": env.get(COUNTERS_VAR),
                  "pid": os.getpid()}
    os._exit = _exit_on_probation


_real_exit = os._exit


def _exit_on_probation(status: int) -> None:
    """os._exit while on probation: the way back first (only in this
    process: a child forked by a library and ending with os._exit must not
    start a master)."""
    if _probation is not None and os.getpid() == _probation["pid"]:
        fall_back(f"os._exit({status})")
    _real_exit(status)


def _decoded(text: str | None, var: str) -> dict | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        log.warning("upgrade: %s is unreadable (%s): ignored", var, exc)
        return None
    return value if isinstance(value, dict) else None


def came_back() -> dict | None:
    """{"why": ..., "bounces": n} if this image was started again by the way
    back of a failed upgrade, else None."""
    return _came_back


def provide(fn) -> None:
    """fn() -> {variable: value}: the re-exec state as it stands now (its
    fds made inheritable) and the counters, for the way back."""
    global _provider
    _provider = fn


def serving() -> None:
    """The upgrade's reload settled in the loop: its start-up is over, no
    way back after it."""
    global _probation, _provider
    _probation = _provider = None
    os._exit = _real_exit


def way_back(probation: dict | None) -> tuple[dict | None, str]:
    """(the previous image to re-execute, "") or (None, why not)."""
    if probation is None:
        return None, "no upgrade under way"
    rollback = probation.get("rollback") or {}
    if int(rollback.get("bounces", 0) or 0) >= MAX_BOUNCES:
        return None, "the previous image failed too after coming back"
    previous = probation.get("previous")
    if not previous or not previous.get("executable"):
        return None, "no previous image was recorded"
    return previous, ""


def why_of(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        code = exc.code
        return f"exited with status {code}" if isinstance(code, int) or code is None \
            else f"exited: {code}"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return f"{type(exc).__name__}: {exc}"


def fall_back(why: str, exc: BaseException | None = None) -> None:
    """During an upgrade's start-up: re-executes the previous image with the
    fds this one holds; returns only if there is no way back (not on
    probation, nothing recorded, a second bounce) or the exec failed, having
    said so. Call it before anything closes a listener."""
    global _probation
    probation, _probation = _probation, None          # once
    if probation is None:
        return
    previous, why_not = way_back(probation)
    if previous is None:
        log.error("upgrade: the new image failed during its start-up (%s) and %s: nothing "
                  "left to go back to", why, why_not, exc_info=_shown(exc))
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    try:
        carried = {STATE_VAR: probation["state"], COUNTERS_VAR: probation["counters"]}
        if _provider is not None:
            carried.update(_provider())
    except Exception:                               # noqa: BLE001 - said, then we end
        log.exception("upgrade: the new image failed during its start-up (%s); its state "
                      "cannot be handed back", why)
        return
    env = dict(previous.get("env") or {})
    env.update({k: v for k, v in carried.items() if v is not None})
    rollback = probation.get("rollback") or {}
    env[ROLLBACK_VAR] = json.dumps({"why": why,
                                    "bounces": int(rollback.get("bounces", 0) or 0) + 1})
    python = previous["executable"]
    argv = [python, "-m", "sockherd.master", *previous.get("argv", [])]
    log.error("upgrade failed after the exec: %s: re-executing the previous image %s",
              why, python, exc_info=_shown(exc))
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    try:
        os.chdir(previous.get("cwd") or "/")
    except OSError:
        pass                                       # its paths are absolute, or it says so
    try:
        os.execve(python, argv, env)
    except OSError as err:
        log.error("upgrade: cannot re-execute the previous image %s: %s", python, err.strerror)


def _shown(exc: BaseException | None):
    """The traceback of a failure worth one (a bug, an import error), not
    of a plain exit."""
    if exc is None or isinstance(exc, (SystemExit, KeyboardInterrupt)):
        return None
    return exc


def guarded(main) -> int:
    """The entry point of `python -m sockherd.master`: main() on probation
    after an upgrade's exec (see the module's docstring)."""
    arm()
    try:
        status = main()
    except BaseException as exc:                    # noqa: BLE001 - any failure goes back
        fall_back(why_of(exc), exc)
        raise
    if status:
        fall_back(f"exited with status {status}")
    return status
