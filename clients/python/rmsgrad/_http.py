"""Keep-alive HTTP on http.client: one connection per host per thread.

urllib opens a connection per request; a client that uploads and downloads
hundreds of small objects a second spends more on TCP handshakes than on
the bytes. Connections are kept per thread (http.client connections are not
thread-safe) and reopened when the server closed them.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import urllib.parse
from typing import Dict, Mapping, Optional, Tuple

__all__ = ["Response", "Pool"]


class Response:
    """A whole HTTP answer."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


class Pool:
    """Per-thread keep-alive connections, keyed by scheme, host and port."""

    def __init__(self, timeout: float, ssl_context: Optional[ssl.SSLContext] = None) -> None:
        self._timeout = timeout
        self._ssl = ssl_context
        self._local = threading.local()
        self._all: list = []  # every connection of every thread, for close_all
        self._lock = threading.Lock()

    def _conn(self, scheme: str, netloc: str) -> http.client.HTTPConnection:
        conns: Dict[Tuple[str, str], http.client.HTTPConnection] = getattr(self._local, "conns", None) or {}
        self._local.conns = conns
        c = conns.get((scheme, netloc))
        if c is None:
            if scheme == "https":
                ctx = self._ssl or ssl.create_default_context()
                c = http.client.HTTPSConnection(netloc, timeout=self._timeout, context=ctx)
            elif scheme == "http":
                c = http.client.HTTPConnection(netloc, timeout=self._timeout)
            else:
                raise ValueError(f"URL scheme {scheme!r}: want http or https")
            conns[(scheme, netloc)] = c
            with self._lock:
                self._all.append(c)
        return c

    def request(self, method: str, url: str, body: Optional[bytes] = None,
                headers: Optional[Mapping[str, str]] = None, timeout: Optional[float] = None) -> Response:
        """Send one request and read the whole answer. A request on a kept
        connection that the server had closed is sent again once on a new
        one."""
        u = urllib.parse.urlsplit(url)
        target = u.path or "/"
        if u.query:
            target += "?" + u.query
        h = dict(headers or {})
        if body is not None:
            h.setdefault("Content-Length", str(len(body)))
        for attempt in (0, 1):
            c = self._conn(u.scheme, u.netloc)
            fresh = c.sock is None
            try:
                if timeout is not None:
                    c.timeout = timeout
                    if c.sock is not None:
                        c.sock.settimeout(timeout)
                c.request(method, target, body=body, headers=h)
                r = c.getresponse()
                data = r.read()
                if timeout is not None:
                    c.timeout = self._timeout
                    if c.sock is not None:
                        c.sock.settimeout(self._timeout)
                if r.will_close:
                    c.close()
                return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, data)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
                    http.client.CannotSendRequest, http.client.ResponseNotReady):
                c.close()
                if fresh or attempt == 1:
                    raise
            except BaseException:
                c.close()
                raise
        raise AssertionError("unreachable")

    def close_all(self) -> None:
        """Close the connections of every thread (call when no request is
        in flight)."""
        with self._lock:
            conns, self._all = self._all, []
        for c in conns:
            c.close()
        self._local = threading.local()
