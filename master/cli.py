"""Command line entry point: `sockherd` and `python -m sockherd.master`.

`sockherd check` validates the settings and imports the app without serving,
like `nginx -t` / `haproxy -c`: exit 0 when both are fine, 2 for a bad
setting, 1 for an app that does not import. `sockherd run` serves (stream
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sockherd",
        description="Run Python network services as one master and N multi-threaded workers.",
        epilog=SIGNALS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"sockherd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    check = sub.add_parser("check", help="validate the settings and import the app, then exit",
                           description="Validate the settings and import the app without "
                                       "serving. Exit 0 if both are fine, 2 for a bad setting, "
                                       "1 for an app that does not import.")
    run = sub.add_parser("run", help="serve: the master, its listeners and its workers",
                         description="Bind the listeners, start the workers and supervise them "
                                     "until TERM (graceful) or INT/QUIT (fast). Exit 2 for a bad "
                                     "setting (before anything binds), 1 if the listeners cannot "
                                     "be bound or no worker becomes ready.",
                         epilog=SIGNALS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    for p in (check, run):
        p.add_argument("-c", "--config", metavar="FILE",
                       help=f"TOML settings file (env {S.ENV_PREFIX}CONFIG)")
        S.add_arguments(p)
    run.add_argument("--takeover", metavar="PATH",
                     help="take the listeners of the instance serving the hand-off socket PATH "
                          "(its handoff_socket setting), start the workers, and once they are "
                          "ready tell that instance to drain and exit")
    return parser


def _settings(ns: argparse.Namespace):
    """The effective settings, or None after saying what is wrong."""
    try:
        return S.resolve(vars(ns), config=ns.config)
    except S.SettingsError as exc:
        print(f"sockherd: bad setting: {exc}", file=sys.stderr)
        return None


def cmd_check(ns: argparse.Namespace) -> int:
    from sockherd.worker.app import AppImportError, import_app

    settings = _settings(ns)
    if settings is None:
        return EXIT_SETTINGS
    if settings.app:
        try:
            import_app(settings.app, chdir=settings.chdir, pythonpath=settings.pythonpath)
        except AppImportError as exc:
            if exc.__cause__ is not None:
                traceback.print_exception(exc.__cause__, file=sys.stderr)
            print(f"sockherd: {exc}", file=sys.stderr)
            return EXIT_APP
        app = f"app {settings.app} imports ({settings.interface} interface)"
    else:
        app = "no app: the embedded status page"
    workers = settings.workers or os.cpu_count() or 1
    print(f"sockherd check: settings valid; {app}; {workers} workers x {settings.threads} "
          f"threads in {settings.thread_groups} groups; bind {', '.join(settings.bind)}")
    return 0


def cmd_run(ns: argparse.Namespace) -> int:
    import logging

    import msgspec

    from sockherd.ipc.errors import ActivationError
    from sockherd.master.listeners import BindError, activated, bind_all
    from sockherd.master.supervisor import Supervisor

    settings = _settings(ns)
    if settings is None:
        return EXIT_SETTINGS
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s [master %(process)d] %(levelname)s %(message)s")
    log = logging.getLogger("sockherd.master")
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

    def own(settings):
        if inherited and settings.bind == next(s.default for s in S.SETTINGS if s.key == "bind"):
            # systemd owns the addresses: the built-in default is not bound too
            return msgspec.structs.replace(settings, bind=[])
        return settings

    def reload():
        """The settings again for a reload (HUP): the same command line, the
        file and the environment read anew. Raises SettingsError."""
        return own(S.resolve(vars(ns), config=ns.config))

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
        try:
            listeners = inherited + bind_all(settings)
        except (BindError, OSError) as exc:
            for lst in inherited:
                lst.close()
            log.error("%s", exc)
            return 1
    for lst in listeners:
        via = " (from systemd)" if lst in inherited else " (kept across the upgrade)" if state \
            else ""
        log.info("listening on %s%s", lst.descriptor.address, via)
    import prctl
    prctl.set_proctitle(f"sockherd: master [{settings.app or 'embedded'}]")
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

    return Supervisor(settings, listeners, msgspec.structs.asdict(settings), reload=reload,
                      activated=inherited, adopted=state,
                      on_serving=serving if took_from > 0 else None).run()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command == "check":
        return cmd_check(ns)
    if ns.command == "run":
        return cmd_run(ns)
    parser.print_help()
    return 0
