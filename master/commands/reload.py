"""reload: a new generation with the settings read again, like SIGHUP, but
synchronous: the reply comes once every new worker is READY (and the old
generation drains), or with the reason the reload was refused."""
from sockherd.master.commands import Command


def run(sup, args, reply) -> None:
    def on_event(event: dict) -> None:
        if event["event"] in ("reload_ok", "reload_failed") and event["generation"] == gen:
            sup.events.unsubscribe(on_event)
            if event["event"] == "reload_ok":
                reply.ok({"generation": gen, "seconds": event["seconds"]})
            else:
                reply.fail(f"reload refused (generation {gen}): {event['reason']}; generation "
                           f"{sup.generation} keeps serving")

    gen = sup.generation + 1
    sup.events.subscribe(on_event)
    why = sup._reload()
    if why:
        sup.events.unsubscribe(on_event)
        reply.fail(why if "keeps serving" in why else
                   f"{why}; generation {sup.generation} keeps serving")


def render(r: dict) -> str:
    return f"reload: generation {r['generation']} serving (ready in {r['seconds']:.2f}s)"


COMMAND = Command("reload", "start a new generation with the settings read again; answers when "
                  "it serves or was refused", run, render, timeout=300.0)
