"""An httpx transport: HTTP/2 over TLS on our own connections, HTTP/1.1 keep-alive otherwise.

One ``Transport`` serves one target. Every TLS origin gets a small pool of ``HTTP2Connection``s
(streams are multiplexed; a second connection opens only when the server's stream limit is
reached). Plain-HTTP origins, and TLS servers that do not offer ``h2`` in ALPN, go through httpx's
own HTTP/1.1 transport with keep-alive: there, closing a response early closes its connection,
which the server sees as a cancel.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import anyio
import anyio.abc
import httpx
from anyio.streams.tls import TLSAttribute, TLSStream

from .._types import Timings
from ._events import EventDeadline
from ._h2 import MAX_STREAMS, ConnectionNotAvailable, HTTP2Connection
from ._h2_stream import _deadline

__all__ = [
    "Transport",
    "body_receiver",
    "bound_wait",
    "close_quietly",
    "make_ssl_context",
    "replay_head",
    "response_timings",
]

_ATTEMPTS = 3


def make_ssl_context(
    verify: ssl.SSLContext | str | bool = True, *, alpn: tuple[str, ...] = ("h2", "http/1.1")
) -> ssl.SSLContext:
    """A client TLS context: system/certifi roots, a CA file or directory, or verification off."""
    if isinstance(verify, ssl.SSLContext):
        ctx = verify
    elif verify is False:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif isinstance(verify, str):
        if os.path.isdir(verify):
            ctx = ssl.create_default_context(capath=verify)
        else:
            ctx = ssl.create_default_context(cafile=verify)
    else:
        ctx = _default_context()
    ctx.set_alpn_protocols(list(alpn))
    return ctx


def _default_context() -> ssl.SSLContext:
    cafile = os.environ.get("SSL_CERT_FILE")
    capath = os.environ.get("SSL_CERT_DIR")
    if cafile or capath:
        return ssl.create_default_context(cafile=cafile, capath=capath)
    try:
        import certifi

        return ssl.create_default_context(cafile=certifi.where())
    except ImportError:  # pragma: no cover - certifi comes with httpx
        return ssl.create_default_context()


class _OriginPool:
    """The HTTP/2 connections to one (host, port)."""

    def __init__(self, transport: Transport, host: str, port: int) -> None:
        self.transport = transport
        self.host = host
        self.port = port
        self.connections: list[HTTP2Connection] = []
        self.connect_lock = anyio.Lock()
        self.slot_freed = anyio.Event()
        self.http1_only = False

    def _prune(self) -> None:
        now = time.monotonic()
        keep: list[HTTP2Connection] = []
        for conn in self.connections:
            expired = conn.is_idle() and now - conn.last_used > self.transport.keepalive_expiry
            if conn.is_closed() or expired or conn.has_expired():
                self.transport._to_close.append(conn)
            else:
                keep.append(conn)
        self.connections = keep

    def _available(self) -> HTTP2Connection | None:
        best: HTTP2Connection | None = None
        for conn in self.connections:
            if conn.is_available() and (best is None or conn.open_streams < best.open_streams):
                best = conn
        return best

    def _take(self) -> HTTP2Connection | None:
        """The least busy live connection with a free stream slot, reserved; ``None``: none."""
        self._prune()
        conn = self._available()
        if conn is not None:
            conn.reserve()
        return conn

    async def acquire(self, timeouts: dict[str, Any]) -> tuple[HTTP2Connection | None, bool]:
        """A connection with a free stream slot (reserved for the caller), and whether reused.

        ``None`` means the server does not speak HTTP/2: use HTTP/1.1.
        """
        conn = self._take()
        if conn is not None:  # the common case: no wait, so no deadline (a cancel scope)
            return conn, True
        with _deadline(timeouts.get("pool"), httpx.PoolTimeout):
            while True:
                conn = self._take()
                if conn is not None:
                    return conn, True
                if len(self.connections) < self.transport.max_connections:
                    async with self.connect_lock:
                        conn = self._take()
                        if conn is not None:
                            return conn, True
                        if self.http1_only:
                            return None, False
                        # Others queued on the lock may have filled the pool meanwhile.
                        if len(self.connections) < self.transport.max_connections:
                            conn = await self._connect(timeouts.get("connect"))
                            if conn is None:
                                return None, False
                            self.connections.append(conn)
                            conn.reserve()
                            return conn, False
                    continue
                if self.slot_freed.is_set():
                    self.slot_freed = anyio.Event()
                self.transport.stream_waits += 1
                await self.slot_freed.wait()

    async def _connect(self, timeout: float | None) -> HTTP2Connection | None:
        started = time.monotonic()
        transport = self.transport
        with _deadline(timeout, httpx.ConnectTimeout):
            try:
                tcp = await anyio.connect_tcp(self.host, self.port)
            except OSError as exc:
                raise httpx.ConnectError(
                    f"cannot connect to {self.host}:{self.port}: {exc}"
                ) from exc
            try:
                # The context may be shared with clients that set their own ALPN list at each
                # connect (httpcore does): set ours right before the handshake, with no await
                # in between, since the TLS object copies the list when it is created.
                ctx = transport.ssl_context_for(self.host, self.port)
                ctx.set_alpn_protocols(["h2", "http/1.1"])
                sock = await TLSStream.wrap(
                    tcp, hostname=self.host, ssl_context=ctx, standard_compatible=False
                )
            except BaseException as exc:
                await anyio.aclose_forcefully(tcp)
                if isinstance(exc, OSError | ssl.SSLError | anyio.BrokenResourceError):
                    raise httpx.ConnectError(
                        f"TLS handshake with {self.host}:{self.port} failed: {exc}"
                    ) from exc
                raise
            if sock.extra(TLSAttribute.alpn_protocol) != "h2":
                await sock.aclose()
                self.http1_only = True
                return None
            conn = HTTP2Connection(
                sock, origin=f"{self.host}:{self.port}", connect_time=time.monotonic() - started
            )
            conn.on_stream_closed = self._stream_closed
            conn.stream_cap = transport.max_streams_per_connection
            try:
                await conn.start()
            except BaseException:
                await conn.aclose()
                raise
        conn.connect_time = time.monotonic() - started
        return conn

    def _stream_closed(self, conn: HTTP2Connection) -> None:
        self.slot_freed.set()


class Transport(httpx.AsyncBaseTransport):
    """One target's connections. HTTP/2 streams over TLS, HTTP/1.1 keep-alive for plain HTTP.

    ``max_connections`` bounds the HTTP/2 connections per origin (each carries up to the server's
    stream limit, and at most ``max_streams_per_connection``); ``limits`` configures the HTTP/1.1
    pool. ``verify`` is the TLS trust of every origin but those in ``verify_by_origin``
    (``(host, port)`` -> ``verify``), which have their own: a provider's ``verify`` setting in
    the config.
    """

    def __init__(
        self,
        *,
        verify: ssl.SSLContext | str | bool = True,
        max_connections: int = 8,
        max_streams_per_connection: int = MAX_STREAMS,
        keepalive_expiry: float = 60.0,
        limits: httpx.Limits | None = None,
        verify_by_origin: Mapping[tuple[str, int], ssl.SSLContext | str | bool] | None = None,
    ) -> None:
        self.ssl_context = make_ssl_context(verify)
        self.max_connections = max_connections
        self.max_streams_per_connection = max_streams_per_connection
        self.keepalive_expiry = keepalive_expiry
        self._limits = limits or httpx.Limits(max_connections=100, max_keepalive_connections=20)
        self._http1 = self._http1_transport(verify)
        # Per origin: its HTTP/2 context and its HTTP/1.1 transport.
        self._origins: dict[tuple[str, int], tuple[ssl.SSLContext, httpx.AsyncHTTPTransport]] = {
            (host.lower(), port): (make_ssl_context(v), self._http1_transport(v))
            for (host, port), v in (verify_by_origin or {}).items()
        }
        self._retired: list[httpx.AsyncHTTPTransport] = []  # replaced, closed with the transport
        self._pools: dict[tuple[str, int], _OriginPool] = {}
        self._to_close: list[HTTP2Connection] = []
        self._closed = False
        self.stream_waits = 0
        """How many times a request waited for a free stream: every connection to its origin
        was full and no other could be opened (``max_connections``)."""

    def _http1_transport(self, verify: ssl.SSLContext | str | bool) -> httpx.AsyncHTTPTransport:
        h1_verify = (
            verify
            if isinstance(verify, ssl.SSLContext)
            else make_ssl_context(verify, alpn=("http/1.1",))
        )
        return httpx.AsyncHTTPTransport(
            verify=h1_verify, http1=True, http2=False, limits=self._limits
        )

    def set_origin_verify(self, host: str, port: int, verify: ssl.SSLContext | str | bool) -> None:
        """Give ``host:port`` its own TLS trust from now on (a provider added at run time).

        Connections already open to it keep the trust they were opened with."""
        key = (host.lower(), port)
        old = self._origins.get(key)
        self._origins[key] = (make_ssl_context(verify), self._http1_transport(verify))
        if old is not None:
            self._retired.append(old[1])

    def ssl_context_for(self, host: str, port: int) -> ssl.SSLContext:
        """The TLS context of connections to ``host:port``."""
        own = self._origins.get((host.lower(), port))
        return own[0] if own is not None else self.ssl_context

    def _pool(self, url: httpx.URL) -> _OriginPool:
        key = (url.host, url.port or 443)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _OriginPool(self, *key)
        return pool

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise RuntimeError("the transport is closed")
        if request.url.scheme != "https":
            return await self._handle_http1(request)
        pool = self._pool(request.url)
        timeouts = request.extensions.get("timeout", {})
        await self._close_pruned()
        for _ in range(_ATTEMPTS):
            conn, reused = await pool.acquire(timeouts)
            if conn is None:
                return await self._handle_http1(request)
            try:
                return await conn.handle_request(request, reused=reused)
            except ConnectionNotAvailable:
                continue
        raise httpx.ConnectError(f"no usable HTTP/2 connection to {pool.host}:{pool.port}")

    async def _handle_http1(self, request: httpx.Request) -> httpx.Response:
        connect: dict[str, float] = {}

        async def trace(name: str, info: dict[str, Any]) -> None:
            if name == "connection.connect_tcp.started":
                connect["start"] = time.monotonic()
            elif name in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
                connect["end"] = time.monotonic()

        request.extensions = {**request.extensions, "trace": trace}
        url = request.url
        own = (
            self._origins.get((url.host.lower(), url.port or 443))
            if url.scheme == "https"
            else None
        )
        http1 = own[1] if own is not None else self._http1
        response = await http1.handle_async_request(request)
        reused = "start" not in connect
        response.extensions["llmroute.connection_reused"] = reused
        response.extensions["llmroute.connect_time"] = (
            0.0 if reused else connect.get("end", connect["start"]) - connect["start"]
        )
        return response

    async def warmup(self, url: httpx.URL | str, *, timeout: float | None = 10.0) -> None:
        """Open a connection to ``url``'s origin now, so the first request finds it warm."""
        url = httpx.URL(url)
        if url.scheme != "https":
            return
        pool = self._pool(url)
        if pool.http1_only or any(not c.is_closed() for c in pool.connections):
            return
        async with pool.connect_lock:
            if any(not c.is_closed() for c in pool.connections):
                return
            conn = await pool._connect(timeout)
            if conn is not None:
                conn.last_used = time.monotonic()
                pool.connections.append(conn)

    def connections(self) -> list[HTTP2Connection]:
        """The open HTTP/2 connections (for tests and stats)."""
        return [c for pool in self._pools.values() for c in pool.connections if not c.is_closed()]

    async def _close_pruned(self) -> None:
        while self._to_close:
            await self._to_close.pop().aclose()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._close_pruned()
        for pool in self._pools.values():
            for conn in pool.connections:
                await conn.aclose()
            pool.connections.clear()
        await self._http1.aclose()
        for http1 in [*(pair[1] for pair in self._origins.values()), *self._retired]:
            await http1.aclose()


def bound_wait(response: httpx.Response, seconds: float) -> tuple[bool, float | None]:
    """Bound each wait for the next chunk of ``response``'s body to ``seconds``, where the
    body is llmroute's own (an HTTP/2 stream: the bound costs nothing while chunks are
    already there). Returns whether it could, and the bound the body had before."""
    body = response.extensions.get("llmroute.body")
    if body is None or not hasattr(body, "bound_wait"):
        return False, None
    return True, body.bound_wait(seconds)


def body_receiver(response: httpx.Response) -> Callable[[], Awaitable[bytes | None]]:
    """The fastest way to read ``response``'s body (an event stream) chunk by chunk.

    llmroute's own transport offers ``receive()``; any other transport is read through httpx.
    With a read timeout, the time between complete events is bounded too: a server that keeps
    sending bytes without ever ending an event (a slow loris) fails with ``httpx.ReadTimeout``
    once no event has ended for that long, as a silent one does (:class:`EventDeadline`).
    """
    timeouts = response.request.extensions.get("timeout") or {}
    timeout = timeouts.get("read")
    body = response.extensions.get("llmroute.body")
    if body is not None:
        if timeout is not None:
            body.events = EventDeadline(timeout)
        return body.receive  # type: ignore[no-any-return]
    iterator = response.aiter_raw()
    events = EventDeadline(timeout) if timeout is not None else None

    async def receive() -> bytes | None:
        started = time.monotonic()
        try:
            data = await iterator.__anext__()
        except StopAsyncIteration:
            return None
        if events is not None and data:
            events.check(data, time.monotonic() - started)
        return data

    return receive


def response_timings(response: Any, started: float | None) -> Timings:
    """The timings of a response that has its headers, from ``started`` (now if unknown): the
    headers' time, and the connection's (reused, connect time, HTTP version) as llmroute's
    transport reports them."""
    now = time.monotonic()
    timings = Timings(started_at=started if started is not None else now)
    timings.headers = now - timings.started_at
    ext = getattr(response, "extensions", {}) or {}
    timings.connection_reused = ext.get("llmroute.connection_reused")
    timings.connect = ext.get("llmroute.connect_time")
    version = ext.get("http_version")
    timings.http_version = version.decode() if isinstance(version, bytes) else None
    return timings


async def close_quietly(response: httpx.Response) -> None:
    """Close a response even inside a cancelled scope (this is what resets its HTTP/2 stream)."""
    # One scope: shielded from outside, bounded by its own deadline.
    with anyio.CancelScope(shield=True, deadline=anyio.current_time() + 5):
        with contextlib.suppress(Exception):
            await response.aclose()


class _Replayed(httpx.AsyncByteStream):
    """A body whose first chunks were already read (by the routing, up to the first token),
    given back whole: those chunks, then the rest of the original body."""

    def __init__(self, head: list[bytes], body: httpx.AsyncByteStream) -> None:
        self._head = head
        self._body = body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        head, self._head = self._head, []
        for chunk in head:
            yield chunk
        async for chunk in self._body:
            yield chunk

    async def aclose(self) -> None:
        await self._body.aclose()


def replay_head(response: httpx.Response, head: list[bytes]) -> bool:
    """Make ``response``'s body, whose first chunks ``head`` were read through
    :func:`body_receiver`, read whole again from its start by httpx's own readers
    (``aiter_raw``, ``aiter_lines``): for a caller who reads the vendor's body itself. Only
    for llmroute's own bodies (an HTTP/2 stream, read through ``receive()``, which leaves
    httpx's state alone: the response's stream, or a wrapper of it, goes on where ``receive``
    stopped); returns whether it could."""
    stream = response.stream
    if response.extensions.get("llmroute.body") is None or response.is_stream_consumed:
        return False
    if not isinstance(stream, httpx.AsyncByteStream):
        return False
    response.stream = _Replayed(head, stream)
    return True
