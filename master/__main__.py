import sys

# the entry point an upgrade execs: on probation until the loop starts, a
# failure goes back to the previous image (comeback.py); this module and that
# one import nothing else of sockherd before the guard is up
from sockherd.master import comeback


def _main() -> int:
    from sockherd.master.cli import main
    return main()


sys.exit(comeback.guarded(_main))
