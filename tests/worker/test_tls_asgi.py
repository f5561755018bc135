"""TLS under the ASGI interface (issue 24 §2; worker/native/conn/conn_tls.c):
the scope's scheme (https, wss) and the `tls` extension (server_cert,
client_cert_chain, client_cert_name, client_cert_error, tls_version,
cipher_suite), a large response and upload through an app's send and
receive, pathsend's file read into the session (no sendfile under TLS),
and a WebSocket over wss with the websockets client."""
from __future__ import annotations

import hashlib
import http.client
import json
import os

import pytest
import websockets.sync.client as wsc

from tls_support import make_pki

pytestmark = pytest.mark.timeout(90)

BIG = 10 << 20


def make_app(file_path=None):
    async def app(scope, receive, send):
        if scope["type"] == "websocket":
            await receive()                                  # connect
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.send",
                        "text": json.dumps({"scheme": scope["scheme"],
                                            "tls": "tls" in scope.get("extensions", {})})})
            while True:
                msg = await receive()
                if msg["type"] == "websocket.disconnect":
                    return
                await send({"type": "websocket.send", "bytes": msg.get("bytes") or
                            msg["text"].encode()[::-1]})
        path = scope["path"]
        if path == "/scope":
            tls = dict(scope["extensions"]["tls"])
            body = json.dumps({"scheme": scope["scheme"], "tls": tls}).encode()
        elif path == "/big":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", str(BIG).encode())]})
            block = bytes(range(256)) * 4096
            for i in range(BIG // len(block)):
                await send({"type": "http.response.body", "body": block,
                            "more_body": i < BIG // len(block) - 1})
            return
        elif path == "/upload":
            h, n, more = hashlib.sha256(), 0, True
            while more:
                msg = await receive()
                h.update(msg.get("body", b""))
                n += len(msg.get("body", b""))
                more = msg.get("more_body", False)
            body = f"{n} {h.hexdigest()}".encode()
        elif path == "/file":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", str(os.path.getsize(file_path)).encode())]})
            await send({"type": "http.response.pathsend", "path": str(file_path)})
            return
        else:
            body = b"hello " + scope["scheme"].encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    return app


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def request(addr, pki, method, path, body=None, client_cert=False):
    c = http.client.HTTPSConnection(*addr, timeout=30,
                                    context=pki.context(client_cert=client_cert))
    try:
        c.request(method, path, body=body)
        r = c.getresponse()
        data = r.read()
        assert r.status == 200, (r.status, data)
        return data
    finally:
        c.close()


def test_scheme_and_the_tls_extension(serve_asgi, pki):
    _, addr = serve_asgi(make_app(), **pki.settings(ca_certs=str(pki.ca_file),
                                                    cert_reqs="optional"))
    seen = json.loads(request(addr, pki, "GET", "/scope", client_cert=True))
    assert seen["scheme"] == "https"
    tls = seen["tls"]
    assert tls["server_cert"].startswith("-----BEGIN CERTIFICATE-----")
    assert tls["server_cert"] in pki.cert.read_text()
    assert tls["tls_version"] == 0x0304 and tls["cipher_suite"] in (0x1301, 0x1302, 0x1303)
    assert "CN=client.example" in tls["client_cert_name"]
    assert tls["client_cert_error"] is None
    assert tls["client_cert_chain"][0].startswith("-----BEGIN CERTIFICATE-----")
    seen = json.loads(request(addr, pki, "GET", "/scope"))
    assert seen["tls"]["client_cert_name"] is None and seen["tls"]["client_cert_chain"] == []


def test_a_10mb_response_and_a_large_upload(serve_asgi, pki):
    _, addr = serve_asgi(make_app(), **pki.settings())
    body = request(addr, pki, "GET", "/big")
    assert len(body) == BIG and body == bytes(range(256)) * 4096 * (BIG // (1 << 20))
    data = os.urandom(5 << 20)
    assert request(addr, pki, "POST", "/upload", data).decode() == \
        f"{len(data)} {hashlib.sha256(data).hexdigest()}"


def test_pathsend_over_tls(serve_asgi, pki, tmp_path):
    f = tmp_path / "blob"
    data = os.urandom(3 << 20) + b"tail"
    f.write_bytes(data)
    _, addr = serve_asgi(make_app(f), **pki.settings())
    assert request(addr, pki, "GET", "/file") == data


def test_a_websocket_over_wss(serve_asgi, pki):
    _, addr = serve_asgi(make_app(), **pki.settings())
    with wsc.connect(f"wss://127.0.0.1:{addr[1]}/ws", ssl=pki.context(), max_size=8 << 20) as ws:
        assert json.loads(ws.recv()) == {"scheme": "wss", "tls": True}
        for i in range(50):
            ws.send(f"message {i}")
            assert ws.recv() == f"message {i}"[::-1].encode()
        big = os.urandom(3 << 20)
        ws.send(big)
        assert ws.recv() == big
