"""reload: a new generation with the settings read again, like SIGHUP, but
synchronous: the reply comes once the reload is over: the new generation
serves and, with reload_probation, passed its probation (the old one
drains then), or with the reason it was refused or rolled back. Waiting
through probation is the point: "generation N serving" at the commit was
the answer a reload to an app that crashed a second later got (issue 19
§7). One reload at a time: a request during one is refused with why (a
HUP is queued instead: a signal has nobody to answer)."""
from sockherd.master.commands import Command


def run(sup, args, reply) -> None:
    def on_event(event: dict) -> None:
        if event["event"] in ("reload_ok", "reload_failed") and event["generation"] == gen:
            sup.events.unsubscribe(on_event)
            if event["event"] == "reload_ok":
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
    return f"reload: generation {r['generation']} serving (ready in {r['seconds']:.2f}s{passed})"


COMMAND = Command("reload", "start a new generation with the settings read again; answers "
                  "when it serves (after reload_probation) or was refused or rolled back", run,
                  render, timeout=300.0)
