"""drain <worker|generation>: a serving worker is replaced (a new one starts
and, once READY, the old one drains: capacity never drops); an older
generation still draining is told again (it finishes what it has)."""
import msgspec

from sockherd.master.commands import Command, find_worker
from sockherd.master.lifecycle import Event, State


class Args(msgspec.Struct, forbid_unknown_fields=True):
    target: str                   # GEN.INDEX, a pid, or a generation number


def run(sup, args: Args, reply) -> None:
    if sup.stopping:
        reply.fail("the master is stopping: every worker drains already")
        return
    # ASCII digits only ("²" is a digit to str.isdigit, not to int), and few
    if args.target.isascii() and args.target.isdigit() and len(args.target) < 8:
        gen = int(args.target)
        if gen == sup.generation:
            reply.fail(f"generation {gen} is the one serving: `reload` replaces it")
            return
        slots = [s for s in sup._live() if s.proc is not None and s.generation == gen]
        if not slots:
            # not a generation with live workers: maybe a pid
            try:
                slots = [find_worker(sup, args.target)]
            except ValueError:
                reply.fail(f"no live worker of generation {gen}")
                return
        else:
            for slot in slots:
                sup._feed(slot, Event.DRAIN)
            reply.ok({"draining": [f"{s.generation}.{s.index}" for s in slots]})
            return
    else:
        try:
            slots = [find_worker(sup, args.target)]
        except ValueError as exc:
            reply.fail(str(exc))
            return
    slot = slots[0]
    name = f"{slot.generation}.{slot.index}"
    if slot in sup.slots and slot.life.state is State.READY:
        if slot.replaced_by is not None:
            reply.fail(f"worker {name} is being replaced already")
            return
        if sup.pending:
            reply.fail("a reload is under way: it replaces every worker")
            return
        if not sup._replace(slot, "drain asked (control)"):
            reply.fail(f"worker {name} cannot be replaced now (see the master's log)")
            return
        reply.ok({"replacing": name, "pid": slot.proc.pid})
        return
    sup._feed(slot, Event.DRAIN)
    reply.ok({"draining": [name]})


def render(r: dict) -> str:
    if "replacing" in r:
        return f"worker {r['replacing']} (pid {r['pid']}): its replacement is starting; it " \
               f"drains once that one is ready"
    return "draining: " + ", ".join(r["draining"])


COMMAND = Command("drain", "drain a worker (GEN.INDEX or pid: replaced first) or an old "
                  "generation", run, render, Args, timeout=5.0)
