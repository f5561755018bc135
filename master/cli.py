"""Command line entry point: `sockherd` and `python -m sockherd.master`.

Only the argument surface exists so far; `run` and `ctl` land with the launch
and control issues. Signals are documented here because operators look for
them in `--help` first.
"""
from __future__ import annotations

import argparse

from sockherd.master import __version__

SIGNALS_HELP = """\
signals (to the master):
  HUP        reload: start a new generation, drain the old one once it is ready
  USR2       upgrade: re-exec the master keeping listeners, then reload
  TERM       graceful stop: drain every worker, then exit
  INT, QUIT  fast stop
  TTIN/TTOU  one worker more / less
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sockherd",
        description="Run Python network services as one master and N multi-threaded workers.",
        epilog=SIGNALS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"sockherd {__version__}")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    parser.parse_args(argv)
    parser.print_help()
    return 0
