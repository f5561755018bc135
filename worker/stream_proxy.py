"""A PROXY protocol header ahead of a stream handler's bytes: read into its
own buffer while the handler waits (on_connect comes once it is in, within
header_timeout), checked by the engine's own parser
(worker/native/parse/proxy_proto.c) under the listener's policy
(worker/proxy.py), then the bytes after it handed to the handler.
Connection (worker/stream.py) is built on StreamProxyHeader; it calls
StreamCore (stream_core.py) only."""
from __future__ import annotations

import time

from sockherd.worker._http import proxy_parse, proxy_signature
from sockherd.worker.stream_core import StreamCore


class StreamProxyHeader(StreamCore):
    """A Connection's PROXY protocol header (see the module)."""

    __slots__ = ()

    def _proxy_read(self) -> None:
        """One read into the header's buffer, then the parser's verdict (the
        engine's own parser, worker/native/parse/proxy_proto.c)."""
        data = self._read_once()
        if data is None:
            return
        self.last_active = time.monotonic()
        self._proxy_buf += data
        self._proxy_feed(eof=not data)

    def _proxy_feed(self, eof: bool) -> None:
        buf = self._proxy_buf
        if not self._proxy_trusted:
            sig = proxy_signature(buf)
            if sig == 1:
                self._proxy_refuse("a PROXY protocol header from a peer not in proxy_allow_from")
            elif sig == 0 or eof:
                self._proxy_done(None, 0, eof)  # not a header: the handler's bytes
            return
        used, info = proxy_parse(buf, self.loop.proxy.mode)
        if used == 0:
            if eof:                              # a bare connect-and-close: no line
                self._proxy_refuse("a truncated PROXY protocol header" if buf else None)
            return
        if used < 0:
            self._proxy_refuse(info)
            return
        info["peer"] = self.peer
        # an AF_UNIX source (a unix-socket frontend's client) is a path,
        # raw bytes the proxy copied, no address: the peer stays the
        # socket's, as the engine's HTTP path keeps it (conn_proxy.c
        # apply), and the path (CR/LF and all) reaches no log line
        if not info["local"] and isinstance(info["src"], tuple):
            self.peer = info["src"]
        self._proxy_done(info, used, eof)

    def _proxy_done(self, info, used: int, eof: bool) -> None:
        """The header is in (or there is none): on_connect, then the bytes
        after it as on_data, then the end of input if it came."""
        rest = bytes(self._proxy_buf[used:])
        self.proxy = info
        self._proxy_buf = None
        self._proxy_wait = False
        self.timer_at = 0.0                      # header_timeout's: the handler's from now
        self.connect()
        if rest and not self._closed:
            self._call("on_data", rest)
        if eof and not self._closed:
            self._eof = self._eof_told = True
            self._sync()
            self._call("on_eof", default=self.close)

    def _proxy_refuse(self, reason: str | None) -> None:
        """Closed over its header (logged, at most a line a second); the
        handler was never told of the connection, nor is of its end."""
        if reason:
            self.loop.proxy.refused(self.peer, reason)
        self._out.clear()
        self._close_now(gone=True)
