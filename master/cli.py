"""Command line entry point: `sockherd` and `python -m sockherd.master`.

`sockherd check` validates the settings and imports the app without serving,
like `nginx -t` / `haproxy -c`, and says which interface the app is served
with: exit 0 when all is fine, 2 for a bad setting, 1 for an app that does
not import or does not fit the interface asked for. `sockherd run` serves (stream
apps for now: WSGI comes with the HTTP issue); `ctl` lands with the control
issue. Signals are documented here because operators
look for them in `--help` first.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback

from sockherd.master import __version__
from sockherd.master import settings as S

SIGNALS_HELP = """\
signals (to the master):
  HUP        reload: start a new generation, drain the old one once it is ready
  USR2       upgrade: re-exec the master keeping listeners, then reload
  TERM       graceful stop: drain every worker, then exit
  INT, QUIT  fast stop
  TTIN/TTOU  one worker more / less
"""

EXIT_APP = 1        # the app does not import
EXIT_SETTINGS = 2   # a setting does not decode or validate (argparse uses 2 too)


class _Parser(argparse.ArgumentParser):
    """A usage error in one line: what is wrong and where the flags are
    (argparse's usage of `sockherd run` is some 50 lines, which buried it)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (`{self.prog} --help` lists the flags)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="sockherd",
        description="Run Python network services as one master and N multi-threaded workers.",
        epilog=SIGNALS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"sockherd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    check = sub.add_parser("check", help="validate the settings and import the app, then exit",
                           description="Validate the settings and import the app without "
                                       "serving, and say which interface serves it. Exit 0 if "
                                       "all is fine, 2 for a bad setting, 1 for an app that "
                                       "does not import or does not fit --interface.")
    run = sub.add_parser("run", help="serve: the master, its listeners and its workers",
                         description="Bind the listeners, start the workers and supervise them "
                                     "until TERM (graceful) or INT/QUIT (fast). Exit 2 for a bad "
                                     "setting (before anything binds), 1 if the listeners cannot "
                                     "be bound or no worker becomes ready.",
                         epilog=SIGNALS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    for p in (check, run):
        p.add_argument("-c", "--config", metavar="FILE",
                       help=f"settings file: TOML, or Python (FILE.py: its module globals, as "
                            f"gunicorn reads gunicorn.conf.py, hooks included) (env "
                            f"{S.ENV_PREFIX}CONFIG)")
        S.add_arguments(p)
    check.add_argument("--print-config", action="store_true",
                       help="print every effective setting and where it came from (default, "
                            "file, env, cli), then exit")
    run.add_argument("--takeover", metavar="PATH",
                     help="take the listeners of the instance serving the hand-off socket PATH "
                          "(its handoff_socket setting), start the workers, and once they are "
                          "ready tell that instance to drain and exit")
    ctl = sub.add_parser("ctl", help="ask a running master (status, show, reload, ...)",
                         description="Send one command to a running master over its control "
                                     "endpoint and print the answer. `sockherd ctl help` lists "
                                     "the commands. Exit 0 on success, 1 on an error reply, 3 "
                                     "when no master answered in time.")
    ctl.add_argument("--json", action="store_true", help="print the exact JSON reply")
    ctl.add_argument("--timeout", type=float, default=None, metavar="S",
                     help="how long to wait for the answer (default: the command's own)")
    ctl.add_argument("-c", "--config", metavar="FILE",
                     help="read runtime_dir and control from this settings file")
    ctl.add_argument("--runtime-dir", metavar="DIR", help="the master's runtime_dir")
    ctl.add_argument("-b", "--bind", action="append", metavar="ADDRESS",
                     help="the master listening on ADDRESS (repeatable), of those running "
                          "on this host (`sockherd ctl list` shows them)")
    ctl.add_argument("--pid", metavar="PID|PIDFILE",
                     help="the master of this pid, or of the pid its pidfile (`-p`) holds, "
                          "of those running on this host")
    ctl.add_argument("--endpoint", metavar="ENDPOINT",
                     help="the control endpoint (ipc:// or tcp://); default: the settings'")
    ctl.add_argument("--curve-server-key", metavar="FILE",
                     help="tcp://: the server's public certificate")
    ctl.add_argument("--curve-client-cert", metavar="FILE",
                     help="tcp://: this client's secret certificate")
    ctl.add_argument("words", nargs=argparse.REMAINDER, metavar="COMMAND ...")
    parser.commands = {"check": check, "run": run, "ctl": ctl}
    return parser


CMD_ARGS = S.ENV_PREFIX + "CMD_ARGS"


def cmd_args(command: str, env=None) -> dict:
    """SOCKHERD_CMD_ARGS (gunicorn's GUNICORN_CMD_ARGS): flags of `command`
    in one variable, read as its command line is; between the SOCKHERD_*
    variables and the real command line. Raises SettingsError."""
    import shlex

    text = (os.environ if env is None else env).get(CMD_ARGS, "")
    if not text.strip():
        return {}
    from sockherd.master import cli_compat

    sub = build_parser().commands[command]
    try:
        words = cli_compat.rewrite([command, *shlex.split(text)])[0][1:]
        got, extra = sub.parse_known_args(words, argparse.Namespace())
    except (ValueError, SystemExit) as exc:
        raise S.SettingsError(f"environment: {CMD_ARGS} = {text!r}: cannot be read as "
                              f"`sockherd {command}` flags ({exc})") from None
    if extra:
        raise S.SettingsError(f"environment: {CMD_ARGS} = {text!r}: unknown flag(s) "
                              f"{' '.join(extra)}")
    return vars(got)


def resolve(ns: argparse.Namespace) -> S.Traced:
    """The settings of `run` or `check`'s command line, its file and the
    environment (SOCKHERD_CMD_ARGS included). Raises SettingsError."""
    extra = cmd_args(ns.command)
    config = ns.config or extra.pop("config", None)
    return S.traced(vars(ns), config=config, cmd_args=extra)


def set_raw_env(settings) -> None:
    """raw_env's KEY=VALUE pairs into this process's environment, which the
    workers inherit (master/spawn.py)."""
    for pair in settings.raw_env:
        key, _, value = pair.partition("=")
        os.environ[key] = value


def _settings(ns: argparse.Namespace, traced: bool = False):
    """The effective settings (Traced if traced), or None after saying what
    is wrong. The warnings (gunicorn settings that do nothing here) go to stderr."""
    try:
        got = resolve(ns)
    except S.SettingsError as exc:
        print(f"sockherd: bad setting: {exc}", file=sys.stderr)
        return None
    for warning in got.warnings:
        print(f"sockherd: warning: {warning}", file=sys.stderr)
    return got if traced else got.settings


def print_config(got: S.Traced) -> None:
    """Every setting as a TOML line, with where its value came from."""
    import json

    width = max(len(s.key) for s in S.SETTINGS)
    for s in S.SETTINGS:
        value = getattr(got.settings, s.key)
        print(f"{s.key:<{width}} = {json.dumps(value)}  # {got.sources[s.key]}")


def cmd_check(ns: argparse.Namespace) -> int:
    from sockherd.worker.app import AppImportError, import_app
    from sockherd.worker.interface import InterfaceError, choose

    got = _settings(ns, traced=True)
    if got is None:
        return EXIT_SETTINGS
    if ns.print_config:
        print_config(got)
        return 0
    settings = got.settings
    if settings.app:
        try:
            app = import_app(settings.app, chdir=settings.chdir, pythonpath=settings.pythonpath,
                             factory=settings.factory)
            # the worker's own choice (bootstrap.py), with the same words
            chosen = choose(app, settings.interface, f"app {settings.app!r}")
        except (AppImportError, InterfaceError) as exc:
            if exc.__cause__ is not None:
                traceback.print_exception(exc.__cause__, file=sys.stderr)
            print(f"sockherd: {exc}", file=sys.stderr)
            return EXIT_APP
        app = f"app {settings.app} imports"
        interface = f"interface: {chosen}"
    else:
        app = "no app: the embedded status page"
        interface = "interface: wsgi (the embedded status page)"
    workers = settings.workers or os.cpu_count() or 1
    print(f"sockherd check: settings valid; {app}; {workers} workers x {settings.threads} "
          f"threads in {settings.thread_groups} groups; bind {', '.join(settings.bind)}")
    print(f"sockherd check: {interface}")
    return 0


def cmd_run(ns: argparse.Namespace) -> int:
    import logging

    import msgspec

    from sockherd.ipc.errors import ActivationError
    from sockherd.master.listeners import BindError, activated, bind_all
    from sockherd.master.supervisor import Supervisor

    traced = _settings(ns, traced=True)
    if traced is None:
        return EXIT_SETTINGS
    settings = traced.settings
    set_raw_env(settings)                 # before the hooks and the workers import anything
    if settings.umask:
        os.umask(int(settings.umask.removeprefix("0o"), 8))    # the workers inherit it
    from sockherd.master import logs
    from sockherd.worker.logfiles import LogFileError
    try:
        logs.setup(settings)                  # error_logfile, log_format, log_config
    except (LogFileError, OSError) as exc:
        print(f"sockherd: {exc}", file=sys.stderr)
        return EXIT_SETTINGS
    log = logging.getLogger("sockherd.master")
    from sockherd.master.fdbudget import BUDGET, raise_soft_limit
    raise_soft_limit()                    # and a reserve kept (master/fdbudget.py)
    BUDGET.hold_spare()
    from sockherd.ipc import reexec
    from sockherd.ipc.errors import ReexecStateError
    from sockherd.master import upgrade

    salvaged = []
    try:
        state = reexec.take()             # set by the previous image of an upgrade
    except ReexecStateError as exc:
        # its workers drain (their socketpairs are closed); its listening
        # sockets are kept for the settings that still name them
        salvaged = upgrade.salvaged()
        log.error("upgrade: the previous image's state is refused (%s): starting fresh on "
                  "the %d listening socket(s) it left", exc, len(salvaged))
        state = None
    if state is not None:
        upgrade.on_probation(state)       # a failure from here goes back with it (comeback.py)
    from sockherd.worker import hooks as hooks_mod
    server = hooks_mod.Server(pid=os.getpid(), cfg=settings)
    try:
        hooks = hooks_mod.load(settings.hooks, chdir=settings.chdir,
                               pythonpath=settings.pythonpath)
        if state is None:                 # a fresh start; an upgrade's image started before
            hooks.run("on_starting", server)
    except Exception as exc:              # noqa: BLE001 - the operator's code: its traceback
        traceback.print_exception(exc.__cause__ or exc, file=sys.stderr)
        what = str(exc) if isinstance(exc, hooks_mod.HooksError) else \
            f"hook on_starting ({hooks.source}) failed: {exc!r}"
        log.error("%s: not starting", what)
        for lst in salvaged:
            lst.close()
        return 1
    try:
        if state is None:
            inherited = activated()
        else:
            # the sockets stay what they were; the reload that follows the
            # adoption binds what the settings add and closes what they drop
            listeners, inherited = upgrade.inherited_listeners(state)
    except ActivationError as exc:
        log.error("socket activation: %s", exc)
        return 1

    said = set()
    said_warnings = set(traced.warnings)

    def own(settings):
        """The settings with `bind` less what systemd's sockets serve: the
        built-in default when any socket is activated, and every entry that
        names an activated socket (systemd:NAME, fd://N, or its address:
        master/listeners.py claim_activated). A systemd:NAME matching none
        stays, for bind() to refuse: exit 1 at start, a refused reload."""
        from sockherd.master.addresses import scheme
        from sockherd.master.listeners import claim_activated

        if inherited and settings.bind == next(s.default for s in S.SETTINGS if s.key == "bind"):
            # systemd owns the addresses: the built-in default is not bound too
            return msgspec.structs.replace(settings, bind=[])
        rest = []
        for text in settings.bind:
            # a tls:// entry is never claimed: its TLS would be lost with the
            # entry (master/tls_binds.py refuses tls://systemd:NAME)
            lst = claim_activated(text, inherited) if inherited and not scheme(text)[0] \
                else None
            if lst is None:
                rest.append(text)
                if text.startswith("systemd:"):
                    names = ", ".join(repr(x.descriptor.name) for x in inherited)
                    log.error("bind %s: systemd passed %s", text,
                              f"the socket(s) {names} only" if names
                              else "no socket (LISTEN_FDS is not set for this process)")
            elif text not in said:
                said.add(text)
                log.info("bind %s: served by the socket systemd passed as %r (%s), not bound "
                         "again", text, lst.descriptor.name, lst.descriptor.address)
        if len(rest) == len(settings.bind):
            return settings
        return msgspec.structs.replace(settings, bind=rest)

    def reload():
        """The settings again for a reload (HUP): the same command line, the
        file and the environment read anew. Raises SettingsError. A warning
        said at the start or at an earlier reload is not said again."""
        got = resolve(ns)
        for warning in got.warnings:
            if warning not in said_warnings:
                said_warnings.add(warning)
                log.warning("%s", warning)
        set_raw_env(got.settings)
        return own(got.settings)

    settings = own(settings)
    took_from = 0
    if state is None and (ns.takeover or salvaged):
        from sockherd.ipc.errors import HandoffError
        from sockherd.master.reload import Refused, reconcile

        what = "takeover" if ns.takeover else "upgrade"
        fetched = salvaged
        if ns.takeover:
            for lst in salvaged:
                lst.close()
            try:
                fetched, took_from = upgrade.fetched_listeners(ns.takeover)
            except HandoffError as exc:
                log.error("takeover: %s", exc)
                return 1
        try:
            listeners, _ = reconcile(fetched, inherited, settings)
        except Refused as exc:
            for lst in fetched + inherited:
                lst.close()
            log.error("%s: %s", what, exc)
            return 1
        for lst in fetched:
            if lst not in listeners:
                log.info("%s: closing %s: not in the settings", what, lst.descriptor.address)
                lst.close()
        if ns.takeover:
            log.info("takeover: %d listener(s) from pid %d (%s)", len(fetched), took_from,
                     ns.takeover)
    elif state is None:
        from sockherd.master.control import check_free
        try:
            # another master's endpoint: refused (named after systemd's sockets
            # when the settings bind nothing of their own)
            check_free(settings, [lst.descriptor.address for lst in inherited])
            listeners = inherited + bind_all(settings)
        except (BindError, OSError, ValueError) as exc:
            for lst in inherited:
                lst.close()
            log.error("%s", exc)
            return 1
    from sockherd.master.listeners import set_keepalive
    set_keepalive(listeners, settings.tcp_keepalive)   # every TCP one, however it came
    for lst in listeners:
        via = " (from systemd)" if lst in inherited else " (kept across the upgrade)" if state \
            else ""
        log.info("listening on %s%s", lst.descriptor.address, via)
    import prctl
    prctl.set_proctitle(f"sockherd: master [{settings.proc_name or settings.app or 'embedded'}]")
    def serving():
        """A takeover: every worker READY, the instance we took from drains;
        the unix socket files are ours to remove from now on."""
        import signal

        for lst in listeners:
            upgrade.owning_file(lst)
        try:
            os.kill(took_from, signal.SIGTERM)
            log.info("takeover: serving; told pid %d to drain and exit", took_from)
        except ProcessLookupError:
            log.info("takeover: serving; pid %d is gone already", took_from)

    if settings.pidfile:
        from sockherd.master import pidfile
        try:
            pidfile.write(settings.pidfile, replacing=took_from)
        except OSError as exc:
            log.error("pidfile %s: cannot write it: %s", settings.pidfile,
                      exc.strerror or exc)
            for lst in listeners:
                lst.close()
            return 1
    try:
        return _supervise(settings, listeners, reload, inherited, state,
                          serving if took_from > 0 else None, hooks, server)
    finally:
        hooks.call("on_exit", server)
        if settings.pidfile:
            pidfile.remove(settings.pidfile)


def _supervise(settings, listeners, reload, inherited, state, on_serving, hooks, server) -> int:
    import logging

    import msgspec

    from sockherd.master.supervisor import Supervisor

    from sockherd.master import tls

    log = logging.getLogger("sockherd.master")
    try:
        config = tls.with_files(msgspec.structs.asdict(settings))   # read once for generation 1
    except tls.TlsError as exc:          # changed since the settings' check read it
        log.error("%s", exc)
        return EXIT_SETTINGS
    sup = Supervisor(settings, listeners, config, reload=reload,
                     activated=inherited, adopted=state, on_serving=on_serving)
    sup.hooks, sup.server = hooks, server      # master/hooks: when_ready, on_reload, child_exit
    from sockherd.master import control, control_guard, devreload, metrics, notify
    try:
        control.attach(sup)                  # sockherd ctl (ZeroMQ): master/control.py
        control_guard.attach(sup)            # ... kept off EMFILE: master/control_guard.py
        metrics.attach(sup)                  # --metrics: master/metrics.py
        devreload.attach(sup)                # --reload: master/devreload.py
    except (OSError, ValueError) as exc:
        log.error("%s", exc)
        from sockherd.master import comeback
        comeback.fall_back(str(exc))         # an upgrade's new image: back, listeners open
        for extra in sup.extras:
            extra.close()
        for lst in listeners:
            lst.close()
        return 1
    notify.attach(sup)                       # systemd Type=notify: master/notify.py
    return sup.run()


def main(argv: list[str] | None = None) -> int:
    from sockherd.master import cli_compat

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("run", "check"):
        try:
            argv, warnings = cli_compat.rewrite(argv)     # gunicorn's and uvicorn's flags
        except cli_compat.FlagError as exc:
            print(f"sockherd {argv[0]}: {exc}", file=sys.stderr)
            return EXIT_SETTINGS
        for warning in warnings:
            print(f"sockherd: warning: {warning}", file=sys.stderr)
    ns, extra = parser.parse_known_args(argv)
    if extra:
        # one line, not the usage's 50: what is unknown and where the flags are
        parser.commands.get(ns.command, parser).error(
            f"unrecognized arguments: {' '.join(extra)}")
    if ns.command == "check":
        return cmd_check(ns)
    if ns.command == "run":
        return cmd_run(ns)
    if ns.command == "ctl":
        from sockherd.master.ctl import main as ctl_main
        return ctl_main(ns)
    parser.print_help()
    return 0
