"""Re-exec state: what a new master image needs to carry on after `sockherd upgrade`.

The old master execs the new one in place (same pid, so workers keep their parent and
systemd its MAINPID). Across exec() survive exactly the fds without FD_CLOEXEC; Python
opens every fd close-on-exec, so the rule is: mark inheritable exactly the fds the state
names, right before exec, and nothing else. The state itself travels in one environment
variable as JSON (text, because the environment is text; msgspec decodes it strictly).

The new image calls take(): the variable is removed (our workers must never see it), every
named fd is made close-on-exec again and checked to still be what the state says. A state
that does not check out is refused whole: its fds are closed and the master starts fresh,
which is safer than serving on a socket it cannot vouch for.
"""

import os
import socket

import msgspec

from .errors import ListenerMismatch, ReexecStateError
from .fds import borrowed_socket, close_all
from .listeners import ListenerDescriptor, check

ENV_VAR = "SOCKHERD_REEXEC_STATE"
STATE_VERSION = 1


class InheritedListener(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    fd: int
    listener: ListenerDescriptor


class InheritedWorker(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A live worker: `fd` is the master's end of its socketpair."""

    pid: int
    generation: int
    index: int
    fd: int


class ReexecState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    version: int
    master_pid: int
    generation: int
    listeners: list[InheritedListener] = []
    workers: list[InheritedWorker] = []

    @property
    def fds(self) -> list[int]:
        return [item.fd for item in self.listeners] + [item.fd for item in self.workers]


def encode(state: ReexecState) -> str:
    return msgspec.json.encode(state).decode()


def decode(text: str) -> ReexecState:
    """Strict decode: unknown fields, wrong types, duplicate or reserved fds are refused."""
    try:
        state = msgspec.json.decode(text, type=ReexecState)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ReexecStateError(f"{ENV_VAR}: {exc}") from None
    if state.version != STATE_VERSION:
        raise ReexecStateError(f"{ENV_VAR}: state version {state.version}, "
                               f"expected {STATE_VERSION}")
    fds = state.fds
    if any(fd < 3 for fd in fds):
        raise ReexecStateError(f"{ENV_VAR}: fd numbers below 3 are stdio: {sorted(fds)}")
    if len(set(fds)) != len(fds):
        raise ReexecStateError(f"{ENV_VAR}: an fd is named twice: {sorted(fds)}")
    return state


def prepare_exec(state: ReexecState, environ=None) -> dict[str, str]:
    """Mark the state's fds inheritable and return the environment for execve(). If the
    exec fails, call abort_exec() so the old master goes on with its fds private again."""
    env = dict(os.environ if environ is None else environ)
    env[ENV_VAR] = encode(state)
    for fd in state.fds:
        os.set_inheritable(fd, True)
    return env


def abort_exec(state: ReexecState) -> None:
    for fd in state.fds:
        try:
            os.set_inheritable(fd, False)
        except OSError:
            pass


def take(environ=None) -> ReexecState | None:
    """The state left by the previous image, or None on a fresh start. Removes the
    variable, makes every named fd close-on-exec, checks them all."""
    env = os.environ if environ is None else environ
    text = env.pop(ENV_VAR, None)
    if text is None:
        return None
    state = decode(text)
    try:
        for fd in state.fds:
            try:
                os.set_inheritable(fd, False)
            except OSError as exc:
                raise ReexecStateError(f"{ENV_VAR}: fd {fd} is not open ({exc.strerror})") from None
        for item in state.listeners:
            try:
                check(item.fd, item.listener)
            except ListenerMismatch as exc:
                raise ReexecStateError(f"{ENV_VAR}: {exc}") from None
        for worker in state.workers:
            _check_worker_fd(worker)
    except BaseException:
        close_all(state.fds)
        raise
    return state


def _check_worker_fd(worker: InheritedWorker) -> None:
    where = f"{ENV_VAR}: worker {worker.generation}.{worker.index} (pid {worker.pid}) fd {worker.fd}"
    try:
        with borrowed_socket(worker.fd) as sock:
            if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
                raise ReexecStateError(f"{where} is not a unix stream socket")
            try:
                sock.getpeername()
            except OSError:
                raise ReexecStateError(f"{where} is not connected") from None
    except OSError as exc:
        raise ReexecStateError(f"{where} is not a socket ({exc.strerror})") from None
