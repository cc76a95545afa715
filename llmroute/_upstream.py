"""Upstream requests of routed calls: one HTTP request to one target, built and sent.

The routing engine asks for an attempt on a target; this module turns the call's body and
options into that target's request (its base URL, key, headers and wire protocol), sends it on
llmroute's transport and reports the timings of the exchange. Requests for a model name that is
not a route never come here: openai's own machinery builds those.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import http.cookiejar
import json
import logging
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, cast

import anyio
import anyio.to_thread
import httpx

from ._errors import (
    APIConnectionError,
    RequestBodyError,
    explained,
    make_status_error,
    map_transport_errors,
)
from ._types import Timings
from ._version import __version__
from .config import ResolvedProvider
from .protocols import adapter_for
from .routing.engine import vendor_request_id
from .routing.route import SENDING, RouteTarget, Sender
from .transport import response_timings

__all__ = [
    "OFF_LOOP_BYTES",
    "OFF_LOOP_THREADS",
    "OWN_HEADER_PREFIX",
    "Upstream",
    "body_errors",
    "check_base_url",
    "credentials",
    "encode_body",
    "merge_headers",
    "no_cookies",
    "openai_http",
    "proxy_for",
    "to_timeout",
]

OWN_HEADER_PREFIX = "x-llmroute-"
_USER_AGENT = f"llmroute/{__version__} (openai-compatible)"
# openai's private markers on a call's headers (raw responses, cast overrides): never sent.
_OPENAI_MARKERS = ("x-stainless-raw-response", "____stainless_override_cast_to")
# Headers that identify the caller: the cache's tenant namespace is a hash of their values.
_CREDENTIALS = frozenset(
    {"authorization", "api-key", "x-api-key", "openai-organization", "openai-project"}
)
log = logging.getLogger("llmroute")
_httpx_log = logging.getLogger("httpx")


def to_timeout(value: object) -> httpx.Timeout:
    """openai's timeout forms (float, None, httpx or httpx2 Timeout) as an ``httpx.Timeout``."""
    if value is None:
        return httpx.Timeout(None)
    if isinstance(value, int | float):
        return httpx.Timeout(float(value))
    if isinstance(value, httpx.Timeout):
        return value
    fields = ("connect", "read", "write", "pool")
    if all(hasattr(value, f) for f in fields):
        return httpx.Timeout(**{f: getattr(value, f) for f in fields})
    raise TypeError(f"timeout must be a number, None or a Timeout, not {type(value).__name__}")


def openai_http(
    base_url: httpx.URL, timeout: Any, *, transport: httpx.AsyncBaseTransport, verify: Any
) -> httpx.AsyncClient:
    """The ``httpx.AsyncClient`` openai's machinery sends with: over ``transport``
    (llmroute's), or, when the environment sets a proxy for ``base_url``, httpx's own with the
    proxy."""
    proxy = proxy_for(base_url)
    if proxy is None:
        return httpx.AsyncClient(transport=transport, timeout=timeout, follow_redirects=True)
    log.warning(
        "A proxy is configured for %s: requests go through httpx's own transport "
        "and the proxy, without llmroute's stream resets and per-stream deadlines",
        base_url.host,
    )
    from .transport import make_ssl_context

    return httpx.AsyncClient(proxy=proxy, verify=make_ssl_context(verify), timeout=timeout)


def proxy_for(url: httpx.URL) -> str | None:
    """The proxy the environment (HTTPS_PROXY, ALL_PROXY, NO_PROXY, ...) sets for ``url``."""
    proxies = urllib.request.getproxies_environment()
    if not proxies or url.host in ("localhost", "::1") or url.host.startswith("127."):
        return None
    if urllib.request.proxy_bypass_environment(url.host, proxies):  # type: ignore[attr-defined]
        return None
    return proxies.get(url.scheme) or proxies.get("all")


def check_base_url(base_url: object) -> httpx.URL:
    url = httpx.URL(str(base_url))
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"base_url must be an http:// or https:// URL, got {str(base_url)!r}")
    if not url.raw_path.endswith(b"/"):
        url = url.copy_with(raw_path=url.raw_path + b"/")
    return url


def merge_headers(headers: dict[str, str], extra: Mapping[str, Any] | None) -> dict[str, str]:
    """``headers`` with a call's own headers applied (``None`` or a sentinel removes one),
    without llmroute's ``x-llmroute-*`` settings and openai's private markers."""
    for name, value in (extra or {}).items():
        if value is None or not isinstance(value, str):
            for key in [k for k in headers if k.lower() == name.lower()]:
                del headers[key]
        else:
            for key in [k for k in headers if k.lower() == name.lower() and k != name]:
                del headers[key]
            headers[name] = value
    for name in list(headers):
        lower = name.lower()
        if lower.startswith(OWN_HEADER_PREFIX) or lower in _OPENAI_MARKERS:
            del headers[name]
    return headers


def credentials(headers: Mapping[str, str]) -> list[str]:
    """The headers that say who is asking, as ``name=value`` strings in a fixed order."""
    return sorted(f"{k.lower()}={v}" for k, v in headers.items() if k.lower() in _CREDENTIALS)


def encode_body(body: Mapping[str, Any]) -> bytes:
    """The JSON bytes of a request body; :class:`RequestBodyError` if it has none."""
    try:
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    except RecursionError:
        raise RequestBodyError(
            "The request body is nested too deeply to be encoded as JSON"
        ) from None
    except (ValueError, TypeError) as exc:  # a circular reference, a number too long, an object
        raise RequestBodyError(f"The request body cannot be encoded as JSON: {exc}") from None


OFF_LOOP_BYTES = 64 * 1024
"""A call whose body (as a server received it) has at least this many bytes has each attempt's
body translated and encoded in a worker thread (:meth:`Upstream.sender`'s ``off_loop``): at 4
MiB the encoding alone takes about 50 ms of CPU, which on the event loop every other stream
would wait for, once per attempt."""
OFF_LOOP_THREADS = 2
"""Worker threads encoding large bodies at once: more only contend for the GIL with the loop."""


class _NoCookies(http.cookiejar.DefaultCookiePolicy):
    """A cookie policy that stores and sends no cookie."""

    def set_ok(self, cookie: http.cookiejar.Cookie, request: Any) -> bool:
        return False

    def return_ok(self, cookie: http.cookiejar.Cookie, request: Any) -> bool:
        return False


def no_cookies() -> http.cookiejar.CookieJar:
    """A cookie jar that keeps nothing: an upstream's Set-Cookie from one call (one tenant's)
    never rides on the next."""
    return http.cookiejar.CookieJar(policy=_NoCookies())


@contextlib.contextmanager
def body_errors() -> Iterator[None]:
    """A call whose body cannot be encoded (openai's machinery encodes a call that is not
    routed) raises :class:`RequestBodyError`, as a routed one does, not a bare RecursionError;
    openai's bare ``Connection error.`` names its cause, as a routed call's does."""
    try:
        yield
    except APIConnectionError as exc:  # openai's bare "Connection error.", with its cause named
        better = explained(exc)
        if better is None:
            raise
        raise better from exc.__cause__
    except RecursionError:
        raise RequestBodyError(
            "The request body is nested too deeply to be encoded as JSON"
        ) from None
    except ValueError as exc:
        if "circular reference" not in str(exc).lower():
            raise
        raise RequestBodyError(f"The request body cannot be encoded as JSON: {exc}") from None


@functools.lru_cache(maxsize=256)
def _endpoint(base_url: httpx.URL, path: str) -> httpx.URL:
    """``path`` joined to a provider's base URL (joined and parsed once, not per request)."""
    return base_url.join(path)


class _TimedBody(httpx.AsyncByteStream):
    """A response body that sets the response's ``elapsed`` when it is closed, as httpx's
    client does for the responses it sends."""

    def __init__(self, body: httpx.AsyncByteStream, response: httpx.Response, start: float):
        self._body = body
        self._response = response
        self._start = start

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._body:
            yield chunk

    async def aclose(self) -> None:
        self._response.elapsed = datetime.timedelta(seconds=time.perf_counter() - self._start)
        await self._body.aclose()


class Upstream:
    """Builds and sends the requests of routed calls to their targets' providers.

    ``providers`` is the client's table (shared with its copies, so providers added at run time
    are seen); ``http`` is an ``httpx.AsyncClient`` on llmroute's transport, ``transport``
    (when given) that transport itself: requests sent with ``http`` go to it directly, without
    the client's auth, redirect, cookie and hook machinery, which a routed request never uses
    (``http`` keeps no cookies, follows no redirects and has neither auth nor hooks).
    """

    def __init__(
        self,
        providers: Mapping[str, ResolvedProvider],
        http: httpx.AsyncClient,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.providers = providers
        self.http = http
        self.transport = transport
        self._encoders: anyio.CapacityLimiter | None = None  # made in the loop, when needed

    def provider_headers(self, provider: ResolvedProvider) -> dict[str, str]:
        """The headers every request to ``provider`` carries: its key and configured headers."""
        return adapter_for(provider.spec.protocol).headers(
            provider.api_key, user_agent=_USER_AGENT, configured=provider.headers
        )

    def build(
        self,
        provider: ResolvedProvider,
        path: str,
        body: Mapping[str, Any] | bytes,
        *,
        headers: Mapping[str, Any] | None,
        query: Mapping[str, object] | None,
        timeout: httpx.Timeout,
        continuation: bool = False,
        http: Any = None,
    ) -> httpx.Request:
        """The request for ``path`` (relative to the provider's base URL) with ``body`` (or
        its JSON already encoded, :func:`encode_body`); ``http``: the caller's own
        ``httpx``/``httpx2`` client to build (and send) it with."""
        base_url = provider.base_url
        if continuation and provider.spec.continuation and provider.spec.continuation.base_url:
            base_url = check_base_url(provider.spec.continuation.base_url)
        sent = merge_headers(self.provider_headers(provider), headers)
        url = _endpoint(base_url, path)
        return (http or self.http).build_request(
            "POST",
            url if http is None else str(url),  # the caller's client may be an httpx2 one
            content=body if isinstance(body, bytes) else encode_body(body),
            headers=sent,
            params=dict(query) if query else None,  # type: ignore[arg-type]
            # Plain values: the caller's client may be an httpx2 one.
            timeout=(timeout.connect, timeout.read, timeout.write, timeout.pool),
        )

    def sender(
        self,
        *,
        headers: Mapping[str, Any] | None,
        query: Mapping[str, object] | None,
        timeout: httpx.Timeout,
        path: str = "chat/completions",
        http: Any = None,
        trace: Any = None,
        off_loop: bool = False,
    ) -> Sender:
        """The engine's :data:`Sender` for one call: the call's own headers, query and timeout
        on every attempt, translated for each target's protocol; with the call's ``trace``
        (``metrics._traceparent.RequestTrace``), each attempt's own ``traceparent``;
        ``off_loop``: each attempt's body translated and encoded in a worker thread (a large
        body, :data:`OFF_LOOP_BYTES`), at most :data:`OFF_LOOP_THREADS` at a time."""

        def wire(target: RouteTarget, body: dict[str, Any]) -> tuple[str, bytes]:
            where, sent_body = adapter_for(target.protocol).wire_request(
                path, body, target=target.name
            )
            return where, encode_body(sent_body)

        async def send(
            target: RouteTarget, body: dict[str, Any], *, stream: bool, continuation: bool
        ) -> tuple[httpx.Response, Timings]:
            if off_loop:
                if self._encoders is None:
                    self._encoders = anyio.CapacityLimiter(OFF_LOOP_THREADS)
                where, content = await anyio.to_thread.run_sync(
                    wire, target, body, limiter=self._encoders
                )
            else:
                where, content = wire(target, body)
            record = SENDING.get() if trace is not None else None
            sent = headers if trace is None else trace.attempt(record, target.name, headers)
            request = self.build(
                self.providers[target.provider],
                where,
                content,
                headers=sent,
                query=query,
                timeout=timeout,
                continuation=continuation,
                http=http,
            )
            if trace is None:
                return await self.send(request, read_body=not stream, http=http)
            try:
                response, timings = await self.send(request, read_body=not stream, http=http)
            except BaseException:
                trace.failed(sent)
                raise
            if record is not None:  # a hedge that loses keeps the id of its request too
                record.request_id = vendor_request_id(target, response.headers)
            return response, timings

        return send

    async def send(
        self, request: httpx.Request, *, read_body: bool, http: Any = None
    ) -> tuple[httpx.Response, Timings]:
        """Send once: the response (streaming unless ``read_body``) and its timings; an error
        status raises openai's status error."""
        started = time.monotonic()
        with map_transport_errors(request):
            if http is None and self.transport is not None and not request.url.userinfo:
                response = await self._send_direct(request, self.transport)
            else:
                response = await (http or self.http).send(request, stream=True)
        timings = response_timings(response, started)
        if response.status_code >= 400:
            try:
                with map_transport_errors(request):
                    raw = await response.aread()
            finally:
                await response.aclose()
            raise make_status_error(response, raw)
        if read_body:
            try:
                with map_transport_errors(request):
                    await response.aread()
            finally:
                await response.aclose()
            timings.first_byte = timings.first_token = timings.total = time.monotonic() - started
        return response, timings

    async def _send_direct(
        self, request: httpx.Request, transport: httpx.AsyncBaseTransport
    ) -> httpx.Response:
        """``request`` on llmroute's transport, with what httpx's client would do around it."""
        if self.http.is_closed:
            raise RuntimeError("Cannot send a request, as the client has been closed.")
        start = time.perf_counter()
        try:
            response = await transport.handle_async_request(request)
        except httpx.RequestError as exc:
            exc.request = request
            raise
        response.request = request
        response.stream = _TimedBody(cast(httpx.AsyncByteStream, response.stream), response, start)
        response.default_encoding = self.http._default_encoding  # pyright: ignore[reportPrivateUsage]
        if _httpx_log.isEnabledFor(logging.INFO):
            _httpx_log.info(
                'HTTP Request: %s %s "%s %d %s"',
                request.method,
                request.url,
                response.http_version,
                response.status_code,
                response.reason_phrase,
            )
        return response
