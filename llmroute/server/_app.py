"""The gateway's raw ASGI app: OpenAI's HTTP API in front of one routed ``AsyncOpenAI``."""

from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import math
import os
import re
import time
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

import anyio
import openai
import pydantic
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent

from .._client import NOT_ROUTED, AsyncOpenAI
from .._config import Config, ConfigError, GatewaySettings, load_config
from .._errors import AllTargetsFailed, RequestBodyError, StreamInterrupted
from .._model_names import suggest_route
from .._sizes import format_size
from .._timeouts import (
    BETWEEN_TOKENS_HEADER,
    CONNECT_HEADER,
    FIRST_TOKEN_HEADER,
    TimeoutHeaderError,
    request_timeouts,
)
from .._types import RouteReport
from .._upstream import no_cookies, to_timeout
from ..cache import NAMESPACE_PATTERN
from ..metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from ..metrics._traceparent import REQUEST_ID_HEADER, TRACEPARENT, TRACESTATE
from ..routing.engine import prompt_messages
from ..routing.goal import TTFT_TARGET_HEADER
from ..routing.health import failure_party
from ..routing.seam import REASONING_FIELDS
from ..routing.stats import estimate_prompt_tokens
from ..routing.windows import answer_room
from ._admin import AdminError, KeysAdmin
from ._admission import Admission, Ticket, usage_increments
from ._alerts import SoftLimits
from ._auth import KeyRing
from ._keystore import FileKeyStore, KeyStore, RedisKeyStore, StoreConflict, StoreUnavailable
from ._limits import Alert, Refusal
from ._live import LIVE_FILES, PAGE_HEADERS, LivePage, LiveView, since_of
from ._metrics import ANONYMOUS, GatewayMetrics
from ._secrets import masked_forms, provider_secrets, scrub
from ._slo import Objective, SloTracker
from ._tenants import Managed, Tenant, Tenants, file_stamp
from ._usage import fleet_exposition, usage_report
from ._usage import new_usage as _new_usage
from ._validate import InvalidField, check, load, shown

__all__ = ["GatewayApp", "dump_json", "group_namespace", "key_namespace"]

log = logging.getLogger("llmroute.server")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_CHAT = "/v1/chat/completions"
_COMPLETIONS = "/v1/completions"
_EMBEDDINGS = "/v1/embeddings"
_RESPONSES = "/v1/responses"
_MODELS = "/v1/models"
_ADMIN_USAGE = "/admin/usage"
_ADMIN_KEYS = "/admin/keys"
_ADMIN_KEYS_UNDER = ("/admin/keys/", "/admin/teams/")
_ADMIN_TEAMS = "/admin/teams"
_LIVE = "/admin/live"
_LIVE_DATA = "/admin/live/data"
_SINCE_HEADER = "x-llmroute-live-since"
_NO_STORE = {"cache-control": "no-store"}  # on an admin path's 401 and 403
_POSTS = {_CHAT: "messages", _COMPLETIONS: "prompt", _EMBEDDINGS: "input", _RESPONSES: "input"}
_KINDS = {
    _CHAT: "chat",
    _COMPLETIONS: "completions",
    _EMBEDDINGS: "embeddings",
    _RESPONSES: "responses",
}
# Headers a gateway client may set for the cache, the timeouts (checked first) and its latency
# goal; nothing else it sends goes upstream. Its x-llmroute-timeout-total the gateway keeps.
_FORWARDED = (
    "x-llmroute-cache",
    "x-llmroute-cache-replay",
    CONNECT_HEADER,
    FIRST_TOKEN_HEADER,
    BETWEEN_TOKENS_HEADER,
    TTFT_TARGET_HEADER,
)
_NAMESPACE_HEADER = "x-llmroute-cache-namespace"
TIER_HEADER = "x-llmroute-tier"
"""The answer's header naming the tier (route) a tiered model name's request went to."""
TARGET_HEADER = "x-llmroute-target"
"""The answer's header naming the target that gave it (``cache`` for a replay)."""
_LOG_UNSAFE = re.compile(r"[^\w.:/+=-]")  # a vendor's request id, as the access log shows it
_CLOSE_TIMEOUT = 5.0  # seconds a cancelled upstream stream may take to close
_REDACTED = "[redacted]"
_DRAIN_BYTES = 16 * 2**20  # a refused body up to this size is read to its end before the 413
_DRAIN_SECONDS = 5.0
_UPSTREAM_AUTH = (401, 403, 407)
_ROUTABLE = {_CHAT: "/chat/completions", _RESPONSES: "/responses"}  # handed to the dispatch
_POSTED: dict[str, tuple[type, Any]] = {
    _CHAT: (ChatCompletion, ChatCompletionChunk),
    _RESPONSES: (Response, ResponseStreamEvent),  # an annotated union, as openai builds it
}
"""The answer's type and its stream event's type, for a routable call posted as it is."""


def dump_json(model: pydantic.BaseModel) -> bytes:
    """An ``openai.types`` object as the JSON it came from: the fields it was built with
    (``exclude_unset``: none invented), the vendor's unknown fields kept, API names used."""
    return model.model_dump_json(by_alias=True, exclude_unset=True, warnings=False).encode()


def _named_event(event: pydantic.BaseModel) -> bytes:
    """A Responses API stream event on the wire: ``event: <type>`` and its JSON."""
    kind = getattr(event, "type", None)
    named = isinstance(kind, str) and kind.isprintable()
    head = b"event: " + kind.encode() + b"\n" if named else b""  # type: ignore[union-attr]
    return head + b"data: " + dump_json(event) + b"\n\n"


def group_namespace(group: str) -> str:
    """The cache namespace of a ``cache_groups`` group: ``gateway-group.<group>``, or
    ``gateway-group-`` and 40 hex digits of its SHA-256 when too long (no key's namespace can
    be either)."""
    namespace = f"gateway-group.{group}"
    if NAMESPACE_PATTERN.fullmatch(namespace):
        return namespace
    return "gateway-group-" + hashlib.sha256(group.encode()).hexdigest()[:40]


def _retry_after(headers: Mapping[str, str], cap: float, now: float) -> dict[str, str]:
    """An upstream's ``retry-after-ms`` / ``retry-after`` (seconds or an HTTP date) as the
    gateway's own two headers, capped at ``cap`` seconds; none when neither is a valid time."""
    seconds: float | None = None
    try:
        seconds = float(headers.get("retry-after-ms", "")) / 1000
    except ValueError:
        text = headers.get("retry-after", "").strip()
        try:
            seconds = float(text)
        except ValueError:
            try:
                seconds = email.utils.parsedate_to_datetime(text).timestamp() - now
            except (TypeError, ValueError, IndexError, OverflowError):
                seconds = None
    if seconds is None or not math.isfinite(seconds):
        return {}
    seconds = min(max(seconds, 0.0), cap)
    return {"retry-after": str(math.ceil(seconds)), "retry-after-ms": str(int(seconds * 1000))}


def _refuse_cookies(client: object) -> None:
    """Give the client's HTTP client a cookie jar that keeps nothing: an upstream's Set-Cookie
    for one tenant's request must not ride on the next tenant's."""
    http_client = getattr(client, "_client", None)
    if http_client is not None and hasattr(http_client, "cookies"):
        http_client.cookies = no_cookies()  # routed calls keep none already


def key_namespace(name: str) -> str:
    """The cache namespace of a gateway key's answers (``cache_namespace_per_key``):
    ``gateway.<name>``, or, for a name too long for a namespace's 64 characters,
    ``gateway-`` and 40 hex digits of its SHA-256 (no ``gateway.<name>`` can be that)."""
    namespace = f"gateway.{name}"
    if NAMESPACE_PATTERN.fullmatch(namespace):
        return namespace
    return "gateway-" + hashlib.sha256(name.encode()).hexdigest()[:40]


def _error(message: str, type_: str, code: str | None = None, param: str | None = None) -> Any:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class _Refused(Exception):
    """An answer decided before the routing: status, OpenAI error body, extra headers."""

    def __init__(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = dict(headers or {})


class _Stalled(Exception):
    """The client did not take a write within ``write_timeout``."""


class _TotalTimeout(Exception):
    """The request's total timeout (its route's ``total_timeout`` or its own header) passed."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"The answer did not end within the total timeout of {seconds:g} s.")
        self.message = str(self)


class _Exchange:
    """One request's state: its id, key name, status sent and whether the client left."""

    __slots__ = (
        "counted",
        "failed",
        "finished",
        "first",
        "gone",
        "headers",
        "key",
        "label",
        "query",
        "report",
        "request_id",
        "revoked",
        "send",
        "since",
        "stalled",
        "started",
        "status",
        "tenant",
        "tenants",
        "ticket",
        "write_timeout",
    )

    def __init__(self, send: Send, label: str, write_timeout: float) -> None:
        self.send = send
        self.label = label
        self.key = ANONYMOUS
        self.query = b""  # the URL's query string (only the admin API reads one)
        self.tenant: Tenant | None = None
        self.tenants: Tenants | None = None  # the keys it was authenticated by
        self.headers: dict[str, str] = {}
        """Sent with the answer whatever it is (the key's x-ratelimit-* headers)."""
        self.started = 0.0  # when the answer's headers were sent (monotonic)
        self.first = 0.0  # when its first chunk (or the whole answer) began to be written
        self.failed = False  # a stream that ended with an error event
        self.counted = False  # in its key's usage, by the answer's accounting (_settle)
        self.revoked = False  # the key was revoked on a reload, and its streams cut
        self.status = 0
        self.gone = False
        self.stalled = False
        self.finished = False
        self.write_timeout = write_timeout
        self.ticket: Ticket | None = None  # the key's slot and counts this request holds
        self.since = 0.0  # when the chunk being written began to be, 0.0: none is
        self.request_id = f"gw-{uuid.uuid4().hex}"
        self.report: RouteReport | None = None  # a routed call's: its trace and upstream ids

    async def start(self, status: int, content_type: str, headers: Mapping[str, str]) -> None:
        self.status = status
        self.started = time.monotonic()
        # One line per header: the answer's own replace the exchange's (an admin path's
        # cache-control is both).
        extra = {**self.headers, **headers} if self.headers and headers else self.headers or headers
        raw = [
            (b"content-type", content_type.encode()),
            (b"x-request-id", self.request_id.encode()),
            *((k.encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()),
        ]
        await self.send({"type": "http.response.start", "status": status, "headers": raw})

    async def chunk(self, data: bytes) -> None:
        """One chunk of a streamed answer. Its write is timed by the request's watcher
        (:func:`_watch`), which costs nothing per chunk, unlike a cancel scope per write."""
        self.since = time.monotonic()
        if not self.first:
            self.first = self.since
        await self.send({"type": "http.response.body", "body": data, "more_body": True})
        self.since = 0.0

    async def body(self, data: bytes, *, more: bool = False) -> None:
        if not more:
            self.finished = True
        with anyio.move_on_after(self.write_timeout) as waited:
            await self.send({"type": "http.response.body", "body": data, "more_body": more})
        if waited.cancelled_caught:
            # The client stopped reading: the response is cut (an HTTP/2 stream is reset, an
            # HTTP/1.1 connection closed) and, through the caller, the upstream cancelled.
            self.gone = self.stalled = True
            raise _Stalled()

    async def whole(
        self,
        status: int,
        data: bytes,
        content_type: str = "application/json",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        await self.start(status, content_type, headers or {})
        self.first = self.started
        await self.body(data)


class GatewayApp:
    """An ASGI app serving OpenAI's API (``/v1/chat/completions`` streamed or not,
    ``/v1/completions``, ``/v1/embeddings``, ``/v1/models``) plus ``/health`` and ``/metrics``,
    with one :class:`llmroute.AsyncOpenAI` built from ``config`` behind it, so every request
    gets the routing and the cache.

    ``/v1/*`` (and ``/metrics`` unless ``metrics_public``) need one of the gateway's keys as
    ``Authorization: Bearer <key>``; that header is never sent upstream, and the upstream keys
    never appear in a response or a log line. ``client_options`` go to ``AsyncOpenAI`` (e.g.
    ``verify``, ``max_retries``, ``timeout``). Raises :class:`~llmroute.ConfigError` when the
    config or a gateway key is missing.
    """

    def __init__(
        self,
        config: Config | Mapping[str, Any] | str | os.PathLike[str] | None,
        *,
        environ: Mapping[str, str] = os.environ,
        **client_options: Any,
    ) -> None:
        loaded = load_config(config)
        if loaded is None:
            raise ConfigError(
                "the gateway needs a config with routes: pass --config or set LLMROUTE_CONFIG "
                "(llmroute serve --simulator serves simulated providers without one)"
            )
        self.config = loaded
        self.settings = loaded.gateway or GatewaySettings()
        self._environ = environ
        self._store, self._managed = _key_store(loaded)
        self.tenants = Tenants.load(loaded, environ, self._managed)
        self._namespaces = _namespaces(self.settings, self.tenants.names)
        self.client = AsyncOpenAI(config=loaded, **client_options)  # its simulators start
        resolved = self.client._llmroute.resolved
        # The upstream keys and the values of the providers' credential headers (api-key, ...).
        self._secrets = provider_secrets(resolved.providers.values())
        self._masked = masked_forms(self._secrets)  # as vendors echo them: sk-...abcd
        _refuse_cookies(self.client)
        self._timeout = to_timeout(self.client.timeout)  # every routed call's, as the seam's
        self.metrics = GatewayMetrics()
        self.metrics.keys.set(len(self.tenants.names))
        self.slo = SloTracker(self.metrics.registry)
        self._route_slos = {
            route: Objective(o.ttft_ms, o.percentile) for route, o in self.settings.slos.items()
        }
        self.routes = [*loaded.models, *loaded.tiered]
        self._created = int(time.time())
        self.clock: Callable[[], float] = time.time
        """When keys expire and rotated values stop (Unix seconds; a test may replace it)."""
        self.admission = Admission(self.settings, loaded.redis)
        self.soft_limits = SoftLimits(self.settings.soft_limit_webhook, self.metrics)
        self.keys_admin = KeysAdmin(
            loaded, self._store, lambda: self.tenants, lambda: self.clock(), self._apply_managed
        )
        self._scopes: dict[anyio.CancelScope, _Exchange] = {}
        self._usage: dict[str, dict[str, int]] = {}
        self._closing = False
        self._idle: anyio.Event | None = None  # set when the last request ends while draining
        self.live: LiveView | None = None
        """The live page's samples (``live_page = true``), else None."""
        self._live_page: LivePage | None = None
        if self.settings.live_page:
            self._live_page = LivePage()
            self.live = LiveView(
                loaded, self.client.stats, self.client.metrics, self.usage, self.slo.snapshot
            )

    @property
    def keys(self) -> KeyRing:
        """The keys accepted now (replaced on a reload)."""
        return self.tenants.ring

    # -- keys that change ---------------------------------------------------------------------

    def reload(self) -> bool:
        """Read the keys again (``keys_file`` and the environment): new keys are accepted, the
        settings of known ones replaced, and revoked keys refused from now on; their streams in
        flight finish or are cut (``revoked_streams``). On a mistake the keys stay as they were
        and the mistake is logged as a sentence. Call it from the server's event loop.
        Returns whether the keys were replaced."""
        return self._rebuild(counted=True)

    def _apply_managed(self, managed: Managed) -> None:
        """The admin API's keys and teams changed (here, or on another replica): accept them
        now."""
        if isinstance(self._store, RedisKeyStore):
            self._managed = managed
        self._rebuild(counted=False)

    def _rebuild(self, *, counted: bool) -> bool:
        try:
            newer = Tenants.load(self.config, self._environ, self._managed)
        except (ConfigError, ValueError) as exc:
            if counted:
                self.metrics.reloads.labels("error").inc()
            log.error("gateway keys not reloaded (the keys before stay): %s", exc)
            return False
        revoked = self.tenants.revoked_by(newer)
        self.tenants = newer
        self._namespaces = _namespaces(self.settings, newer.names)
        if counted:
            self.metrics.reloads.labels("ok").inc()
        self.metrics.keys.set(len(newer.names))
        log.info(
            "gateway keys %s: %d key(s)%s",
            "reloaded" if counted else "changed",
            len(newer.names),
            f"; revoked: {', '.join(sorted(revoked))}" if revoked else "",
        )
        for name in revoked:
            self.slo.forget(name)
        if revoked and self.settings.revoked_streams == "cut":
            for scope, exchange in list(self._scopes.items()):
                if exchange.key in revoked:
                    exchange.revoked = True
                    scope.cancel()
        return True

    def _revoked_since(self, exchange: _Exchange) -> bool:
        """Whether the request's key was revoked by a reload since it was authenticated, with
        ``revoked_streams = "cut"`` (its streams in flight were cut then, before it was one)."""
        before = exchange.tenants
        if before is None or before is self.tenants or self.settings.revoked_streams != "cut":
            return False
        return not before.kept(exchange.key, self.tenants)

    async def _watch_store(self) -> None:
        """With Redis: read the admin API's keys again whenever their version changes (checked
        every ``keys_sync_interval``), so a key made on another replica works here too."""
        store = self._store
        if not isinstance(store, RedisKeyStore):
            return
        down = False
        while True:
            await anyio.sleep(self.settings.keys_sync_interval)
            try:
                known = self._managed.version if self._managed is not None else None
                if await store.version() != known:
                    self._apply_managed(await store.load())
            except StoreUnavailable as exc:
                if not down:
                    log.warning("gateway keys: %s; the keys known stay until it answers", exc)
                down = True
                continue
            if down:
                log.info("gateway keys: the key store answers again")
            down = False

    async def _watch_keys(self) -> None:
        """Reload when ``keys_file`` changes (checked every ``keys_reload_interval``)."""
        path = self.settings.keys_file
        if path is None:
            return
        while True:
            await anyio.sleep(self.settings.keys_reload_interval)
            if file_stamp(path) != self.tenants.stamp:
                if not self.reload():
                    self.tenants.stamp = file_stamp(path)  # logged once, not every interval

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Requests being answered now (a stream counts until it ends)."""
        return len(self._scopes)

    async def drain(
        self, timeout: float, cut: Callable[[], Awaitable[object]] | None = None
    ) -> int:
        """Refuse new requests (503) and wait, up to ``timeout`` seconds or until ``cut``
        returns, for the requests in flight to end. Returns how many are still in flight (the
        caller then ends them with :meth:`begin_shutdown`)."""
        self._closing = True
        with anyio.move_on_after(timeout):
            async with anyio.create_task_group() as tg:
                if cut is not None:

                    async def cut_short() -> None:
                        await cut()
                        tg.cancel_scope.cancel()

                    tg.start_soon(cut_short)
                if self._scopes:
                    self._idle = anyio.Event()
                    await self._idle.wait()
                tg.cancel_scope.cancel()
        return len(self._scopes)

    def begin_shutdown(self) -> None:
        """Refuse new requests and end the streams in flight (their clients get an error event,
        their upstream streams are cancelled). Call it from the server's event loop."""
        self._closing = True
        for scope in list(self._scopes):
            scope.cancel()

    async def aclose(self) -> None:
        """End what is in flight and close the client (its connections and cache)."""
        self.begin_shutdown()
        await self.client.close()
        await self.admission.aclose()
        self.soft_limits.close()
        if self._store is not None:
            await self._store.aclose()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    with anyio.move_on_after(10):
                        try:
                            await self.client.warmup()
                        except Exception as exc:  # serving goes on; routing handles dead targets
                            log.warning(
                                "warmup: no target could be reached: %s", self._scrub(str(exc))
                            )
                    tg.start_soon(self._watch_keys)
                    tg.start_soon(self._watch_store)
                    tg.start_soon(self.soft_limits.run)
                    tg.start_soon(self.admission.run)
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    tg.cancel_scope.cancel()  # the keys' watch
                    break
        await self.aclose()
        await send({"type": "lifespan.shutdown.complete"})

    # -- dispatch -----------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        method: str = scope["method"]
        label = _label(path)
        exchange = _Exchange(send, label, self.settings.write_timeout)
        exchange.query = scope.get("query_string", b"")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        began = time.monotonic()
        try:
            try:
                await self._route(path, method, headers, exchange, receive)
            except _Refused as refused:
                await self._refuse(exchange, refused)
            except _Stalled:
                raise
            except Exception as exc:  # a bug: a 500 with a sentence, logged as one
                log.error(
                    "unexpected error answering %s %s: %s",
                    method,
                    label,
                    self._scrub(f"{type(exc).__name__}: {exc}"),
                )
                failed = _error("The gateway failed to answer.", "server_error")
                await self._refuse(exchange, _Refused(500, failed))
        except _Stalled:
            pass  # the response is cut; the server resets the stream or closes the connection
        finally:
            elapsed = time.monotonic() - began
            status = str(exchange.status or 499)
            self.metrics.requests.labels(exchange.key, label, status).inc()
            if label.startswith("/v1/") and not exchange.counted:
                self._count_call(exchange)
            self.metrics.duration.labels(label).observe(elapsed)
            log.info(
                "%s %s %s key=%s %.3fs %s%s%s",
                method,
                label,
                status,
                exchange.key,
                elapsed,
                exchange.request_id,
                _trace_ids(exchange.report),
                " (client went away)" if exchange.gone else "",
            )

    async def _route(
        self,
        path: str,
        method: str,
        headers: Mapping[str, str],
        exchange: _Exchange,
        receive: Receive,
    ) -> None:
        if path == "/health":
            _allow(method, "GET")
            await exchange.whole(200, json.dumps(self._health()).encode())
            return
        if path == "/metrics":
            _allow(method, "GET")
            if not self.settings.metrics_public:
                # Every key's figures are in it: with an admin key configured, a tenant's key
                # does not read them.
                if self.tenants.admins:
                    self._admin(headers, exchange, "read the metrics")
                else:
                    self._authenticate(headers, exchange)
            data = self.client.metrics.exposition() + self.metrics.exposition()
            fleet = await self.admission.fleet_usage()
            if fleet is not None:
                data += fleet_exposition(fleet)
            # No label can carry an upstream key, whole or masked, whatever an upstream said.
            data = self._scrub(data.decode()).encode()
            await exchange.whole(200, data, METRICS_CONTENT_TYPE)
            return
        if path.startswith("/admin/"):
            exchange.headers["cache-control"] = "no-store"  # answers with secrets, 401s too
        if path == _ADMIN_USAGE:
            _allow(method, "GET")
            self._admin(headers, exchange, "read usage")
            scope = _usage_scope(exchange.query)
            await exchange.whole(200, json.dumps(await self.usage(scope)).encode())
            return
        if path in (_ADMIN_KEYS, _ADMIN_TEAMS) or path.startswith(_ADMIN_KEYS_UNDER):
            await self._keys_api(path, method, headers, exchange, receive)
            return
        if self._live_page is not None and path.startswith(_LIVE):
            await self._live(path, method, headers, exchange)
            return
        if not path.startswith("/v1/"):
            raise _Refused(404, _error(f"Unknown request URL: {path}", "invalid_request_error"))
        self._authenticate(headers, exchange)
        if self._closing:
            raise _Refused(503, _error("The gateway is shutting down.", "server_error"))
        await self._v1(path, method, headers, exchange, receive)

    async def _keys_api(
        self,
        path: str,
        method: str,
        headers: Mapping[str, str],
        exchange: _Exchange,
        receive: Receive,
    ) -> None:
        """``/admin/keys`` and ``/admin/teams`` (llmroute/server/_admin.py), for admin keys."""
        self._admin(headers, exchange, "manage keys")

        async def body() -> Any:
            return await self._read_json(headers, exchange, receive, allow_empty=True)

        try:
            status, answer = await self.keys_admin.handle(method, path, body)
        except AdminError as error:
            allow = getattr(error, "allow", None)
            raise _Refused(
                error.status,
                _error(error.message, "invalid_request_error", error.code, error.param),
                {"allow": allow} if allow else None,
            ) from None
        except (StoreUnavailable, StoreConflict) as exc:
            raise _Refused(
                503,
                _error(
                    f"The keys cannot be changed now: {exc}.",
                    "server_error",
                    "key_store_unavailable",
                ),
                {"retry-after": "1", "retry-after-ms": "1000"},
            ) from None
        if method != "GET":
            action = _key_action(method, path)
            self.metrics.key_changes.labels(action).inc()
            changed = answer.get("name") if isinstance(answer, dict) else None
            log.info("gateway keys: %s by key=%s: %s", action, exchange.key, changed)
        await exchange.whole(status, json.dumps(answer).encode())

    async def _live(
        self, path: str, method: str, headers: Mapping[str, str], exchange: _Exchange
    ) -> None:
        """The live page: its static files to anyone (they hold no data), its data to an admin
        key only (given in ``Authorization``, never in the URL)."""
        assert self._live_page is not None and self.live is not None
        _allow(method, "GET")
        if path == _LIVE_DATA:
            self._admin(headers, exchange, "read the live page's data")
            since = since_of(headers.get(_SINCE_HEADER, ""))
            data = json.dumps(await self.live.data(since)).encode()
            await exchange.whole(200, self._scrub(data.decode()).encode(), headers=PAGE_HEADERS)
            return
        found = self._live_page.files.get(path)
        if found is None:
            raise _Refused(404, _error(f"Unknown request URL: {path}", "invalid_request_error"))
        await exchange.whole(200, found[0], found[1], PAGE_HEADERS)

    def _admin(self, headers: Mapping[str, str], exchange: _Exchange, what: str) -> Tenant:
        """The request's tenant if its key is an admin's; else 401 (no key) or 403, neither
        kept by a cache on the way."""
        try:
            tenant = self._authenticate(headers, exchange)
        except _Refused as refused:
            refused.headers.update(_NO_STORE)
            raise
        if not tenant.settings.admin:
            raise _Refused(
                403,
                _error(
                    f"This key may not {what} (only a key with admin = true may).",
                    "invalid_request_error",
                    "permission_denied",
                ),
                _NO_STORE,
            )
        return tenant

    async def _enter(
        self,
        exchange: _Exchange,
        model: str,
        estimate: Callable[[], int],
        work: Callable[[], Awaitable[None]],
    ) -> None:
        """Run ``work`` in one of the key's slots (its ``max_concurrency``), counted in its
        limits (its own, its team's, the model's), or refuse (429; 503 without Redis)."""
        key = exchange.key
        tenant = exchange.tenant
        assert tenant is not None
        decided = await self.admission.enter(tenant, model, estimate)
        if isinstance(decided, Refusal):
            self.metrics.rejections.labels(key, decided.reason).inc()
            raise _Refused(
                decided.status, _error(decided.message, decided.type, decided.code), decided.headers
            )
        self.metrics.in_flight.labels(key).inc()
        exchange.ticket = decided
        exchange.headers.update(decided.headers)
        self._alerted(decided.alerts)
        try:
            await work()
        finally:
            exchange.ticket = None
            self.metrics.in_flight.labels(key).dec()

    async def _v1(
        self,
        path: str,
        method: str,
        headers: Mapping[str, str],
        exchange: _Exchange,
        receive: Receive,
    ) -> None:
        tenant = exchange.tenant
        assert tenant is not None
        if path == _MODELS:
            _allow(method, "GET")
            data = [self._model(name) for name in self.routes if tenant.may_use(name)]
            await exchange.whole(200, json.dumps({"object": "list", "data": data}).encode())
            return
        if path.startswith(_MODELS + "/"):
            _allow(method, "GET")
            name = path[len(_MODELS) + 1 :]
            if name not in self.routes or not tenant.may_use(name):
                raise _model_not_found(name, self._usable(tenant))
            await exchange.whole(200, json.dumps(self._model(name)).encode())
            return
        if path not in _POSTS:
            raise _Refused(
                404, _error(f"Unknown request URL: {method} {path}", "invalid_request_error")
            )
        _allow(method, "POST")
        # The body is read (within body_timeout) before the key's slot is taken: a client
        # trickling its body holds no slot.
        body = await self._read_json(headers, exchange, receive)
        required = _POSTS[path]
        model = body.get("model")
        if "model" not in body:
            raise _missing("model")
        if not isinstance(model, str) or not model:
            raise _invalid_field(
                InvalidField(
                    "model",
                    "Invalid 'model': expected a model name (a non-empty string).",
                    "invalid_type",
                )
            )
        if required not in body:
            raise _missing(required)
        try:
            check(_KINDS[path], body)
        except InvalidField as invalid:
            self.metrics.rejections.labels(exchange.key, "invalid_request").inc()
            raise _invalid_field(invalid) from None
        if model not in self.routes and self.config.default_provider is None:
            raise _model_not_found(model, self._usable(tenant))
        self._permit(tenant, model, body, exchange)
        self._max_tokens(tenant, path, body, exchange)
        if tenant.settings.ttft_target_ms is not None and path in _ROUTABLE:
            _default_goal(body, headers, tenant.settings.ttft_target_ms)
        try:
            own = request_timeouts(headers)
        except TimeoutHeaderError as exc:
            self.metrics.rejections.labels(exchange.key, "invalid_request").inc()
            raise _Refused(
                400, _error(str(exc), "invalid_request_error", "invalid_value", exc.header)
            ) from None
        total = own.total
        if total is None and model in self.routes:
            tiered = self.config.tiered.get(model)  # a tiered name: its default tier's
            total = self.config.models[tiered.default if tiered else model].total_timeout
        extra_headers = self._upstream_headers(headers, exchange)
        if path in _ROUTABLE and model in self.routes:  # on its route report and span
            extra_headers[REQUEST_ID_HEADER] = exchange.request_id

        kind = _KINDS[path]

        def estimate() -> int:
            return _prompt_estimate(body, kind) + answer_room(body, kind)

        async def work() -> None:
            tally = _Tally(body, kind)
            admitted = time.monotonic()
            try:
                await self._answer(path, body, extra_headers, exchange, receive, total, tally)
            finally:
                self._objectives(tenant, model, exchange, admitted)
                assert exchange.ticket is not None
                await self._settle(exchange, exchange.ticket, tally)

        await self._enter(exchange, model, estimate, work)

    def _usable(self, tenant: Tenant) -> list[str]:
        """The routes ``tenant`` may use: the only names its 404 may suggest (a key limited to
        some models is never told the name of another)."""
        return [name for name in self.routes if tenant.may_use(name)]

    def _objectives(self, tenant: Tenant, model: str, exchange: _Exchange, admitted: float) -> None:
        """Whether the request met the key's and the route's latency objectives."""
        route = self._route_slos.get(model)
        own = tenant.settings.slo_ttft_ms
        if route is None and own is None:
            return
        ttft = exchange.first - admitted if exchange.first else None
        if exchange.gone and ttft is None:
            return  # the client left before its first token: not the gateway's miss
        ok = exchange.status == 200 and not exchange.failed
        mine = Objective(own, tenant.settings.slo_percentile) if own is not None else None
        self.slo.observe(exchange.key, model, ttft, ok, key_objective=mine, route_objective=route)

    def _permit(
        self, tenant: Tenant, model: str, body: Mapping[str, Any], exchange: _Exchange
    ) -> None:
        """404 for a model name the key may not use, as if it did not exist; also for a tier
        forced with ``llmroute.tier`` whose route the key may not use."""
        if tenant.settings.models is None:
            return
        if not tenant.may_use(model):
            self.metrics.rejections.labels(exchange.key, "model").inc()
            raise _model_not_found(model, self._usable(tenant))
        options = body.get("llmroute")
        forced = options.get("tier") if isinstance(options, Mapping) else None
        tiered = self.config.tiered.get(model)
        if isinstance(forced, str) and tiered is not None:
            route = tiered.tiers.get(forced, forced)
            if route in self.config.models and not tenant.may_use(route):
                self.metrics.rejections.labels(exchange.key, "model").inc()
                raise _model_not_found(route)

    def _max_tokens(
        self, tenant: Tenant, path: str, body: dict[str, Any], exchange: _Exchange
    ) -> None:
        """The key's ``max_tokens``: a request asking for more is refused (400, naming the
        field); one naming no limit gets the key's ``default_max_tokens``."""
        if path == _EMBEDDINGS:
            return
        settings = tenant.settings
        fields = _LIMIT_FIELDS[path]
        named = [f for f in fields if f in body and body[f] is not None]
        if settings.max_tokens is not None:
            for field_name in named:
                value = body[field_name]
                if isinstance(value, int) and value > settings.max_tokens:
                    self.metrics.rejections.labels(exchange.key, "max_tokens").inc()
                    raise _Refused(
                        400,
                        _error(
                            f"Invalid '{field_name}': {shown(value)} is above this key's limit of "
                            f"{settings.max_tokens} tokens.",
                            "invalid_request_error",
                            "invalid_value",
                            field_name,
                        ),
                    )
        if not named and settings.default_max_tokens is not None:
            body[fields[-1]] = settings.default_max_tokens

    async def _settle(self, exchange: _Exchange, ticket: Ticket, tally: _Tally) -> None:
        """Count what the answer used: the key's usage (this replica's, and the fleet's with
        Redis), its slot freed and its limits corrected to it."""
        prompt, completion = tally.used()
        usage = self._usage.setdefault(exchange.key, _new_usage())
        exchange.counted = True
        failed = (
            exchange.status >= 400
            or exchange.failed
            or (exchange.status == 0 and not exchange.gone)
        )
        added = {
            "requests": 1,
            "errors": int(failed),
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "cache_hits": int(tally.cache_hit),
        }
        for name, value in added.items():
            usage[name] += value
        if tally.cache_hit:
            self.metrics.cache_hits.labels(exchange.key).inc()
        if prompt:
            self.metrics.tokens.labels(exchange.key, "prompt").inc(prompt)
        if completion:
            self.metrics.tokens.labels(exchange.key, "completion").inc(completion)
        alerts = await self.admission.leave(ticket, prompt + completion, usage_increments(added))
        self._alerted(alerts)

    def _count_call(self, exchange: _Exchange) -> None:
        """An API call of a key that did not reach an answer's accounting (refused before it,
        or a model list): a request of the key's usage, as ``llmroute_gateway_requests_total``
        counts it, and an error unless it was answered or its client left (the fleet's usage
        takes it at the next flush, without a round trip of its own)."""
        if exchange.key == ANONYMOUS:
            return
        usage = self._usage.setdefault(exchange.key, _new_usage())
        usage["requests"] += 1
        error = not exchange.gone and not 0 < exchange.status < 400
        if error:
            usage["errors"] += 1
        self.admission.count_call(exchange.key, error)

    async def usage(self, scope: str = "fleet") -> dict[str, Any]:
        """Every key's and team's usage (requests, errors, tokens, cache hits) — the fleet's
        with Redis (``scope="fleet"``), else this replica's — and their limits' counters now:
        ``GET /admin/usage``."""
        return await usage_report(self.tenants, self._usage, self.admission, self._created, scope)

    def _alerted(self, alerts: Iterable[Alert]) -> None:
        for alert in alerts:
            self.soft_limits.notify(alert)

    # -- the routed call ------------------------------------------------------------------------

    async def _answer(
        self,
        path: str,
        body: dict[str, Any],
        extra_headers: dict[str, str],
        exchange: _Exchange,
        receive: Receive,
        total: float | None = None,
        tally: _Tally | None = None,
    ) -> None:
        # Failures of this request count against this key first (routing/health.py): one key's
        # bad requests open that key's breakers, not everyone's.
        party = failure_party.set(exchange.key)
        try:
            await self._routed(path, body, extra_headers, exchange, receive, total, tally)
        finally:
            failure_party.reset(party)

    async def _routed(
        self,
        path: str,
        body: dict[str, Any],
        extra_headers: dict[str, str],
        exchange: _Exchange,
        receive: Receive,
        total: float | None = None,
        tally: _Tally | None = None,
    ) -> None:
        """The routed call and its answer, within ``total`` seconds if given; what it used
        goes in ``tally``."""
        tally = tally if tally is not None else _Tally(body, _KINDS[path])
        stream: openai.AsyncStream[Any] | None = None
        sequence: object = None
        result: object = None
        failure: Exception | None = None
        complete = False
        async with anyio.create_task_group() as tg:
            scope = tg.cancel_scope

            def client_gone() -> None:
                if not exchange.finished:
                    exchange.gone = True
                    scope.cancel()

            def client_stalled() -> None:
                exchange.gone = exchange.stalled = True
                scope.cancel()

            tg.start_soon(_watch, receive, exchange, client_gone, client_stalled, self._renew)
            self._scopes[scope] = exchange
            if self._revoked_since(exchange):  # while its body came, or it was admitted
                exchange.revoked = True
                scope.cancel()
            deadline = anyio.current_time() + total if total is not None else math.inf
            try:
                with anyio.CancelScope(deadline=deadline) as limit:
                    result = await self._call(path, body, extra_headers)
                    if isinstance(result, openai.AsyncStream):  # llmroute's for chat, else openai's
                        stream = result
                        tally.cache_hit = _cache_hit(stream)
                        cache = "hit" if tally.cache_hit else "miss"
                        await exchange.start(
                            200,
                            "text/event-stream; charset=utf-8",
                            {"cache-control": "no-cache", "x-llmroute-cache": cache}
                            | _tier_header(stream)
                            | _target_header(stream),
                        )
                        if path == _RESPONSES:  # named events, as OpenAI sends them
                            async for event in stream:
                                sequence = getattr(event, "sequence_number", sequence)
                                tally.event(event)
                                await exchange.chunk(_named_event(event))
                        else:
                            async for chunk in stream:
                                tally.chunk(chunk)
                                await exchange.chunk(b"data: " + dump_json(chunk) + b"\n\n")
                        complete = True
                if limit.cancelled_caught and total is not None:
                    result = None
                    failure = _TotalTimeout(total)
            except Exception as exc:
                failure = exc
            finally:
                self._scopes.pop(scope, None)
                if self._idle is not None and not self._scopes:
                    self._idle.set()  # the last request in flight of a gateway draining
                scope.cancel()
        report = getattr(stream if stream is not None else result, "route", None)
        report = report if report is not None else getattr(failure, "report", None)
        if isinstance(report, RouteReport):
            exchange.report = report
        if exchange.stalled:
            self.metrics.rejections.labels(exchange.key, "write_timeout").inc()
        elif exchange.gone:
            self.metrics.disconnects.labels(exchange.key, exchange.label).inc()
        if stream is not None:
            tally.streamed(getattr(stream, "route", None))
            with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
                try:
                    await stream.close()
                except Exception as exc:
                    log.warning("closing a stream: %s", self._scrub(f"{type(exc).__name__}: {exc}"))
        if exchange.gone:
            return
        if stream is not None:
            if complete:
                # A Responses stream ends with its response.completed event; chat's with [DONE].
                await exchange.body(b"" if path == _RESPONSES else b"data: [DONE]\n\n")
                return
            self.metrics.stream_errors.labels(exchange.key, exchange.label).inc()
            exchange.failed = True
            if exchange.revoked:
                event = _error(
                    "This key was revoked; the answer is incomplete.",
                    "invalid_request_error",
                    "key_revoked",
                )
            elif failure is None:
                event = _error(
                    "The gateway is shutting down; the answer is incomplete.",
                    "server_error",
                    "gateway_shutdown",
                )
            else:
                event = self._stream_error(failure)
            if path == _RESPONSES:  # the Responses API's own error event
                error = event["error"]
                number = sequence + 1 if isinstance(sequence, int) else None
                event = {
                    "type": "error",
                    "code": error["code"],
                    "message": error["message"],
                    "param": None,
                    "sequence_number": number,
                }
                await exchange.body(b"event: error\ndata: " + self._error_bytes(event) + b"\n\n")
                return
            await exchange.body(b"data: " + self._error_bytes(event) + b"\n\n")
            return
        if failure is not None:
            raise self._map_error(failure)
        if result is None and exchange.revoked:
            raise _Refused(
                401, _error("This key was revoked.", "invalid_request_error", "invalid_api_key")
            )
        if result is None:
            raise _Refused(503, _error("The gateway is shutting down.", "server_error"))
        assert isinstance(result, pydantic.BaseModel)
        tally.answered(result)
        cache = "hit" if tally.cache_hit else "miss"
        await exchange.whole(
            200,
            dump_json(result),
            headers={"x-llmroute-cache": cache} | _tier_header(result) | _target_header(result),
        )

    async def _call(self, path: str, body: dict[str, Any], extra_headers: dict[str, str]) -> object:
        """The client's call for ``path``: every field of the body is passed on as it is."""
        client = self.client
        if path in _ROUTABLE:
            # A chat or Responses call on a route goes straight to the client's dispatch, as
            # the client's seam would send it: openai's post() would first build its request
            # options (FinalRequestOptions, ~70 µs of CPU per request, most of it deep-copying
            # defaults; benchmarks/gateway_call.py) only for the seam to take the call out of
            # openai's path. Any other call (a model that is not a route, with a default
            # provider) takes client.post.
            result = await client._routed_call(  # pyright: ignore[reportPrivateUsage]
                _ROUTABLE[path], body, extra_headers, self._timeout
            )
            if result is not NOT_ROUTED:
                return result
        posted = _POSTED.get(path)
        if posted is not None:
            # openai's resource method would walk the whole body through its TypedDict
            # transform (8% of the gateway's CPU per streamed request, measured with py-spy);
            # the body is JSON the gateway has checked already, so it is posted as it is.
            cast_to, event = posted
            return await client.post(
                _ROUTABLE[path],
                body=body,
                cast_to=cast_to,
                options={"headers": extra_headers},
                stream=bool(body.get("stream")),
                stream_cls=openai.AsyncStream[event],
            )
        rest = dict(body)
        model = rest.pop("model")
        kwargs: dict[str, Any] = {"model": model, "extra_headers": extra_headers}
        if "stream" in rest:
            kwargs["stream"] = rest.pop("stream")
        if path == _COMPLETIONS:
            kwargs["prompt"] = rest.pop("prompt")
            return await client.completions.create(extra_body=rest, **kwargs)
        kwargs.pop("stream", None)
        kwargs["input"] = rest.pop("input")
        if "encoding_format" in rest:
            kwargs["encoding_format"] = rest.pop("encoding_format")
        return await client.embeddings.create(extra_body=rest, **kwargs)

    async def _renew(self, exchange: _Exchange) -> None:
        if exchange.ticket is not None:
            await self.admission.renew(exchange.ticket)

    def _upstream_headers(self, headers: Mapping[str, str], exchange: _Exchange) -> dict[str, str]:
        """The cache settings a client may give, its W3C trace context; a per-key namespace
        when configured."""
        out = {name: headers[name] for name in _FORWARDED if name in headers}
        for name in (TRACEPARENT, TRACESTATE):  # the caller's trace goes on (each attempt its span)
            if name in headers:
                out[name] = headers[name]
        namespace = self._namespaces.get(exchange.key)
        if namespace is not None:
            out[_NAMESPACE_HEADER] = namespace
        return out

    # -- requests -------------------------------------------------------------------------------

    def _authenticate(self, headers: Mapping[str, str], exchange: _Exchange) -> Tenant:
        tenant = self.tenants.match(headers.get("authorization"), self.clock())
        if tenant is None:
            if exchange.label.startswith("/v1/"):  # rejections are of API calls
                self.metrics.rejections.labels(ANONYMOUS, "unauthorized").inc()
            given = "authorization" in headers
            message = (
                "Incorrect API key provided."
                if given
                else "You didn't provide an API key (Authorization: Bearer <key>)."
            )
            raise _Refused(
                401,
                _error(message, "invalid_request_error", "invalid_api_key"),
                {"www-authenticate": 'Bearer realm="llmroute"'},
            )
        exchange.key = tenant.name
        exchange.tenant = tenant
        exchange.tenants = self.tenants
        return tenant

    async def _read_json(
        self,
        headers: Mapping[str, str],
        exchange: _Exchange,
        receive: Receive,
        *,
        allow_empty: bool = False,
    ) -> dict[str, Any]:
        limit = self.settings.max_body_bytes
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            if int(declared) <= _DRAIN_BYTES:
                await _discard(receive, _DRAIN_BYTES)
            raise self._too_large(exchange, limit)
        parts: list[bytes] = []
        size = 0
        more = True
        with anyio.move_on_after(self.settings.body_timeout):
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    exchange.gone = True
                    raise _Refused(499, _error("The client went away.", "invalid_request_error"))
                part: bytes = message.get("body", b"")
                more = message.get("more_body", False)
                size += len(part)
                if size > limit:
                    if more:
                        await _discard(receive, _DRAIN_BYTES)
                    raise self._too_large(exchange, limit)
                parts.append(part)
        if more:
            self.metrics.rejections.labels(exchange.key, "body_timeout").inc()
            raise _Refused(
                408,
                _error(
                    f"The request body did not arrive within {self.settings.body_timeout:g} s.",
                    "invalid_request_error",
                    "request_timeout",
                ),
            )
        if allow_empty and not any(parts):
            return {}
        try:
            body = load(b"".join(parts))
        except InvalidField as invalid:  # NaN, Infinity, 1e400: named
            self.metrics.rejections.labels(exchange.key, "invalid_request").inc()
            raise _invalid_field(invalid) from None
        except ValueError:  # UnicodeDecodeError too
            raise _Refused(
                400, _error("The request body is not valid JSON.", "invalid_request_error")
            ) from None
        except RecursionError:
            raise _too_deep() from None
        if not isinstance(body, dict):
            raise _Refused(
                400, _error("The request body must be a JSON object.", "invalid_request_error")
            )
        return body  # type: ignore[return-value]

    def _too_large(self, exchange: _Exchange, limit: int) -> _Refused:
        self.metrics.rejections.labels(exchange.key, "body_too_large").inc()
        return _Refused(
            413,
            _error(
                f"The request body is larger than the gateway allows ({format_size(limit)}).",
                "invalid_request_error",
                "request_too_large",
            ),
        )

    # -- answers ------------------------------------------------------------------------------

    def _model(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": self._created, "owned_by": "llmroute"}

    def _health(self) -> dict[str, Any]:
        targets = {
            name: {
                "n": snap.n,
                "ttft_p50": snap.ttft_p50,
                "ttft_p95": snap.ttft_p95,
                "error_rate": snap.error_rate,
                "in_flight": snap.in_flight,
                "breaker": snap.breaker,
            }
            for name, snap in self.client.stats().items()
        }
        status = "shutting_down" if self._closing else "ok"
        return {"status": status, "routes": self.routes, "targets": targets}

    async def _refuse(self, exchange: _Exchange, refused: _Refused) -> None:
        if exchange.gone or exchange.status:
            exchange.status = exchange.status or refused.status
            return
        data = self._error_bytes(refused.body)
        await exchange.whole(refused.status, data, headers=refused.headers)

    def _scrub(self, text: str) -> str:
        return scrub(text, self._secrets, _REDACTED, self._masked)

    def _error_bytes(self, body: Any) -> bytes:
        # Not ASCII-escaped, so a masked key's ellipsis or bullets are seen as such.
        return self._scrub(json.dumps(body, ensure_ascii=False)).encode()

    def _map_error(self, exc: Exception) -> _Refused:
        """An exception of the routed call as the OpenAI-shaped error a client should see."""
        if isinstance(exc, AllTargetsFailed):
            causes = list(exc.errors.values())
            statuses = {c.status_code for c in causes if isinstance(c, openai.APIStatusError)}
            if (
                len(statuses) == 1
                and len(causes) > 0
                and all(isinstance(c, openai.APIStatusError) for c in causes)
            ):
                status = statuses.pop()
                if status < 500 and status not in _UPSTREAM_AUTH:
                    cause = causes[-1]
                    assert isinstance(cause, Exception)
                    return self._map_error(cause)
            return _Refused(502, _error(exc.message, "upstream_error", "all_targets_failed"))
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            if status in _UPSTREAM_AUTH:
                log.error("upstream refused the gateway's credentials (HTTP %d)", status)
                return _Refused(
                    502,
                    _error(
                        "The upstream provider refused the gateway's credentials.",
                        "upstream_error",
                        "upstream_auth",
                    ),
                )
            error = exc.body if isinstance(exc.body, dict) else {}
            kind = "server_error" if status >= 500 else "upstream_error"
            body = {
                "message": error.get("message") or exc.message,
                "type": error.get("type") or kind,
                "param": error.get("param"),
                "code": error.get("code"),
            }
            headers: dict[str, str] = {}
            if status in (429, 503):
                headers = _retry_after(
                    exc.response.headers, self.settings.max_retry_after, time.time()
                )
            return _Refused(status if 400 <= status <= 599 else 502, {"error": body}, headers)
        if isinstance(exc, openai.APITimeoutError | _TotalTimeout):
            return _Refused(504, _error(exc.message, "timeout", "upstream_timeout"))
        if isinstance(exc, openai.APIError):
            return _Refused(502, _error(exc.message, "upstream_error", "upstream_unavailable"))
        if isinstance(exc, ConfigError | RequestBodyError):
            return _Refused(400, _error(str(exc), "invalid_request_error"))
        if isinstance(exc, RecursionError):
            return _too_deep()
        log.error("unexpected error: %s", self._scrub(f"{type(exc).__name__}: {exc}"))
        return _Refused(500, _error("The gateway failed to answer.", "server_error"))

    def _stream_error(self, exc: Exception) -> Any:
        """The last SSE event of a stream that broke: OpenAI's error shape, never ``[DONE]``."""
        if isinstance(exc, StreamInterrupted):
            return _error(exc.message, "server_error", "stream_interrupted")
        if isinstance(exc, _TotalTimeout):
            return _error(exc.message, "timeout", "upstream_timeout")
        if isinstance(exc, openai.APIError):
            return _error(exc.message, "server_error", "upstream_error")
        log.error("unexpected error in a stream: %s", self._scrub(f"{type(exc).__name__}: {exc}"))
        return _error("The gateway failed to finish the answer.", "server_error")


async def _discard(receive: Receive, budget: int) -> None:
    """Read and drop the rest of a refused body (bounded in bytes and time), so an HTTP/1.1
    client still sending it reads the 413 instead of a reset connection."""
    with anyio.move_on_after(_DRAIN_SECONDS):
        while budget > 0:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            budget -= len(message.get("body", b""))
            if not message.get("more_body", False):
                return


async def _watch(
    receive: Receive,
    exchange: _Exchange,
    gone: Callable[[], None],
    stalled: Callable[[], None],
    renew: Callable[[_Exchange], Awaitable[None]],
) -> None:
    """Beside a request's work: call ``gone`` when the client disconnects, ``stalled`` when a
    chunk's write has waited ``write_timeout`` (checked every quarter of it, so the answer is
    cut within 1.25 times ``write_timeout``), and renew the request's shared slot meanwhile."""
    interval = exchange.write_timeout / 4
    while True:
        with anyio.move_on_after(interval):
            message = await receive()
            if message["type"] == "http.disconnect":
                gone()
                return
            continue
        since = exchange.since
        if since and time.monotonic() - since >= exchange.write_timeout:
            stalled()
            return
        await renew(exchange)


def _trace_ids(report: RouteReport | None) -> str:
    """The access log's ids of a routed request: its trace and the vendors' request ids."""
    if report is None:
        return ""
    ids = [_LOG_UNSAFE.sub("?", a.request_id[:128]) for a in report.attempts if a.request_id]
    text = f" trace={report.trace_id}" if report.trace_id else ""
    return text + (f" upstream={','.join(ids)}" if ids else "")


def _tier_header(result: object) -> dict[str, str]:
    """``x-llmroute-tier``: the route a tiered model name's request went to."""
    tier = getattr(getattr(result, "route", None), "tier", None)
    return {TIER_HEADER: tier.tier} if tier is not None else {}


def _target_header(result: object) -> dict[str, str]:
    """``x-llmroute-target``: the target whose answer this is (``cache`` for a replay)."""
    winner = getattr(getattr(result, "route", None), "winner", None)
    return {TARGET_HEADER: winner} if isinstance(winner, str) else {}


def _cache_hit(result: object) -> bool:
    route = getattr(result, "route", None)
    return bool(getattr(route, "cache_hit", False))


_LABELS = frozenset(
    (_CHAT, _COMPLETIONS, _EMBEDDINGS, _RESPONSES, _MODELS, "/health", "/metrics", _ADMIN_USAGE)
) | {_LIVE_DATA, *LIVE_FILES, _ADMIN_KEYS, _ADMIN_TEAMS}


def _label(path: str) -> str:
    """The path as the access log and the metrics name it: one of the gateway's own (an
    admin read included, so it can be audited), else a bounded stand-in."""
    if path in _LABELS:
        return path
    if path.startswith(_MODELS + "/"):
        return _MODELS + "/{model}"
    if path.startswith(_ADMIN_KEYS_UNDER):  # who changed which keys is audited by path
        rotate = "/rotate" if path.endswith("/rotate") else ""
        return path[: path.index("/", len("/admin/")) + 1] + "{name}" + rotate
    return "other"


def _allow(method: str, allowed: str) -> None:
    if method != allowed:
        raise _Refused(
            405,
            _error(f"Method {method} is not allowed here; use {allowed}.", "invalid_request_error"),
            {"allow": allowed},
        )


def _namespaces(settings: GatewaySettings, names: list[str]) -> dict[str, str]:
    """Each key's cache namespace: its own (``cache_namespace_per_key``), its group's
    (``cache_groups``), or none (every key shares the default namespace)."""
    if not settings.cache_namespace_per_key:
        return {}
    spaces = {name: key_namespace(name) for name in names}
    for group, members in settings.cache_groups.items():
        for name in members:
            spaces[name] = group_namespace(group)
    return spaces


def _invalid_field(invalid: InvalidField) -> _Refused:
    return _Refused(
        400, _error(invalid.message, "invalid_request_error", invalid.code, invalid.param)
    )


def _missing(param: str) -> _Refused:
    return _Refused(
        400,
        _error(f"Missing required parameter: '{param}'.", "invalid_request_error", None, param),
    )


def _too_deep() -> _Refused:
    return _Refused(400, _error("The request body is nested too deeply.", "invalid_request_error"))


def _model_not_found(name: str, usable: Iterable[str] = ()) -> _Refused:
    """OpenAI's 404 for a model, naming the closest of ``usable`` as the SDK does (the
    routes the key may use, never another), else listing the first ten of them."""
    shown = name if len(name) <= 100 else name[:97] + "..."
    names = list(usable)
    closest = suggest_route(name, names) if len(name) <= 100 else None
    if closest is not None:
        hint = f" (did you mean {closest!r}?)"
    elif names:
        more = f" and {len(names) - 10} more" if len(names) > 10 else ""
        hint = f" (the models you can use here: {', '.join(map(repr, names[:10]))}{more})"
    else:
        hint = ""
    return _Refused(
        404,
        _error(
            f"The model '{shown}' does not exist or you do not have access to it{hint}.",
            "invalid_request_error",
            "model_not_found",
        ),
    )


_LIMIT_FIELDS = {
    _CHAT: ("max_completion_tokens", "max_tokens"),
    _COMPLETIONS: ("max_tokens",),
    _RESPONSES: ("max_output_tokens",),
}
"""The fields that limit an answer's tokens; a key's ``default_max_tokens`` goes in the last."""


def _prompt_estimate(body: Mapping[str, Any], kind: str) -> int:
    """The request's prompt tokens, estimated (four characters a token)."""
    if kind in ("chat", "responses"):
        return estimate_prompt_tokens(prompt_messages(body, kind))
    given = body.get("prompt" if kind == "completions" else "input")
    texts = [given] if isinstance(given, str) else given if isinstance(given, list) else []
    characters = sum(len(t) for t in texts if isinstance(t, str))
    tokens = sum(len(t) for t in texts if isinstance(t, list))  # token ids
    return characters // 4 + tokens


def _default_goal(body: dict[str, Any], headers: Mapping[str, str], ttft_ms: float) -> None:
    """The key's ``ttft_target_ms`` as the request's own, unless it gives one."""
    if TTFT_TARGET_HEADER in headers:
        return
    options = body.get("llmroute")
    if options is None:
        body["llmroute"] = {"ttft_target_ms": ttft_ms}
    elif isinstance(options, dict) and "ttft_target_ms" not in options:
        options["ttft_target_ms"] = ttft_ms


def _carries_tokens(chunk: Any) -> bool:
    """Whether a streamed chunk brings answer tokens (text, reasoning, a tool call), not only
    a role, a finish reason or usage."""
    for choice in chunk.choices or ():
        if getattr(choice, "text", None):  # a completion's
            return True
        delta = getattr(choice, "delta", None)
        if delta is None:
            continue
        if delta.content or delta.tool_calls or delta.refusal:
            return True
        extra = getattr(delta, "__pydantic_extra__", None)
        if extra and any(extra.get(key) for key in REASONING_FIELDS):
            return True
    return False


class _Tally:
    """What one answer used: the vendors' usage where it came, else the gateway's count
    (the prompt's estimate; a streamed chunk with text a token). A cache hit used nothing. Per
    chunk it costs a few attribute reads: the hot path is the streamed chunk's."""

    __slots__ = ("answer", "body", "cache_hit", "chunks", "completion", "kind", "prompt")

    def __init__(self, body: Mapping[str, Any], kind: str) -> None:
        self.body, self.kind = body, kind
        self.prompt: int | None = None
        self.completion: int | None = None
        self.chunks = 0
        self.cache_hit = False
        self.answer = False  # a whole answer came (with or without usage)

    def _usage(self, usage: Any, prompt: str, completion: str) -> None:
        p, c = getattr(usage, prompt, None), getattr(usage, completion, None)
        if isinstance(p, int):
            self.prompt = p
        if isinstance(c, int):
            self.completion = c

    def chunk(self, chunk: Any) -> None:
        if _carries_tokens(chunk):
            self.chunks += 1  # a count of tokens only where no vendor sent usage
        usage = chunk.usage
        if usage is not None:
            self._usage(usage, "prompt_tokens", "completion_tokens")

    def event(self, event: Any) -> None:
        kind = getattr(event, "type", "")
        if kind == "response.output_text.delta":
            self.chunks += 1
        elif kind in ("response.completed", "response.incomplete"):
            response = getattr(event, "response", None)
            usage = getattr(response, "usage", None)
            if usage is not None:
                self._usage(usage, "input_tokens", "output_tokens")

    def streamed(self, route: Any) -> None:
        """A routed stream's report: its usage as the vendors counted it."""
        usage = getattr(route, "usage", None)
        if usage is not None and self.completion is None:
            self._usage(usage, "prompt_tokens", "completion_tokens")

    def answered(self, result: Any) -> None:
        self.cache_hit = _cache_hit(result)
        self.answer = True
        usage = getattr(result, "usage", None)
        if usage is None:
            return
        if hasattr(usage, "input_tokens"):  # the Responses API's
            self._usage(usage, "input_tokens", "output_tokens")
        else:
            self._usage(usage, "prompt_tokens", "completion_tokens")
            if self.completion is None and isinstance(self.prompt, int):
                self.completion = 0  # embeddings: no completion

    def used(self) -> tuple[int, int]:
        """Prompt and completion tokens (none for a cache hit)."""
        if self.cache_hit:
            return 0, 0
        if self.prompt is None and self.completion is None and not self.chunks and not self.answer:
            return 0, 0  # nothing came back: nothing was used that anyone counted
        prompt = self.prompt if self.prompt is not None else _prompt_estimate(self.body, self.kind)
        completion = self.completion if self.completion is not None else self.chunks
        return prompt, completion


def _key_store(config: Config) -> tuple[KeyStore | None, Managed | None]:
    """Where the admin API keeps its keys (Redis with ``limits_backend = "redis"``, else
    ``keys_file``, else nowhere), and, with Redis, its keys now (none, logged, when it cannot
    be reached: the watch reads them once it answers)."""
    settings = config.gateway or GatewaySettings()
    if settings.limits_backend == "redis":
        redis = config.redis
        store = RedisKeyStore(
            redis.url.get_secret_value(), prefix=redis.prefix, timeout=redis.timeout
        )
        try:
            return store, store.load_now()
        except StoreUnavailable as exc:
            log.warning("gateway keys: %s; the admin API's keys are read once it answers", exc)
            return store, Managed(version=-1)
    if settings.keys_file is not None:
        return FileKeyStore(settings.keys_file), None
    return None, None


def _key_action(method: str, path: str) -> str:
    """The admin API's change, as ``llmroute_gateway_key_changes_total`` counts it."""
    if path.startswith(_ADMIN_TEAMS):
        return "team_delete" if method == "DELETE" else "team_put"
    if path.endswith("/rotate"):
        return "rotate"
    return {"POST": "create", "PATCH": "update", "DELETE": "revoke"}.get(method, "other")


def _usage_scope(query: bytes) -> str:
    """``GET /admin/usage?scope=fleet|replica``'s scope (``fleet`` when not given)."""
    given = urllib.parse.parse_qs(query.decode("latin-1")).get("scope", ["fleet"])[-1]
    if given not in ("fleet", "replica"):
        raise _Refused(
            400,
            _error(
                "Invalid 'scope': expected 'fleet' or 'replica'.",
                "invalid_request_error",
                "invalid_value",
                "scope",
            ),
        )
    return given
