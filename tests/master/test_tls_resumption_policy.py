"""A TLS session resumes only under the client-certificate policy it was
made under (issue 35 §14), on a real master whose reload changes the policy.

Finding reproduced: the session id context was the fixed string
"sockherd" and the ticket keys lived as long as the master, so after a
reload that turned `cert_reqs` from none to required, a client with no
certificate resumed its old session and was served; after a reload that
took a client's CA out of `ca_certs`, its full handshake was refused but
its old session resumed with SSL_CLIENT_VERIFY=SUCCESS (TLS 1.2 and 1.3).

Now the session id context is a SHA-256 over the TLS policy (the
certificate chain, the client-CA list and the CAs verified against,
cert_reqs, the versions and ciphers: conn_tls_ctx.c) and the ticket keys
are derived from it (conn_tls_tickets.c): a session of one policy is a
cache miss and an undecryptable ticket under another, so the client goes
through a full handshake, where the new policy is enforced. Each test
first shows that the session does resume while the policy is unchanged
(so the refusal after the reload is the policy's doing, not a resumption
that never worked)."""
from __future__ import annotations

import signal
import socket
import ssl

import pytest
import trustme

from test_run import children, master, wait_for  # noqa: F401 (fixture)
from tls_support import make_pki, read_response

pytestmark = pytest.mark.timeout(120)

APP = """
def app(environ, start_response):
    body = ("%s %s" % (environ.get("SSL_CLIENT_VERIFY"),
                       environ.get("SSL_SESSION_RESUMED"))).encode()
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]
"""

VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


def get(port: int, ctx: ssl.SSLContext, session=None):
    """One request over a new connection offering `session`: (answer body or
    None when the server refused the client, session_reused, the session to
    offer next)."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s = ctx.wrap_socket(raw, server_hostname="127.0.0.1", session=session)
    except (ssl.SSLError, OSError):
        raw.close()
        return None, False, None
    with s:
        reused = s.session_reused
        try:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            _, body = read_response(s)
        except (ssl.SSLError, OSError, AssertionError):
            # TLS 1.3: a client certificate refused comes as an alert
            # after the client's handshake ended, at its first read
            return None, reused, None
        return body.decode(), reused, s.session


def reload_to(m, config, text: str) -> None:
    old = set(children(m.proc.pid))
    config.write_text(text)
    m.proc.send_signal(signal.SIGHUP)
    m.wait_log(r"reload: generation 2 serving")
    # every connection from now on reaches a worker of the new policy
    wait_for(lambda: not old & set(children(m.proc.pid)), 30, "the old generation's exit")


def toml(pki, **more) -> str:
    lines = [f'certfile = "{pki.cert}"', f'keyfile = "{pki.key}"']
    lines += [f'{k} = "{v}"' for k, v in more.items()]
    return "\n".join(lines) + "\n"


def session_of(port, ctx):
    """A session the server resumes: taken, then shown to resume."""
    body, reused, session = get(port, ctx)
    assert body is not None and not reused, body
    body, reused, session = get(port, ctx, session)
    assert reused and body.endswith("Resumed"), body
    return session, body


@pytest.mark.parametrize("version", VERSIONS)
def test_cert_reqs_none_to_required_refuses_the_old_session(master, tmp_path, version):
    (tmp_path / "polapp.py").write_text(APP)
    pki = make_pki(tmp_path / "pki")
    config = tmp_path / "sockherd.toml"
    config.write_text(toml(pki))
    m = master("polapp:app", "-w", "2", "-c", str(config))
    ctx = pki.context(maximum_version=VERSIONS[version])      # no client certificate
    session, body = session_of(m.port, ctx)
    assert body == "NONE Resumed"
    reload_to(m, config, toml(pki, ca_certs=pki.ca_file, cert_reqs="required"))
    body, reused, _ = get(m.port, ctx, session)
    assert body is None, f"a client without a certificate was served: {body!r} (reused {reused})"
    assert not reused
    # a client with its certificate is served, in a full handshake
    body, reused, _ = get(m.port, pki.context(client_cert=True,
                                              maximum_version=VERSIONS[version]))
    assert body == "SUCCESS Initial" and not reused


@pytest.mark.parametrize("version", VERSIONS)
def test_a_ca_taken_out_of_ca_certs_refuses_its_clients_old_sessions(master, tmp_path,
                                                                      version):
    (tmp_path / "polapp.py").write_text(APP)
    pki = make_pki(tmp_path / "pki")
    other = trustme.CA()                    # the CA of the client later distrusted
    both = tmp_path / "both.pem"
    both.write_bytes(pki.ca_file.read_bytes() + other.cert_pem.bytes())
    config = tmp_path / "sockherd.toml"
    config.write_text(toml(pki, ca_certs=both, cert_reqs="required"))
    m = master("polapp:app", "-w", "2", "-c", str(config))
    ctx = pki.context(maximum_version=VERSIONS[version])
    other.issue_cert("client.other", common_name="client.other").configure_cert(ctx)
    session, body = session_of(m.port, ctx)
    assert body == "SUCCESS Resumed"
    reload_to(m, config, toml(pki, ca_certs=pki.ca_file, cert_reqs="required"))
    body, reused, _ = get(m.port, ctx, session)
    assert body is None, f"a client of a CA no longer trusted was served: {body!r} " \
                         f"(reused {reused})"
    # the trusted CA's clients are served on
    body, _, _ = get(m.port, pki.context(client_cert=True, maximum_version=VERSIONS[version]))
    assert body == "SUCCESS Initial"
