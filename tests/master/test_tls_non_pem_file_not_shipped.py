"""Issue 35 review of point 26 (the master reads the TLS files before the
workers' `--user` switch, master/tls.py files()): it reads whatever the
configured paths name, as root, at every worker spawn (assignment(), from
master/workers.py's spawn, not only at start and reload), and ships the
bytes, unchecked, to a worker that runs as the unprivileged user. Where a
TLS path lies in a directory that user can write (an app directory, a
certificate dir a deploy user owns), the worker user swaps the file for a
symlink to a root-only file (/etc/shadow, another service's key), makes
its worker exit (any crash does), and the master reads that file as root
and hands its bytes to the new worker, which runs the app's code: a read
of any root-only file. nginx too reads as root, but only at start and at a
reload root asks for, and keeps only what parsed as a certificate or key.

The test holds the master to the narrowest part of that: a file that is
no PEM certificate (or key) is refused, not shipped. (Reading once per
generation rather than per spawn would close the trigger too.)"""
from __future__ import annotations

import os

import pytest

from sockherd.master import tls

pytestmark = pytest.mark.timeout(30)

SECRET = b"root:$6$not-a-certificate$hash:19000:0:99999:7:::\n"


@pytest.mark.parametrize("which", ["certfile", "keyfile", "ca_certs"])
def test_a_file_that_is_no_pem_is_refused_not_shipped(tmp_path, which):
    from tls_support import make_pki

    pki = make_pki(tmp_path / "pki")
    secret = tmp_path / "shadow"
    secret.write_bytes(SECRET)
    os.chmod(secret, 0o600)
    swapped = tmp_path / "swapped.pem"
    swapped.symlink_to(secret)                   # what the worker user planted
    config = {"certfile": str(pki.cert), "keyfile": str(pki.key), "ca_certs": str(pki.ca_file)}
    config[which] = str(swapped)
    try:
        got = tls.files(config)
    except tls.TlsError as exc:
        assert which in str(exc) and "shadow" not in str(exc)
        return
    shipped = b"".join(bytes.fromhex(v) for v in got.values() if isinstance(v, str))
    assert SECRET not in shipped, f"{which}: the root-only file's bytes go to the worker"
