"""The exceptions of sockherd.ipc.

Callers branch on these, so each says who is at fault and whether the channel it came
from is still usable:

* ProtocolError: the peer broke the framing; the byte stream can no longer be trusted and
  the channel is dead (the master kills a worker that does this).
* MessageError: one frame held an unknown or malformed message; framing is intact and the
  channel keeps working (the master answers with an Error message).
* PeerClosed: the peer went away at a frame boundary; an orderly EOF, not a bug.

Every one of them is raised only after the fds that came with the bad input are closed,
including those of a message the peer can no longer finish (it left mid-batch: a
ProtocolError, however the channel noticed). ChannelTimeout is no verdict on the input:
a message still arriving keeps its fds, and the next receive carries on with it.
"""


class IPCError(Exception):
    """Base of every error raised by sockherd.ipc."""


class ProtocolError(IPCError, ValueError):
    """The peer violated the frame protocol; the channel is unusable from now on."""


class MessageError(ProtocolError):
    """A well-framed message was unknown or malformed; the channel stays usable."""


class PeerClosed(IPCError, ConnectionError):
    """The peer closed the connection (EOF, EPIPE, ECONNRESET) between frames."""


class ChannelTimeout(IPCError, TimeoutError):
    """A blocking send or receive did not complete before its deadline."""


class ListenerMismatch(IPCError, ValueError):
    """An fd is not the socket its listener descriptor says it is."""


class ActivationError(IPCError, ValueError):
    """LISTEN_FDS / LISTEN_PID / LISTEN_FDNAMES are present but invalid."""


class ReexecStateError(IPCError, ValueError):
    """The re-exec state handed over by the previous master image is invalid."""


class HandoffError(IPCError):
    """A live listener transfer from a running instance failed."""
