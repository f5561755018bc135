"""watch: where the event stream is; `sockherd ctl watch` subscribes there
and prints one line per event (spawned, ready, draining, exited, reload...)."""
from sockherd.master.commands import Command
from sockherd.master.events import KINDS


def run(sup, args, reply) -> None:
    reply.ok({"events": sup.control.events_at, "kinds": sorted(KINDS)})


def render(r: dict) -> str:
    return f"events at {r['events']}"


COMMAND = Command("watch", "the event stream, one line per event (--json for scripts)", run,
                  render, timeout=5.0)
