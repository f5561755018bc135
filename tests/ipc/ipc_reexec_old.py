"""The "old master image" of test_ipc_reexec.py: holds listeners, worker socketpair ends
(received from the test through pass_fds) and two decoys, then execs the new image with the
re-exec state, exactly as an upgrade does. argv: inline|memfd, worker fds..."""

import os
import socket
import sys
import uuid
from pathlib import Path

from sockherd.ipc import reexec
from sockherd.ipc.listeners import describe

HERE = Path(__file__).resolve().parent


def main() -> None:
    carrier, worker_fds = sys.argv[1], [int(arg) for arg in sys.argv[2:]]
    for fd in worker_fds:
        os.set_inheritable(fd, False)            # as a master holds them: private
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(f"\0sockherd-reexec-{uuid.uuid4().hex}")
    unix.listen(8)
    decoy_socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    decoy_file = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    state = reexec.ReexecState(
        version=reexec.STATE_VERSION, master_pid=os.getpid(), generation=5,
        listeners=[reexec.InheritedListener(tcp.fileno(), describe(tcp, "web", {"backlog": 8})),
                   reexec.InheritedListener(unix.fileno(), describe(unix, "admin"))],
        workers=[reexec.InheritedWorker(pid=1000 + i, generation=5, index=i, fd=fd)
                 for i, fd in enumerate(worker_fds)])
    plan = reexec.prepare_exec(state, inline_limit=0 if carrier == "memfd" else reexec.INLINE_LIMIT)
    new_image = HERE / "ipc_reexec_new.py"
    os.execve(sys.executable, [sys.executable, str(new_image),
                               str(decoy_socket.fileno()), str(decoy_file)], plan.env)


if __name__ == "__main__":
    main()
