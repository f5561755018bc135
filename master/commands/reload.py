"""reload [--probation]: a new generation with the settings read again,
like SIGHUP, but synchronous. The reply comes at the commit: every new
worker READY, only the new code answers from then on (with
reload_probation, the previous generation stands by, ready to take over
again if a new worker fails; issue 36 §3: `ctl reload` and `systemctl
reload` blocked for the whole probation). With --probation it comes once
the reload is over: the probation passed (the old generation drains
then), or with the reason it was rolled back ("generation N serving" at
the commit was the answer a reload to an app that crashed a second later
got: issue 19 §7, the way to wait for it). A refused reload is answered
with why either way. One reload at a time: a request during one is
refused with why (a HUP is queued instead: a signal has nobody to
answer)."""
import msgspec

from sockherd.master.commands import Command


class Args(msgspec.Struct, forbid_unknown_fields=True):
    probation: bool = False


def run(sup, args: Args, reply) -> None:
    def on_event(event: dict) -> None:
        if event.get("generation") != gen:
            return
        kind = event["event"]
        if kind == "reload_probation" and not args.probation:
            sup.events.unsubscribe(on_event)
            reply.ok({"generation": gen, "seconds": event["seconds"], "probation": 0.0,
                      "on_probation": event["probation"]})
        elif kind in ("reload_ok", "reload_failed"):
            sup.events.unsubscribe(on_event)
            if kind == "reload_ok":
                reply.ok({"generation": gen, "seconds": event["seconds"],
                          "probation": event.get("probation", 0.0)})
            else:
                back = bool(event.get("rolled_back"))
                reply.fail(f"reload {'failed' if back else 'refused'} (generation {gen}): "
                           f"{event['reason']}; {sup.gens.after_refusal(back)}")

    gen = sup.gens.next_number()
    sup.events.subscribe(on_event)
    why = sup._reload()
    if why:
        sup.events.unsubscribe(on_event)
        reply.fail(why if "keeps serving" in why else
                   f"{why}; generation {sup.generation} keeps serving")


def render(r: dict) -> str:
    passed = f"; passed {r['probation']:g}s of probation" if r.get("probation") else ""
    on = (f"; on probation for {r['on_probation']:g}s, the previous generation standing by "
          f"(`ctl status` says how it ends)" if r.get("on_probation") else "")
    return f"reload: generation {r['generation']} serving (ready in {r['seconds']:.2f}s" \
           f"{passed}{on})"


COMMAND = Command("reload", "start a new generation with the settings read again; answers "
                  "when it serves (--probation: once reload_probation passed) or was refused "
                  "or rolled back", run, render, Args, timeout=300.0)
