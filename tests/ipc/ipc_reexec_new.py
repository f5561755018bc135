"""The "new master image" of test_ipc_reexec.py: takes the state, reports which fds are
open, greets every worker over its socketpair and serves one connection per listener.
argv: the decoy fd numbers the old image had open (they must be gone)."""

import json
import os
import select
import socket
import sys
import time

from sockherd.ipc import reexec


def open_fds() -> list[int]:
    listed = [int(name) for name in os.listdir("/proc/self/fd")]
    alive = []
    for fd in listed:   # the directory fd listdir used is closed by now: drop it
        try:
            os.fstat(fd)
        except OSError:
            continue
        alive.append(fd)
    return sorted(alive)


def main() -> int:
    fds_at_start = open_fds()
    carrier = os.environ[reexec.ENV_VAR]
    memfd = int(carrier.split(":")[1]) if carrier.startswith("memfd:") else None
    state = reexec.take()
    report = {
        "open": fds_at_start,
        "memfd": memfd,
        "memfd_closed": memfd is None or memfd not in open_fds(),
        "decoys": [int(arg) for arg in sys.argv[1:]],
        "named": state.fds,
        "env_left": reexec.ENV_VAR in os.environ,
        "inheritable": [os.get_inheritable(fd) for fd in state.fds],
        "listeners": [[item.listener.name, item.listener.family, item.listener.address]
                      for item in state.listeners],
        "workers": [[w.pid, w.generation, w.index] for w in state.workers],
        "master_pid_kept": state.master_pid == os.getpid(),
    }
    print(json.dumps(report), flush=True)
    for worker in state.workers:
        os.write(worker.fd, f"hello {worker.generation}.{worker.index}\n".encode())
    pending = {item.fd: item.listener.name for item in state.listeners}
    deadline = time.monotonic() + 30
    while pending and time.monotonic() < deadline:
        for fd in select.select(list(pending), [], [], 0.1)[0]:
            name = pending.pop(fd)
            sock = socket.socket(fileno=fd)
            conn, _ = sock.accept()
            with conn:
                conn.sendall(name.encode() + b"\n")
    return 1 if pending else 0


if __name__ == "__main__":
    sys.exit(main())
