"""sockherd.ipc: framed messages and fd passing over socketpairs, listener
inheritance formats, control protocol.

    errors      the exception hierarchy (who is at fault, is the channel still usable)
    fds         ownership moves for fds: close_all, dup_all, borrowed_socket
    listeners   ListenerDescriptor, describe() a live socket, check()/adopt() a passed fd
    messages    the typed master/worker/hand-off messages and their msgpack encoding
    nesting     the nesting depth of a msgpack payload, bounded before msgspec decodes it
    frames      wire format (header, fd batches, ACK) and the sans-I/O FrameDecoder
    outbox      pending output: partial writes, fd batches gated by ACKs
    channel     Channel: blocking send/recv, or post/flush/read_available from a poll loop
    systemd     LISTEN_FDS socket activation, as sd_listen_fds(3)
    reexec      state handed to a new master image across exec()
    handoff     HandoffServer / fetch_listeners(): live transfer for --takeover
"""
