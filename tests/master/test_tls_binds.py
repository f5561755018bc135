"""Which listeners serve TLS (master/tls_binds.py flags), on real bound
sockets: the matching a reload's reuse of a socket follows. Finding
guarded: a socket kept by a reload under another spelling of its address
(`localhost:P` after `127.0.0.1:P`, master/reload.py) must be found by the
entry that now names it, or its TLS-ness would silently be lost."""
from __future__ import annotations

import pytest

from sockherd.master import settings as S
from sockherd.master.listeners import bind
from sockherd.master.tls_binds import flags

pytestmark = pytest.mark.timeout(30)


def settings(*binds: str, certfile: str = "c.pem"):
    return S.Settings(bind=list(binds), certfile=certfile)


@pytest.fixture
def listeners():
    out = [bind("127.0.0.1:0"), bind("127.0.0.1:0")]
    yield out
    for lst in out:
        lst.close()


def test_no_mark_every_listener_and_no_certfile_none(listeners):
    assert flags(settings("127.0.0.1:0"), listeners) == [True, True]
    assert flags(settings("tls://127.0.0.1:0", certfile=""), listeners) == [False, False]


def test_a_kept_socket_is_found_by_its_kernel_address_under_another_spelling(listeners):
    a, b = (lst.sock.getsockname()[1] for lst in listeners)
    assert flags(settings(f"tls://localhost:{b}", f"127.0.0.1:{a}"), listeners) == [False, True]
    assert flags(settings(f"tcp://localhost:{b}", f"tls://127.0.0.1:{a}"),
                 listeners) == [True, False]
