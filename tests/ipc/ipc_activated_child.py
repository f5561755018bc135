"""Launched by systemd-socket-activate in test_ipc_systemd.py: parse the activation
environment, report what we got over the connection that triggered our launch, then serve
one connection on every other listener (answering its name) to prove the sockets work."""

import json
import os
import select
import sys
import time

from sockherd.ipc import systemd

VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


def main() -> int:
    before = {name: os.environ.get(name) for name in VARIABLES}
    activated = systemd.listen_fds()
    after = {name: os.environ.get(name) for name in VARIABLES}
    adopted = systemd.adopt(activated)
    report = {
        "pid": os.getpid(),
        "before": before,
        "after": after,
        "fds": [item.fd for item in activated],
        "names": [item.name for item in activated],
        "inheritable": [sock.get_inheritable() for _, sock in adopted],
        "addresses": [desc.address for desc, _ in adopted],
        "mark": os.environ.get("SOCKHERD_TEST_MARK"),
    }
    deadline = time.monotonic() + 30
    pending = {sock.fileno(): (desc, sock) for desc, sock in adopted}
    first = True
    while pending and time.monotonic() < deadline:
        ready, _, _ = select.select(list(pending), [], [], 0.1)
        for fd in ready:
            desc, sock = pending.pop(fd)
            conn, _ = sock.accept()
            with conn:
                if first:
                    conn.sendall(json.dumps(report).encode() + b"\n")
                    first = False
                else:
                    conn.sendall(desc.name.encode() + b"\n")
    return 1 if pending else 0


if __name__ == "__main__":
    sys.exit(main())
