"""sockherd.worker: worker bootstrap, thread groups, per-thread event loop,
connection API and app adapters."""

# How `python -m sockherd.worker` finds its master (set by master/spawn.py):
# the number of its end of the socketpair, and the master's pid (checked
# against getppid() after PR_SET_PDEATHSIG). Declared here, by the side
# that reads them, so the worker imports nothing from the master.
ENV_FD = "SOCKHERD_WORKER_FD"
ENV_MASTER = "SOCKHERD_MASTER_PID"
ENV_BOARD = "SOCKHERD_BOARD_FD"        # the balance board's memfd (worker/board.py)
ENV_NOFILE = "SOCKHERD_WORKER_NOFILE"  # the soft fd limit the master started with
# A worker's exit status when its drain hit the deadline (hard_stop_after)
# with connections still open, cut: the master logs "hit the drain deadline"
# instead of "drained" (sysexits' EX_TEMPFAIL).
EXIT_DRAIN_DEADLINE = 75
