"""Re-exec state: what a new master image needs to carry on after `sockherd upgrade`.

The old master execs the new one in place (same pid, so workers keep their parent and
systemd its MAINPID). Across exec() survive exactly the fds without FD_CLOEXEC; Python
opens every fd close-on-exec, so the rule is: mark inheritable exactly the fds the state
names, right before exec, and nothing else. The state itself travels in one environment
variable as JSON (text, because the environment is text; msgspec decodes it strictly).
Linux refuses any single environment string longer than MAX_ARG_STRLEN (32 pages, 128 KiB)
with E2BIG at execve(), which would abort the upgrade; so a large state (thousands of
workers) goes into an inherited memfd instead and the variable only says "memfd:<fd>".

The new image calls take(): the variable is removed (our workers must never see it), every
named fd is checked to still be what the state says and made close-on-exec again. A state
that does not decode or check out is refused whole, and take() then touches none of its fds:
they stay as they came, inheritable, for the master to salvage (master/upgrade.salvaged: the
listening sockets are kept by their address, everything else is closed). Closing them here
took the service down: the old workers still hold copies of the listeners, so binding the
addresses afresh fails, and the connections queued on them would be reset.
"""

import os
import re
import socket
from typing import NamedTuple

import msgspec

from .errors import ListenerMismatch, ReexecStateError
from .fds import borrowed_socket
from .listeners import ListenerDescriptor, check
from .wording import validation_words

ENV_VAR = "SOCKHERD_REEXEC_STATE"
STATE_VERSION = 1
INLINE_LIMIT = 64 * 1024       # half of MAX_ARG_STRLEN: the rest of the env has room
_MEMFD = "memfd:"


class InheritedListener(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    fd: int
    listener: ListenerDescriptor
    activated: bool = False        # systemd's (kept whatever the settings bind)


class InheritedWorker(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A live worker: `fd` is the master's end of its socketpair."""

    pid: int
    generation: int
    index: int
    fd: int
    board: int = -1                # its row on the balance board
    draining: bool = False         # told to drain already


class ReexecState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    version: int
    master_pid: int
    generation: int
    listeners: list[InheritedListener] = []
    workers: list[InheritedWorker] = []
    board_fd: int = -1             # the balance board's memfd, shared with the workers
    # the metrics listener (/-/ready): kept, so a balancer's health check is
    # never refused across the exec (multi-host proof: it was re-bound)
    metrics_fd: int = -1

    @property
    def fds(self) -> list[int]:
        return ([item.fd for item in self.listeners] + [item.fd for item in self.workers]
                + ([self.board_fd] if self.board_fd >= 0 else [])
                + ([self.metrics_fd] if self.metrics_fd >= 0 else []))


def encode(state: ReexecState) -> str:
    return msgspec.json.encode(state).decode()


def decode(text: str) -> ReexecState:
    """Strict decode: unknown fields, wrong types, duplicate or reserved fds are refused."""
    try:
        state = msgspec.json.decode(text, type=ReexecState)
    except msgspec.ValidationError as exc:
        raise ReexecStateError(f"{ENV_VAR}: {validation_words(str(exc))}") from None
    except msgspec.DecodeError as exc:
        raise ReexecStateError(f"{ENV_VAR}: {exc}") from None
    except UnicodeEncodeError as exc:
        # os.environ keeps bytes that are not UTF-8 as lone surrogates (surrogateescape),
        # which msgspec cannot encode back to read them.
        bad = exc.object[exc.start:exc.end].encode("utf-8", "surrogateescape")
        raise ReexecStateError(f"{ENV_VAR}: not UTF-8 text (byte {bad.hex(' ')} at "
                               f"offset {exc.start})") from None
    if state.version != STATE_VERSION:
        raise ReexecStateError(f"{ENV_VAR}: state version {state.version}, "
                               f"expected {STATE_VERSION}")
    fds = state.fds
    if any(fd < 3 for fd in fds):
        raise ReexecStateError(f"{ENV_VAR}: fd numbers below 3 are stdio: {sorted(fds)}")
    if len(set(fds)) != len(fds):
        raise ReexecStateError(f"{ENV_VAR}: an fd is named twice: {sorted(fds)}")
    return state


class ExecPlan(NamedTuple):
    """What prepare_exec() did: the environment to exec with, and the fds it made
    inheritable (the state's, plus the memfd carrying the state if it is large)."""

    env: dict[str, str]
    inherited: list[int]
    memfd: int | None


def prepare_exec(state: ReexecState, environ=None, inline_limit: int = INLINE_LIMIT) -> ExecPlan:
    """Mark the state's fds inheritable and build the environment for execve(). If the
    exec fails, call abort_exec(plan) so the old master goes on with its fds private."""
    env = dict(os.environ if environ is None else environ)
    text = encode(state)
    memfd = None
    if len(text) > inline_limit:
        memfd = os.memfd_create("sockherd-reexec-state", os.MFD_CLOEXEC)
        data = text.encode()
        written = 0
        while written < len(data):
            written += os.write(memfd, data[written:])
        text = f"{_MEMFD}{memfd}"
    env[ENV_VAR] = text
    inherited = state.fds + ([memfd] if memfd is not None else [])
    for fd in inherited:
        os.set_inheritable(fd, True)
    return ExecPlan(env, inherited, memfd)


def abort_exec(plan: ExecPlan) -> None:
    for fd in plan.inherited:
        try:
            os.set_inheritable(fd, False)
        except OSError:
            pass
    if plan.memfd is not None:
        os.close(plan.memfd)


_FD_NUMBER = re.compile(r"[0-9]{1,10}")


def _read_memfd(text: str) -> str:
    number = text[len(_MEMFD):]
    # ASCII digits only, and few: str.isdigit() takes "²", which int() refuses, and int()
    # refuses 4300 digits or more.
    if not _FD_NUMBER.fullmatch(number) or int(number) < 3:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise ReexecStateError(f"{ENV_VAR}: bad memfd reference {shown!r}")
    fd = int(number)
    try:
        chunks, offset = [], 0
        while chunk := os.pread(fd, 1 << 20, offset):
            chunks.append(chunk)
            offset += len(chunk)
    except OSError as exc:
        raise ReexecStateError(f"{ENV_VAR}: cannot read state from fd {fd} ({exc.strerror})") from None
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    return b"".join(chunks).decode("utf-8", "replace")


def take(environ=None) -> ReexecState | None:
    """The state left by the previous image, or None on a fresh start. Removes the
    variable, checks every named fd, makes them close-on-exec. Raises ReexecStateError
    with every fd left as it came (see the module's docstring)."""
    env = os.environ if environ is None else environ
    text = env.pop(ENV_VAR, None)
    if text is None:
        return None
    if text.startswith(_MEMFD):
        text = _read_memfd(text)
    state = decode(text)
    for fd in state.fds:
        try:
            os.fstat(fd)
        except OSError as exc:
            raise ReexecStateError(f"{ENV_VAR}: fd {fd} is not open ({exc.strerror})") from None
    for item in state.listeners:
        try:
            check(item.fd, item.listener)
        except ListenerMismatch as exc:
            raise ReexecStateError(f"{ENV_VAR}: {exc}") from None
    for worker in state.workers:
        _check_worker_fd(worker)
    if state.metrics_fd >= 0:
        _check_listening(state.metrics_fd)
    for fd in state.fds:
        os.set_inheritable(fd, False)             # open (fstat above): cannot fail
    return state


def _check_listening(fd: int) -> None:
    where = f"{ENV_VAR}: metrics fd {fd}"
    try:
        with borrowed_socket(fd) as sock:
            if sock.type != socket.SOCK_STREAM or not sock.getsockopt(socket.SOL_SOCKET,
                                                                      socket.SO_ACCEPTCONN):
                raise ReexecStateError(f"{where} is not a listening stream socket")
    except OSError as exc:
        raise ReexecStateError(f"{where} is not a socket ({exc.strerror})") from None


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
