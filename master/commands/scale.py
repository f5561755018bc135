"""scale N: that many workers in the serving generation (TTIN/TTOU as many
times as it takes); new ones start now, extra ones drain."""
import time
from typing import Annotated

import msgspec

from sockherd.master import probation
from sockherd.master.commands import Command
from sockherd.worker.board import SLOTS


class Args(msgspec.Struct, forbid_unknown_fields=True):
    workers: Annotated[int, msgspec.Meta(ge=1, le=SLOTS)]


def run(sup, args: Args, reply) -> None:
    if sup.pending:
        reply.fail("a reload is under way: scale once it is done (or change `workers` and "
                   "reload)")
        return
    if sup.stopping:
        reply.fail("the master is stopping")
        return
    # TTIN/TTOU are ignored meanwhile: "scale: 2 -> 2 workers" was the
    # answer, ok (review of issue 19)
    why = probation.refusal(sup.gens.probation, time.monotonic())
    if why:
        reply.fail(f"{why}: scale once it is over")
        return
    before = len(sup._active())
    # each step must change the count (TTIN refuses past SLOTS slots while
    # retired ones still drain): never a loop that cannot end (review)
    while (now := len(sup._active())) < args.workers:
        sup._scale_up()
        if len(sup._active()) == now:
            break
    while (now := len(sup._active())) > args.workers:
        sup._scale_down()
        if len(sup._active()) == now:
            break
    reply.ok({"before": before, "workers": len(sup._active())})


def render(r: dict) -> str:
    return f"scale: {r['before']} -> {r['workers']} workers"


COMMAND = Command("scale", "that many workers: new ones start, extra ones drain", run, render,
                  Args, timeout=5.0)
