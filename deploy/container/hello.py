"""The example app of deploy/: a plain PEP 3333 WSGI callable.

    sockherd run hello:app --chdir deploy/container -b 127.0.0.1:8000

The container image (deploy/container/Containerfile) serves it from /app, the
systemd example (deploy/systemd/example.toml) from /srv/sockherd/hello, the
Kubernetes Deployment (deploy/kubernetes/) from the image.
"""
import os
import socket

HOST = socket.gethostname()


def app(environ, start_response):
    body = f"hello from {HOST} (pid {os.getpid()}) {environ.get('PATH_INFO', '/')}\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8"),
                              ("Content-Length", str(len(body)))])
    return [body]
