"""Upgrade (SIGUSR2): the master re-executes itself in place.

The pid stays (workers keep their parent, systemd its MAINPID). Across the
exec go the listeners, every live worker's socketpair and the balance
board, named by the re-exec state (ipc.reexec: those fds alone are made
inheritable, right before the exec), and the master's own counters
(reloads, restarts: COUNTERS_VAR). The new image adopts the workers
(supervising and, in time, draining them) and proceeds as a reload: a new
generation of its own, the adopted one drained once that is READY.

The signals the master handles are blocked across the exec (the mask
survives execve): one arriving in between waits for the new image's
handlers instead of taking its default action, which for HUP or USR2 is
to end the process. If the exec fails, the fds go back to close-on-exec,
the signals are unblocked and this master carries on, saying why.

Before the exec, the new image is checked as far as it can be without the
listeners (preflight): its interpreter imports the whole master (every
module of sockherd.master and sockherd.ipc) and validates the current
settings (this master's command line, its environment and its settings
file, as the exec will see them), and decodes the re-exec state. If it
still fails after the exec, before the reload that follows the adoption has
settled, it re-executes this image (recorded in the environment across the
exec) with the listeners and the workers: master/comeback.py says how, and
what it covers.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys

from sockherd.ipc import reexec
from sockherd.master import comeback
from sockherd.master.listeners import Listener
from sockherd.master.addresses import AddressError, parse

log = logging.getLogger("sockherd.master")


def state_of(sup) -> reexec.ReexecState:
    """The re-exec state of a supervisor (its listeners, its live workers)."""
    from sockherd.master.lifecycle import State

    workers = []
    for slot in sup._live():
        if slot.proc is None:
            continue
        workers.append(reexec.InheritedWorker(
            pid=slot.proc.pid, generation=slot.generation, index=slot.index,
            fd=slot.proc.channel.fileno(), board=slot.board,
            draining=slot.life.state is not State.READY or slot not in sup.slots))
    return reexec.ReexecState(
        version=reexec.STATE_VERSION, master_pid=os.getpid(), generation=sup.generation,
        listeners=[reexec.InheritedListener(fd=lst.sock.fileno(), listener=lst.descriptor,
                                            activated=lst in sup.activated)
                   for lst in sup.listeners],
        workers=workers, board_fd=sup.board.fd,
        metrics_fd=next((x.exec_fd() for x in sup.extras if hasattr(x, "exec_fd")
                         and x.exec_fd() >= 0), -1))


def run(sup, handled, before_exec=None) -> str:
    """USR2: re-exec in place; returns only if the exec failed or was
    refused (and why), and then this master carries on. before_exec() runs
    right before the exec (the control channel's reply)."""
    from sockherd.master.generations import upgrade_refusal
    from sockherd.master.lifecycle import State

    starting = [s for s in sup._live() if s.proc is not None and s.life.state is State.STARTING]
    why = upgrade_refusal(sup.pending, sup.ever_ready, len(starting), len(sup.slots))
    if why:
        log.warning("upgrade refused: %s", why)
        return f"upgrade refused: {why}"
    # from here to the exec, a signal waits for the new image (a TERM read
    # while the settings are read again would be lost at the exec)
    signal.pthread_sigmask(signal.SIG_BLOCK, handled)
    try:
        try:
            settings = sup.reload_settings() if sup.reload_settings else sup.settings
        except Exception as exc:                    # noqa: BLE001 - said, never fatal
            log.error("upgrade refused: bad setting: %s", exc)
            return f"upgrade refused: bad setting: {exc}"
        python = settings.python or sys.executable
        why = preflight(python, state_of(sup))
        if not why:
            sup.events.emit("upgrading", python=python)
            if before_exec is not None:
                before_exec()
            if sup.control is not None:
                sup.control.before_exec()
            carried = [x for x in sup.extras if hasattr(x, "exec_fd")]   # the metrics
            for x in carried:
                x.before_exec()
            why = execute(sup, python, handled)
            sup.upgrades_failed += 1                 # `ctl upgrade` waits on it (status)
            sup.last_upgrade_failure = why
            if sup.control is not None:
                sup.control.exec_failed()
            for x in carried:
                x.exec_failed()
        log.error("upgrade failed: %s; this master carries on", why)
        sup.events.emit("upgrade_failed", reason=why)
        return f"upgrade failed: {why}"
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, handled)


COUNTERS_VAR = "SOCKHERD_UPGRADE_COUNTERS"


def counters_of(sup) -> dict:
    """The counts the master keeps itself, for the new image: counters never
    go down while the pid lives (Prometheus reads a drop as a restart of the
    process; `ctl upgrade` compares reloads_failed before and after). The
    workers' own figures need nothing: they live in the workers, adopted."""
    return {"reloads_ok": sup.reloads_ok, "reloads_failed": sup.reloads_failed,
            "last_reload_failure": sup.last_reload_failure,
            "upgrades_failed": sup.upgrades_failed,
            "restarts": sup.restarts.snapshot() if sup.restarts is not None else {}}


def carried_counters(environ=None) -> dict:
    """The previous image's counters_of() (an upgrade), else {}; taken out
    of the environment (no worker inherits them). Beside the re-exec state,
    not in it: an image without them reads that state all the same."""
    text = (os.environ if environ is None else environ).pop(COUNTERS_VAR, "")
    try:
        counters = json.loads(text) if text else {}
    except ValueError as exc:
        log.warning("upgrade: the previous image's counters are unreadable (%s): from 0", exc)
        return {}
    return counters if isinstance(counters, dict) else {}


def preflight(python: str, state: reexec.ReexecState) -> str:
    """Why `python` cannot run the new image ("" if it can): an exec that
    works into an interpreter without sockherd would end the master, and one
    into a sockherd that refuses our re-exec state (another state version)
    would start it afresh; one whose modules do not all import, or which
    refuses the current settings, would fail after the exec (issue 19 §8).
    The state goes to it on stdin (its fds are not passed: only whether it
    decodes is asked)."""
    import subprocess

    try:
        # this master's arguments: the settings are validated by the new code
        subprocess.run([python, "-m", "sockherd.master.upgrade", *sys.argv[1:]], check=True,
                       timeout=30,
                       input=reexec.encode(state).encode(), stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)
    except FileNotFoundError:
        return f"cannot exec {python}: No such file or directory"
    except PermissionError:
        return f"cannot exec {python}: Permission denied"
    except subprocess.CalledProcessError as exc:
        last = (exc.stderr or b"").decode(errors="replace").strip().splitlines()
        last = last[-1] if last else str(exc)
        if exc.returncode == _REFUSES_STATE:
            return f"{python} refuses this master's re-exec state: {last}"
        if exc.returncode == _REFUSES_SETTINGS:
            return f"{python} refuses the current settings: {last}"
        return f"{python} cannot import sockherd: {last}"
    except (subprocess.TimeoutExpired, OSError) as exc:
        return f"{python}: {exc}"
    return ""


_REFUSES_STATE = 3          # preflight's exit status: sockherd is there, the state is not its
_REFUSES_SETTINGS = 4       # ... and the current settings are not valid for it


def _check_state_on_stdin(argv: list[str]) -> int:
    """python -m sockherd.master.upgrade [ARGS]: the preflight's other half,
    run by the new image's interpreter. Does every module of the master
    import (the exec imports some of them only later, after the listeners
    are taken)? Do the settings of ARGS (the running master's command line;
    none from an older master) validate? Does the state on stdin decode?"""
    import importlib
    import pkgutil

    from sockherd.ipc.errors import ReexecStateError

    import sockherd.ipc
    import sockherd.master

    for pkg in (sockherd.master, sockherd.ipc):
        for mod in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if mod.name.rsplit(".", 1)[-1] == "__main__":
                continue                             # running it would start a master
            try:
                importlib.import_module(mod.name)
            except Exception as exc:                 # noqa: BLE001 - said: the check fails
                print(f"{mod.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
                return 1
    if argv:
        why = _settings_refusal(argv)
        if why:
            print(why, file=sys.stderr)
            return _REFUSES_SETTINGS
    try:
        reexec.decode(sys.stdin.read())
    except ReexecStateError as exc:
        print(exc, file=sys.stderr)
        return _REFUSES_STATE
    return 0


def _settings_refusal(argv: list[str]) -> str:
    """Why the new code refuses the settings of this command line ("" if it
    takes them): read as the exec's `run` will read them."""
    from sockherd.master import cli
    from sockherd.master import settings as S

    try:
        ns = cli.build_parser().parse_args(argv)
    except SystemExit:                               # argparse said why on stderr
        return f"its command line refuses {' '.join(argv)}"
    if getattr(ns, "command", None) != "run":
        return ""
    try:
        cli.resolve(ns)                              # SOCKHERD_CMD_ARGS too, as `run` reads it
    except S.SettingsError as exc:
        return str(exc)
    return ""


def salvaged() -> list[Listener]:
    """After a refused re-exec state: the listening sockets the previous
    image left us, each named by the address the kernel bound (a `bind` of
    the settings then keeps it: no re-bind, which the old workers' copies of
    it would make fail, and no queued connection lost). Every inheritable fd
    from 3 up is the previous image's (Python opens its own close-on-exec);
    those that are no listening socket are closed: a worker's socketpair
    (that worker drains at the EOF: worker/bootstrap), the balance board."""
    import socket

    from sockherd.ipc.listeners import describe, format_address

    out = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd < 3 or not os.get_inheritable(fd):
                continue
        except OSError:
            continue                                   # listdir's own fd, gone now
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            os.close(fd)                               # no socket: the board's memfd
            continue
        try:
            listening = sock.type == socket.SOCK_STREAM and sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            if not listening:
                sock.close()
                continue
            sock.set_inheritable(False)
            sock.setblocking(False)
            where = format_address(sock.family, sock.getsockname())
            text = f"unix:{where}" if sock.family == socket.AF_UNIX else where
            try:
                address = parse(text)
            except AddressError:
                address = parse(f"fd://{fd}")          # an abstract unix socket
            out.append(owning_file(Listener(address, sock, describe(sock, str(address)))))
        except OSError:
            sock.close()
    return out


def execute(sup, python: str, handled) -> str:
    """Re-executes the master; returns only if that failed, with why."""
    state = state_of(sup)
    argv = [python, "-m", "sockherd.master", *sys.argv[1:]]
    plan = reexec.prepare_exec(state)
    plan.env[COUNTERS_VAR] = json.dumps(counters_of(sup))
    plan.env[comeback.PREVIOUS_VAR] = comeback.record()     # the way back (comeback.py)
    signal.pthread_sigmask(signal.SIG_BLOCK, handled)     # (the caller blocked them already)
    log.info("upgrade: re-executing %s with %d listener(s) and %d worker(s)", python,
             len(state.listeners), len(state.workers))
    for handler in logging.getLogger().handlers:
        handler.flush()
    try:
        os.execve(python, argv, plan.env)
    except OSError as exc:
        reexec.abort_exec(plan)
        return f"cannot exec {python}: {exc.strerror}"
    return "exec returned"                              # not reached


def on_probation(state: reexec.ReexecState) -> None:
    """The new image took the re-exec state: a failure before the
    supervisor adopts the workers hands back that same state."""
    def handed_back() -> dict:
        return {reexec.ENV_VAR: reexec.prepare_exec(state, environ={}).env[reexec.ENV_VAR]}

    comeback.provide(handed_back)


def proceed(sup) -> None:
    """After the adoption: the upgrade proceeds as a reload; or, for an
    image started again by the way back of a failed upgrade, it serves on
    with the workers it adopted (its own generation) and says the upgrade
    failed, with why."""
    back = comeback.came_back()
    if back is None:
        comeback.provide(lambda: _handed_back(sup))
        sup._reload()
        return
    why = f"the new image failed after the exec: {back.get('why', '?')}"
    sup.upgrades_failed += 1                 # `ctl upgrade` waits on it (status)
    sup.last_upgrade_failure = why
    sup.events.emit("upgrade_failed", reason=why)
    log.error("upgrade: came back: adopted %d listener(s) and %d worker(s); the upgrade "
              "failed: %s; this image serves on", len(sup.listeners), len(sup._live()), why)


def _handed_back(sup) -> dict:
    """The way back once the supervisor holds the workers: its state (also
    the workers it started since, drained by the previous image), its
    counters, and its servers quiet (the reply owed to a control client, a
    metrics probe in flight), as before an upgrade's exec."""
    for x in ([sup.control] if sup.control is not None else []) + \
            [x for x in sup.extras if hasattr(x, "exec_fd")]:
        try:
            x.before_exec()
        except Exception:                        # noqa: BLE001 - the way back goes on
            log.exception("upgrade: %s before the way back", type(x).__name__)
    plan = reexec.prepare_exec(state_of(sup), environ={})
    return {reexec.ENV_VAR: plan.env[reexec.ENV_VAR], COUNTERS_VAR: json.dumps(counters_of(sup))}


def inherited_listeners(state: reexec.ReexecState) -> tuple[list[Listener], list[Listener]]:
    """(every listener of the state, the systemd-activated ones among them),
    each with the address it was configured as (its descriptor's name), so
    that the reload that follows keeps it when the settings still name it."""
    import socket

    out, activated = [], []
    for item in state.listeners:
        sock = socket.socket(fileno=item.fd)
        sock.setblocking(False)
        try:
            address = parse(item.listener.name)
        except AddressError:
            address = parse(f"fd://{item.fd}")
        lst = owning_file(Listener(address, sock, item.listener))
        out.append(lst)
        if item.activated:
            activated.append(lst)
    return out, activated


def fetched_listeners(path: str) -> tuple[list[Listener], int]:
    """A takeover's listeners, fetched from the instance serving the
    hand-off socket at path (ipc.handoff), each with the address it was
    configured as; and that instance's pid. Raises HandoffError. A unix
    listener's file is not ours yet: owning_file() once we serve (one that
    fails to start must leave it to the instance that serves on)."""
    from sockherd.ipc.handoff import fetch_listeners_from

    pairs, pid = fetch_listeners_from(path)
    out = []
    for desc, sock in pairs:
        sock.setblocking(False)
        try:
            address = parse(desc.name)
        except AddressError:
            address = parse(f"fd://{sock.fileno()}")
        out.append(Listener(address, sock, desc))
    return out, pid


def owning_file(lst: Listener) -> Listener:
    """A unix listener carried over (upgrade, salvage; a takeover once it
    serves) owns its socket file as the one that bound it did: removed at
    close if it is still the file seen now (review: a dead socket file was
    left behind)."""
    import stat

    if lst.address.kind == "unix":
        try:
            st = os.lstat(lst.address.path)
        except OSError:
            return lst
        if stat.S_ISSOCK(st.st_mode):
            lst.created_path, lst.inode = lst.address.path, st.st_ino
    return lst


if __name__ == "__main__":
    sys.exit(_check_state_on_stdin(sys.argv[1:]))
