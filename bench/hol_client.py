"""The head-of-line client of bench/blocking_app.py (issue 21): slow requests
keep some threads of a server busy while fast requests are timed.

A keep-alive connection for /fast is opened first (one untimed request), then
`SLOW` connections (threads of this process) each loop on `GET /slow` (1 s in
bench/apps/blocking.py) on one keep-alive connection: a server may place a slow
connection beside the fast one. Once the server reports that many /slow
requests inside its app (the `slow=N` of `/fast`'s answer), the timer sends
`GET /fast` requests one after the other, `interval` s apart (so that a phase
spans the slow connections' next requests, not only one slow call): first on
the keep-alive connection, then each on a new connection (connect + request +
response timed; the client closes). Each phase stops after `count` requests
or `seconds`, whichever comes first, so a server that queues the fast requests behind the
slow ones ends the phase with fewer requests, not a run of many minutes.
Raw sockets, one request in flight per connection: nothing of the client
itself can pile requests up.
"""
from __future__ import annotations

import socket
import threading
import time


class HttpConn:
    """One keep-alive HTTP/1.1 connection, a request at a time."""

    def __init__(self, port: int, timeout: float):
        self.port = port
        self.timeout = timeout
        self.sock = None

    def request(self, path: str) -> bytes:
        """The body of a 200 answer to GET path; connects first when the last
        answer said `Connection: close` (or none was asked yet); OSError /
        ValueError on anything else (a keep-alive connection the server closed
        as idle included: the caller counts it and closes)."""
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=self.timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            d = self.sock.recv(65536)
            if not d:
                raise ValueError(f"EOF before a whole head ({len(buf)} bytes)")
            buf += d
        head, body = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        if not lines[0].startswith("HTTP/1.1 200"):
            raise ValueError(f"status line {lines[0]!r}")
        hdrs = {k.strip().lower(): v.strip()
                for k, _, v in (ln.partition(":") for ln in lines[1:])}
        length = int(hdrs.get("content-length", "-1"))
        if length < 0:
            raise ValueError("no Content-Length")
        while len(body) < length:
            d = self.sock.recv(65536)
            if not d:
                raise ValueError("EOF inside the body")
            body += d
        if hdrs.get("connection", "").lower() == "close":
            self.close()
        return body[:length]

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def parse_fast(body: bytes) -> dict:
    return {k: int(v) for k, v in (kv.split("=") for kv in body.decode().split())}


class SlowLoops:
    """`n` threads, each looping on GET /slow on its own keep-alive connection
    until stop(); their latencies and errors."""

    def __init__(self, port: int, n: int, path: str = "/slow"):
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._loop, args=(port, path), daemon=True)
                        for _ in range(n)]
        for t in self.threads:
            t.start()

    def _loop(self, port: int, path: str) -> None:
        conn = HttpConn(port, timeout=30)
        try:
            while not self.stopping.is_set():
                t0 = time.perf_counter()
                try:
                    conn.request(path)
                except (OSError, ValueError) as e:
                    with self.lock:
                        self.errors.append(f"{type(e).__name__}: {e}")
                    conn.close()
                    self.stopping.wait(0.1)          # no tight loop on a dead server
                    continue
                with self.lock:
                    self.latencies.append(time.perf_counter() - t0)
        finally:
            conn.close()

    def stop(self, timeout: float = 35.0) -> None:
        """Lets each loop finish its request in flight (at most `timeout` s)."""
        self.stopping.set()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))


def wait_slow_inside(port: int, n: int, timeout: float) -> int:
    """Polls /fast (new connection each time) until the server reports n /slow
    requests inside its app; the most it saw (n, or fewer at the deadline)."""
    deadline = time.monotonic() + timeout
    most = 0
    while time.monotonic() < deadline:
        conn = HttpConn(port, timeout=max(0.1, deadline - time.monotonic()))
        try:
            most = max(most, parse_fast(conn.request("/fast"))["slow"])
        except (OSError, ValueError):
            pass
        finally:
            conn.close()
        if most >= n:
            break
        time.sleep(0.02)
    return most


def time_fast(port: int, count: int, seconds: float, interval: float,
              conn: HttpConn | None = None, timeout: float = 10.0) -> dict:
    """Up to `count` sequential GET /fast, `interval` s apart, within `seconds`:
    on `conn` (kept alive), or without it each on a new connection. Latencies
    (s), the /slow requests the server was inside at each answer, the distinct
    answering threads, errors."""
    lat, slow, tids, errors = [], [], set(), []
    new_conn = conn is None
    conn = conn or HttpConn(port, timeout)
    deadline = time.monotonic() + seconds
    try:
        while len(lat) < count and time.monotonic() < deadline:
            if lat and interval > 0:
                time.sleep(interval)                 # pacing, the client's think time
            t0 = time.perf_counter()
            try:
                info = parse_fast(conn.request("/fast"))
            except (OSError, ValueError) as e:
                errors.append(f"{type(e).__name__}: {e}")
                conn.close()
                if len(errors) > 10:
                    break
                continue
            lat.append(time.perf_counter() - t0)
            slow.append(info["slow"])
            tids.add((info["pid"], info["tid"]))
            if new_conn:
                conn.close()
    finally:
        conn.close()
    return {"lat": lat, "slow": slow, "threads": len(tids), "errors": errors}
