"""sockherd.fdcore: the native fd table and one epoll poller per thread.

The C core (fd*.c, updlist.c, poller*.c; layout in fd-t.h, API in fd.h) carries
HAProxy's fd semantics; table.py is its Python face.
"""
from sockherd.fdcore.table import (
    COUNTERS,
    Event,
    FdInfo,
    Hook,
    Outcome,
    State,
    Table,
    Thread,
    check,
)

__all__ = ["COUNTERS", "Event", "FdInfo", "Hook", "Outcome", "State", "Table", "Thread", "check"]
