"""show activity [worker]: per loop thread, fdcore's counters (HAProxy's
`show activity`): loops, poll_io, poll_drop_fd, poll_skip_fd, fd_takeover,
accepted, accept_empty, wake_nowork..."""
import msgspec

from sockherd.master.commands import Command, find_worker, table


class Args(msgspec.Struct, forbid_unknown_fields=True):
    worker: str = ""              # GEN.INDEX or pid; empty: every worker


def run(sup, args: Args, reply) -> None:
    if args.worker:
        try:
            slots = [find_worker(sup, args.worker)]
        except ValueError as exc:
            reply.fail(str(exc))
            return
    else:
        slots = [s for s in sup._live() if s.proc is not None]
    names = {s.proc.pid: f"{s.generation}.{s.index}" for s in slots}

    def done(answers: dict) -> None:
        rows = []
        for pid, got in answers.items():
            if got is None:
                rows.append({"worker": names[pid], "pid": pid, "answered": False})
                continue
            for th in got["threads"]:
                rows.append({"worker": names[pid], "pid": pid, "answered": True, **th})
        reply.ok({"threads": rows})

    sup.asker.ask(slots, "activity", done)


COLUMNS = ["worker", "pid", "tid", "tgid", "loops", "poll_io", "poll_drop_fd", "poll_skip_fd",
           "fd_takeover", "accepted", "accept_empty", "wake_nowork"]


def render(r: dict) -> str:
    return table(r["threads"], COLUMNS)


COMMAND = Command("show activity", "per thread: loops, polled events, dropped and skipped fds, "
                  "takeovers, accepts, empty accepts, idle wake-ups", run, render, Args,
                  timeout=5.0)
