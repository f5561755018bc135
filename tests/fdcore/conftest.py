"""Fixtures of the fdcore tests. Every Table a test makes is closed, with its
fds, whatever happens, and hook errors fail the test."""
from __future__ import annotations

import pytest
from fd_harness import Harness

from sockherd.fdcore import Table


@pytest.fixture
def make():
    made: list[Harness] = []

    def factory(threads: int = 2, groups: int = 1) -> Harness:
        h = Harness(threads, groups)
        made.append(h)
        return h

    yield factory
    errors = []
    for h in made:
        errors.extend(h.t.hook_errors)
        h.finish()
    assert not errors, errors


@pytest.fixture
def tables():
    """Table factory; at teardown every fd still in a table is deleted (the
    table closes it) and the table is freed."""
    made: list[Table] = []

    def make(threads: int, groups: int = 1) -> Table:
        t = Table(threads, groups)
        made.append(t)
        return t

    yield make
    for t in made:
        try:
            for info in t.show_fd():
                try:
                    t.threads[t.group_base(info.tgid)].delete(info.fd)
                except OSError:
                    pass
        finally:
            t.close()
