"""Issue 35 review 3, of 10e278c (master/tls.py _read keeps only the PEM
blocks of a file's kind, found by the regex _BLOCK): what OpenSSL, and so
the master's own check with Python's ssl, accepts must still be shipped.

1. OpenSSL strips a line's trailing whitespace before it looks for
   `-----BEGIN X-----` (pem_lib.c sanitize_line); _BLOCK wanted the BEGIN
   line's dashes right before its newline. A certificate or key whose BEGIN
   line ends in a space, a tab or a second CR (a file pasted from a web
   page or a mail, saved by an editor that pads lines) passed the check and
   then was refused as "no PEM block of its kind": the start failed where
   10e278c^ served; worse, a chain's intermediate (or one CA of a bundle)
   with such a line was dropped without a word, and the server sent an
   incomplete chain that clients refuse.
2. _BLOCK's lazy body runs from each BEGIN line to the end of the file
   when no END follows: a key file with a valid key and then many BEGIN
   lines (which OpenSSL never reads: it stops at the first key) took the
   master quadratic time, 9 s for 224 KB, minutes for a megabyte, in the
   master's only thread (at a reload: its whole supervision loop).
"""
from __future__ import annotations

import shutil
import time

import pytest
import trustme

from test_run import master, wait_for  # noqa: F401 (fixture)
from test_tls_master import served_cn, site, tls_args  # noqa: F401 (fixture)
from tls_support import Pki, tls_connect

pytestmark = pytest.mark.timeout(120)


def started(m, timeout: float = 40) -> bool:
    """Polls until a worker is ready (True) or the master exited (False)."""
    wait_for(lambda: "ready, pid" in m.text() or m.proc.poll() is not None, timeout,
             lambda: f"a worker ready or the master's exit\n{m.text()}")
    if m.proc.poll() is not None:
        return False
    import re
    m.port = int(re.findall(r"listening on 127\.0\.0\.1:(\d+)", m.text())[0])
    return True


def pad_begin_lines(pem: bytes, pad: bytes) -> bytes:
    return b"".join(line.rstrip(b"\n") + pad + b"\n" if line.startswith(b"-----BEGIN") else line
                    for line in pem.splitlines(keepends=True))


@pytest.mark.parametrize("pad", [b" ", b"\t", b"\r\r", b"  \r"])
def test_a_begin_line_with_trailing_whitespace_still_serves(master, tmp_path, site, pad):
    for name in ("live.crt", "live.key"):
        p = tmp_path / name
        p.write_bytes(pad_begin_lines(p.read_bytes(), pad))
    m = master("tlsapp:app", "-w", "1", *tls_args(tmp_path), ready=None)
    assert started(m), m.text()
    assert served_cn(m.port, site) == "first"


def test_an_intermediate_with_trailing_whitespace_is_still_sent(master, tmp_path, site):
    root = trustme.CA()
    inter = root.create_child_ca()
    leaf = inter.issue_cert("127.0.0.1", "localhost", common_name="chained")
    leaf_pem, inter_pem = (p.bytes() for p in leaf.cert_chain_pems)
    (tmp_path / "live.crt").write_bytes(leaf_pem + pad_begin_lines(inter_pem, b" "))
    (tmp_path / "live.key").write_bytes(leaf.private_key_pem.bytes())
    pki = Pki(root, tmp_path, tmp_path / "live.crt", tmp_path / "live.key", None, None)
    m = master("tlsapp:app", "-w", "1", *tls_args(tmp_path), ready=None)
    assert started(m), m.text()
    # the client trusts the root only: the handshake needs the intermediate
    assert served_cn(m.port, pki) == "chained"


def test_a_key_file_padded_with_begin_lines_does_not_stall_the_master(master, tmp_path, site):
    key = tmp_path / "live.key"
    # a valid key, then BEGIN lines with no END: OpenSSL reads the key and
    # stops; 1.5 MB of them
    key.write_bytes(key.read_bytes() + b"-----BEGIN PRIVATE KEY-----\n" * 55_000)
    t0 = time.monotonic()
    m = master("tlsapp:app", "-w", "1", *tls_args(tmp_path), ready=None)
    assert started(m, timeout=40), m.text()
    assert served_cn(m.port, site) == "first"
    assert time.monotonic() - t0 < 40
