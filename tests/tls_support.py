"""Certificates made at test time (trustme) and TLS clients for the TLS
tests: a CA, a server certificate for 127.0.0.1 and localhost, a client
certificate, and the client contexts that trust them."""
from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import trustme
from cryptography.hazmat.primitives import serialization


@dataclass
class Pki:
    ca: trustme.CA
    dir: Path
    cert: Path          # the server's certificate chain (PEM)
    key: Path           # its key
    ca_file: Path       # the CA, for ca_certs and the clients
    client: trustme.LeafCert

    def settings(self, **more) -> dict:
        return {"certfile": str(self.cert), "keyfile": str(self.key), **more}

    def context(self, client_cert: bool = False, **kw) -> ssl.SSLContext:
        ctx = ssl.create_default_context()
        self.ca.configure_trust(ctx)
        if client_cert:
            self.client.configure_cert(ctx)
        for k, v in kw.items():
            setattr(ctx, k, v)
        return ctx

    def encrypted_key(self, password: bytes) -> Path:
        key = serialization.load_pem_private_key(self.key.read_bytes(), None)
        path = self.dir / "encrypted.key"
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.BestAvailableEncryption(password)))
        return path


def make_pki(d: Path, name: str = "server", ca: trustme.CA | None = None) -> Pki:
    ca = ca or trustme.CA()
    d.mkdir(parents=True, exist_ok=True)
    leaf = ca.issue_cert("127.0.0.1", "localhost", common_name=name)
    cert, key, ca_file = d / f"{name}.crt", d / f"{name}.key", d / "ca.pem"
    cert.write_bytes(b"".join(p.bytes() for p in leaf.cert_chain_pems))
    key.write_bytes(leaf.private_key_pem.bytes())
    ca.cert_pem.write_to_path(str(ca_file))
    client = ca.issue_cert("client.example", common_name="client.example",
                           organization_name="Clients Inc")
    return Pki(ca, d, cert, key, ca_file, client)


def tls_connect(addr, ctx: ssl.SSLContext, timeout: float = 10) -> ssl.SSLSocket:
    raw = socket.create_connection(addr, timeout=timeout)
    try:
        return ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    except BaseException:
        raw.close()
        raise


def read_response(s, head_only: bool = False) -> tuple[bytes, bytes]:
    """One HTTP/1.1 response with a Content-Length from s: (head, body)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, f"closed before a whole head: {buf!r}"
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    while len(rest) < length:
        chunk = s.recv(1 << 20)
        assert chunk, f"closed after {len(rest)} of {length} body bytes"
        rest += chunk
    return head, rest
