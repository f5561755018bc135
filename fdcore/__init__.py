"""sockherd.fdcore: the native fd table and per-thread epoll pollers."""
from sockherd.fdcore._fdcore import ffi, lib  # noqa: F401
