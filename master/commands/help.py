"""help: the commands and what they do."""
from sockherd.master.commands import Command


def run(sup, args, reply) -> None:
    from sockherd.master.commands import COMMANDS

    reply.ok({name: cmd.help for name, cmd in sorted(COMMANDS.items())})


def render(r: dict) -> str:
    width = max(len(n) for n in r)
    return "\n".join(f"{name.ljust(width)}  {text}" for name, text in r.items())


COMMAND = Command("help", "the commands", run, render, timeout=5.0)
