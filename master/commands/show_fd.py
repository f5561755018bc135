"""show fd <worker> [fd]: a worker's fd table (fdcore's fdtab entries)."""
from typing import Annotated

import msgspec

from sockherd.master.commands import Command, find_worker, table


class Args(msgspec.Struct, forbid_unknown_fields=True):
    worker: str                   # GEN.INDEX or pid
    fd: Annotated[int, msgspec.Meta(ge=-1, le=1 << 24)] = -1


def run(sup, args: Args, reply) -> None:
    try:
        slot = find_worker(sup, args.worker)
    except ValueError as exc:
        reply.fail(str(exc))
        return
    pid = slot.proc.pid

    def done(answers: dict) -> None:
        got = answers.get(pid)
        if got is None:
            reply.fail(f"worker {args.worker} (pid {pid}) did not answer in time")
        elif got.get("error"):
            reply.fail(got["error"])
        else:
            reply.ok({"worker": args.worker, "pid": pid, "fds": got["fds"]})

    sup.asker.ask([slot], "fd", done, fd=args.fd)


def render(r: dict) -> str:
    rows = [{**f, "masks": f"run={f['running_mask']:x} thr={f['thread_mask']:x} "
             f"upd={f['update_mask']:x} poll={f['polled_recv']:x}/{f['polled_send']:x}"}
            for f in r["fds"]]
    return table(rows, ["fd", "tgid", "refcount", "state", "generation", "owner_kind", "owner",
                        "masks", "nb_takeover", "ctl_errno"])


COMMAND = Command("show fd", "a worker's fd table: tgid, refcount, masks, polled masks, state, "
                  "generation, owner kind", run, render, Args, timeout=5.0)
