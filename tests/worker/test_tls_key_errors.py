"""A TLS file the engine cannot read names the file and the reason
(issue 35 §26; worker/native/conn/conn_tls_load.c), on a real engine.

Finding reproduced: a key the worker could not open (a root-only one
after the `--user` switch) failed with OpenSSL's bare "system lib". The
master now reads the files before the switch
(tests/master/test_tls_key_before_user_switch.py); when the engine reads
one itself (a Server on its own, as here) and fails, the message says
which file and the errno's text, as the master's own check does."""
from __future__ import annotations

import pytest

from test_tls_http import app
from tls_support import make_pki

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("what", ["certfile", "keyfile", "ca_certs"])
def test_a_missing_file_is_named_with_its_errno_text(serve_wsgi, tmp_path, what):
    pki = make_pki(tmp_path / "pki")
    missing = tmp_path / "nope.pem"
    cfg = pki.settings(**{what: str(missing)})
    if what == "ca_certs":
        cfg["cert_reqs"] = "optional"
    with pytest.raises(ValueError) as err:
        serve_wsgi(app, **cfg)
    assert f"{what} {missing}: No such file or directory" in str(err.value)


def test_bytes_that_are_no_key_are_named_with_the_file(serve_wsgi, tmp_path):
    """The master's bytes of the key file (what it sends in the assignment)
    that hold no key: the keyfile's path in the message, OpenSSL's reason."""
    pki = make_pki(tmp_path / "pki")
    cfg = pki.settings(tls_files={"cert_pem": pki.cert.read_bytes().hex(),
                                  "key_pem": b"not a key\n".hex(), "password": None})
    with pytest.raises(ValueError, match=rf"keyfile {pki.key}: \w"):
        serve_wsgi(app, **cfg)
