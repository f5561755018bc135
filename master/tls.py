"""The TLS settings checked where they are read: at start and at every
reload, before anything binds or spawns.

The engine builds its own OpenSSL context in each worker (worker/native/
conn_tls_ctx.c, Server.set_tls) from the files' bytes the master read for
its generation (with_files(), before the worker's `--user` switch), so a
reload reads the certificate and key again; a worker respawned between two
reloads serves what its generation read. The master loads the same files with Python's ssl first: a missing
file, a key that does not match its certificate or a wrong password then
refuses the start (exit 2) or the reload, naming the file, while the
serving generation keeps serving; a worker that still fails (a file changed
between the two reads) is a refused reload like any worker that never
became READY.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import re
import ssl
import time
from typing import Any

from sockherd.master import tls_binds


class TlsError(ValueError):
    """A TLS setting that cannot be served (the message names the file)."""


def password(value: str, path: str) -> bytes | None:
    """The keyfile's password: the first line of its file, or the setting."""
    if path:
        try:
            with open(path, "rb") as f:
                return f.readline().rstrip(b"\r\n")
        except OSError as exc:
            raise TlsError(f"keyfile_password_file {path}: {exc.strerror}") from None
    return value.encode() if value else None


# The session-ticket secret of this master's workers (issue 35 §14, §28):
# 32 random bytes made at the first spawn with TLS, never written to disk;
# it travels in the worker's assignment, over its socketpair. Each worker
# derives its ticket keys from it and from its TLS policy, and ratchets it
# forward every ssl_ticket_key_rotation seconds (worker/native/
# conn_tls_tickets.c, which says how): shared, a ticket issued by one
# worker resumes on any other; ratcheted, an old key is gone for good. The
# master keeps the secret of the epoch before the current one (still
# accepted for decryption) and ratchets it the same way, so a worker
# spawned later agrees with the running ones. A change of the rotation at
# a reload makes a new secret; an upgrade (re-exec) does too: tickets
# issued before it fall back to a full handshake once.
_TICKETS: dict = {}
TICKET_SECRET = "tls_ticket_secret"    # the assignment's keys (not settings)
TICKET_EPOCH = "tls_ticket_epoch"


def ratchet(secret: bytes) -> bytes:
    """The next epoch's secret (conn_tls_tickets.c ratchet())."""
    return hmac.new(secret, b"next", hashlib.sha256).digest()


def ticket_secret(rotation: int) -> tuple[bytes, int]:
    """(secret, epoch) for a worker spawned now: the epoch before the
    current one (CLOCK_MONOTONIC seconds // rotation, as the workers count)."""
    epoch = int(time.monotonic()) // rotation - 1
    if _TICKETS.get("rotation") != rotation:
        _TICKETS.update(rotation=rotation, secret=os.urandom(32), epoch=epoch)
    while _TICKETS["epoch"] < epoch:
        _TICKETS["secret"] = ratchet(_TICKETS["secret"])
        _TICKETS["epoch"] += 1
    return _TICKETS["secret"], _TICKETS["epoch"]


# The TLS files' bytes, read by the master once per generation (issue 35
# §26 and its review): a worker switches to `--user` before it builds its
# context, and a key readable by root alone (0600, /etc/ssl/private) failed
# it with OpenSSL's "system lib". The master keeps its identity and reads
# them, as nginx reads its keys before dropping privileges, at the start
# and at each reload (with_files(), beside the settings' check), never at a
# worker's spawn: a worker that exits cannot make root read a file again,
# such as one its user swapped for a symlink to a root-only file. Of what it
# reads it keeps only the PEM blocks a certificate, key or CA file holds
# (anything else in the file, a root-only secret included, is not shipped),
# and refuses a file that has none. They travel hex-encoded in the
# assignment (as the ticket secret does); the engine loads them from memory
# (worker/native/conn/conn_tls_load.c).
TLS_FILES = "tls_files"                # the assignment's key (not a setting)

_CERTS = (b"CERTIFICATE", b"TRUSTED CERTIFICATE", b"X509 CERTIFICATE")
_KEYS = (b"PRIVATE KEY", b"ENCRYPTED PRIVATE KEY", b"RSA PRIVATE KEY", b"EC PRIVATE KEY",
         b"DSA PRIVATE KEY")
_CAS = _CERTS + (b"X509 CRL",)
# a block: its BEGIN and END lines of one label, and the lines between
# (base64, and an encrypted legacy key's Proc-Type/DEK-Info headers). Read
# a line at a time, as OpenSSL reads (pem_lib.c): a line's trailing
# whitespace and control bytes are not part of it (a BEGIN line padded by
# an editor or a paste is one OpenSSL accepts), and each line is looked at
# once, whatever the file holds (issue 35 review 3: a regex whose body ran
# from every BEGIN line to the file's end took quadratic time).
_LINE_END = bytes(range(33))          # what OpenSSL's sanitize_line strips
_BEGIN = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\Z")
_INSIDE = re.compile(rb"[A-Za-z0-9+/=:,\- \t\r]*")


def _blocks(data: bytes, labels: tuple) -> list[bytes]:
    """The PEM blocks of data whose label is one of labels, in order, each
    line without its trailing whitespace, lines joined by LF."""
    blocks: list[bytes] = []
    block: list[bytes] | None = None
    end = b""
    for line in data.split(b"\n"):
        line = line.rstrip(_LINE_END)
        if block is not None:
            if line.startswith(end):
                block.append(end)
                blocks.append(b"\n".join(block))
                block = None
                continue
            if not line.startswith(b"-----") and _INSIDE.fullmatch(line):
                block.append(line)
                continue
            block = None                  # no block after all: this line may begin one
        m = _BEGIN.search(line)
        if m and m.group(1) in labels:
            block, end = [m.group(0)], b"-----END " + m.group(1) + b"-----"
    return blocks


def _read(what: str, path: str, labels: tuple) -> str:
    """The PEM blocks of labels in path's file, hex; TlsError naming what
    and path (never the content) when it cannot be read or has none."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise TlsError(f"{what} {path}: {exc.strerror}") from None
    blocks = _blocks(data, labels)
    if not blocks:
        kinds = " or ".join(f"-----BEGIN {x.decode()}-----" for x in labels[:2])
        raise TlsError(f"{what} {path}: no PEM block of its kind ({kinds}): not a PEM "
                       f"{'key' if labels is _KEYS else 'certificate'} file")
    return (b"\n".join(blocks) + b"\n").hex()


def files(config: dict) -> dict:
    """The certificate, key, client CAs and key password a worker of config
    serves with, read now. Raises TlsError naming the file and the reason."""
    certfile = config["certfile"]
    got = {"cert_pem": _read("certfile", certfile, _CERTS),
           "key_pem": _read("keyfile", config.get("keyfile") or certfile, _KEYS)}
    if config.get("ca_certs"):
        got["ca_pem"] = _read("ca_certs", config["ca_certs"], _CAS)
    pw = password(config.get("keyfile_password") or "", config.get("keyfile_password_file") or "")
    got["password"] = pw.hex() if pw is not None else None
    return got


def with_files(config: dict) -> dict:
    """A generation's config (its settings as a dict) with the TLS files'
    bytes, read now: at the start, and at a reload with its settings. Its
    workers, the first ones and every one respawned later, are sent these.
    Raises TlsError naming the file."""
    if not config.get("certfile"):
        return config
    return dict(config, **{TLS_FILES: files(config)})


def assignment(config: dict, settings: Any, listeners: list) -> dict:
    """A worker's assignment config: with the master's ticket secret, the TLS
    files' bytes and which of its listeners serve TLS (master/tls_binds.py)
    when TLS is on (a copy; config itself is the generation's, left as it
    is, with the files read by with_files: none is read here)."""
    if not config.get("certfile"):
        return config
    secret, epoch = ticket_secret(settings.ssl_ticket_key_rotation)
    return dict(config, **{TICKET_SECRET: secret.hex(), TICKET_EPOCH: epoch,
                           tls_binds.TLS_LISTENERS: tls_binds.flags(settings, listeners)})


def take_secrets(cfg: dict) -> dict:
    """The ticket secret and the TLS files' bytes, taken out of a worker's
    assignment config (issue 35 review): cfg is the worker's config for its
    whole life (the hooks' worker.cfg, the embedded page's), and the secret
    it was spawned with would let every later ticket key be derived again
    (conn_tls_tickets.c ratchets it so that none can). The worker hands what
    this returns to its engine once (set_tls) and keeps no reference. The
    setting keyfile_password goes too (issue 35 review 3): the master sends
    the password in TLS_FILES, and a worker started without them finds it
    in what this returns."""
    return {k: cfg.pop(k) for k in (TICKET_SECRET, TLS_FILES, "keyfile_password") if k in cfg}


def engine_args(cfg: dict) -> dict | None:
    """Server.set_tls's arguments from a worker's settings (a dict), None
    when TLS is off. With the master's TLS_FILES the engine reads no file
    (the paths name them in errors); without (a worker started on its own)
    it reads them itself."""
    if not cfg.get("certfile"):
        return None
    secret = cfg.get(TICKET_SECRET)
    got = cfg.get(TLS_FILES)
    pem = {k: bytes.fromhex(got[k]) if got.get(k) else None
           for k in ("cert_pem", "key_pem", "ca_pem")} if got else {}
    if got:
        pw = bytes.fromhex(got["password"]) if got.get("password") is not None else None
    else:
        pw = password(cfg.get("keyfile_password") or "", cfg.get("keyfile_password_file") or "")
    return dict(certfile=cfg["certfile"], keyfile=cfg.get("keyfile") or "",
                ticket_secret=bytes.fromhex(secret) if secret else None,
                ticket_epoch=cfg.get(TICKET_EPOCH) or 0,
                ticket_rotation=cfg.get("ssl_ticket_key_rotation") or 3600,
                password=pw, **pem,
                ca_certs=cfg.get("ca_certs") or "", cert_reqs=cfg.get("cert_reqs") or "none",
                ciphers=cfg.get("ciphers") or "",
                min_version=cfg.get("ssl_min_version") or "TLSv1.2")


def check(s: Any) -> None:
    """Raises TlsError unless the certificate, key and CA files load and
    the key matches the certificate. Nothing to check when certfile is
    empty (but a TLS setting given without it is an error: it would be
    silently plain), and the `bind` entries marked tls:// or tcp://
    (master/tls_binds.py)."""
    try:
        tls_binds.check(s)
    except tls_binds.BindTlsError as exc:
        raise TlsError(str(exc)) from None
    if not s.certfile:
        stray = [k for k in ("keyfile", "keyfile_password", "keyfile_password_file",
                             "ca_certs", "ciphers") if getattr(s, k)]
        if stray or s.cert_reqs != "none":
            raise TlsError(f"{(stray or ['cert_reqs'])[0]} is set but certfile is not: "
                           f"TLS needs a certificate")
        return
    if s.interface == "stream":
        raise TlsError("certfile: TLS is served for the HTTP interfaces (wsgi, asgi); a "
                       "stream app gets its bytes as they come (terminate TLS in front)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    keyfile = s.keyfile or s.certfile
    for what, path in (("certfile", s.certfile), ("keyfile", keyfile)):
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise TlsError(f"{what} {path}: {exc.strerror}") from None
    try:
        ctx.load_cert_chain(s.certfile, keyfile,
                            password(s.keyfile_password, s.keyfile_password_file)
                            or (lambda: b""))
    except ssl.SSLError as exc:
        why = exc.reason or str(exc)
        if "KEY_VALUES_MISMATCH" in str(exc) or why == "KEY_VALUES_MISMATCH":
            raise TlsError(f"keyfile {keyfile} does not match certfile {s.certfile}") from None
        raise TlsError(f"certfile {s.certfile} / keyfile {keyfile}: {why} (a PEM certificate "
                       f"and its key, and the key's password if it is encrypted)") from None
    if s.ca_certs:
        try:
            ctx.load_verify_locations(s.ca_certs)
        except (OSError, ssl.SSLError) as exc:
            raise TlsError(f"ca_certs {s.ca_certs}: {getattr(exc, 'strerror', None) or exc}") \
                from None
    elif s.cert_reqs != "none":
        raise TlsError(f"cert_reqs = {s.cert_reqs}: client certificates are verified against "
                       f"ca_certs, which is not set")
    if s.ciphers:
        try:
            ctx.set_ciphers(s.ciphers)
        except ssl.SSLError:
            raise TlsError(f"ciphers {s.ciphers!r}: no cipher OpenSSL knows") from None
