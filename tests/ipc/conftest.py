"""Fixtures shared by the ipc tests."""
from __future__ import annotations

import os
import shutil
import socket
import tempfile

import pytest


@pytest.fixture(scope="module")
def path_listener():
    """A unix listener bound to a file (O_PATH can only reach sockets that
    have one); module-scoped so hypothesis tests can use it."""
    directory = tempfile.mkdtemp(prefix="sh-")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(os.path.join(directory, "l.sock"))
    sock.listen()
    yield sock
    sock.close()
    shutil.rmtree(directory)
