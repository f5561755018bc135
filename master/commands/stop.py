"""stop [--fast]: a graceful stop (every worker drains, as TERM), or a fast
one (as INT). The reply comes first."""
import msgspec

from sockherd.master.commands import Command


class Args(msgspec.Struct, forbid_unknown_fields=True):
    fast: bool = False


def run(sup, args: Args, reply) -> None:
    if sup.stopping and not args.fast:
        reply.ok({"stopping": True, "fast": False, "already": True})
        return
    reply.ok({"stopping": True, "fast": args.fast})
    if args.fast:
        sup._fast_stop()
    else:
        sup._graceful_stop()


def render(r: dict) -> str:
    return "stopping" + (" (fast)" if r["fast"] else ": every worker drains") + \
        (" (already)" if r.get("already") else "")


COMMAND = Command("stop", "stop the master: every worker drains (--fast: killed)", run, render,
                  Args, timeout=5.0)
