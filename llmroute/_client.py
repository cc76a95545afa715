"""The drop-in clients: ``AsyncOpenAI`` with openai's constructor, resources and return types."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import logging
import os
import random
import ssl
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Literal, cast, overload

import anyio
import httpx
import openai
from openai import NotGiven, Omit
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from ._background import spawn
from ._config import (
    CacheSettings,
    Config,
    ConfigError,
    Resolved,
    ResolvedProvider,
    RouteConfig,
    Target,
    load_config,
    resolve,
    resolve_provider,
    route_config,
)
from ._errors import (
    APIConnectionError,
    APIStatusError,
    OpenAIError,
    RequestBodyError,
    make_status_error,
    map_transport_errors,
)
from ._resources import (
    AsyncChatCompletionsWithRawResponse,
    AsyncChatCompletionsWithStreamingResponse,
    AsyncEmbeddings,
    AsyncModels,
    AsyncTextCompletions,
    attach_response,
    has_response,
)
from ._streaming import AsyncStream
from ._types import RouteReport, Timings
from ._version import __version__
from .cache import (
    NAMESPACE_PATTERN,
    CacheRequest,
    CacheUnavailable,
    ResponseCache,
    is_deterministic,
    open_cache,
    request_key,
)
from .cache import tenant_namespace as _tenant_namespace
from .metrics import ClientMetrics
from .protocols import anthropic
from .protocols.openai import ChatStreamDecoder, parse_chat_completion
from .routing.backoff import retry_delay, should_retry_status
from .routing.budget import HedgeBudget
from .routing.engine import Route, Router, RouteTarget
from .routing.policies import (
    FailoverPolicy,
    FastestPolicy,
    HedgePolicy,
    LeastLoadedPolicy,
    Policy,
    PrefixPolicy,
    RacePolicy,
    RoundRobinPolicy,
    WeightedPolicy,
)
from .routing.shared import StatsSync
from .routing.stats import LiveStats, StatsSettings, TargetSnapshot
from .sglang import MetricsPoller
from .transport import Transport, make_ssl_context

__all__ = ["DEFAULT_MAX_RETRIES", "DEFAULT_TIMEOUT", "AsyncOpenAI"]

log = logging.getLogger("llmroute")

DEFAULT_TIMEOUT = httpx.Timeout(timeout=600.0, connect=5.0)
DEFAULT_MAX_RETRIES = 2
_DEFAULT_BASE_URL = "https://api.openai.com/v1"
_NOT_GIVEN: Any = openai.NOT_GIVEN
_SENTINELS = (type(openai.NOT_GIVEN), type(openai.omit))

ApiKey = str | Callable[[], Awaitable[str]]

CACHE_HEADER = "x-llmroute-cache"
"""Per request (``extra_headers``) or per client (``default_headers``): ``auto``, ``on``,
``read-only`` or ``off``; never sent upstream, like every ``x-llmroute-*`` header."""
CACHE_NAMESPACE_HEADER = "x-llmroute-cache-namespace"
CACHE_REPLAY_HEADER = "x-llmroute-cache-replay"
_CACHE_MODES = ("auto", "on", "read-only", "off")
_REPLAY_MODES = ("immediate", "paced")
_OWN_HEADER_PREFIX = "x-llmroute-"
_METRICS_INTERVAL = 1.0  # seconds between reads of a self-hosted server's /metrics
# Headers that identify the caller: the cache's tenant namespace is a hash of their values.
_CREDENTIALS = frozenset(
    {"authorization", "api-key", "x-api-key", "openai-organization", "openai-project"}
)


def _given(value: object) -> bool:
    return not isinstance(value, _SENTINELS)


def _to_timeout(value: object) -> httpx.Timeout:
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


def _proxy_for(url: httpx.URL) -> str | None:
    """The proxy the environment (HTTPS_PROXY, ALL_PROXY, NO_PROXY, ...) sets for ``url``."""
    proxies = urllib.request.getproxies_environment()
    if not proxies or url.host in ("localhost", "::1") or url.host.startswith("127."):
        return None
    if urllib.request.proxy_bypass_environment(url.host, proxies):  # type: ignore[attr-defined]
        return None
    return proxies.get(url.scheme) or proxies.get("all")


def _check_base_url(base_url: str | httpx.URL) -> httpx.URL:
    url = httpx.URL(str(base_url))
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"base_url must be an http:// or https:// URL, got {str(base_url)!r}")
    if not url.raw_path.endswith(b"/"):
        url = url.copy_with(raw_path=url.raw_path + b"/")
    return url


def _merge_headers(
    headers: dict[str, str], extra_headers: Mapping[str, str | None] | None
) -> dict[str, str]:
    """``headers`` with a call's ``extra_headers`` applied (``None`` removes one), without
    llmroute's own ``x-llmroute-*`` settings, which are never sent upstream."""
    for name, value in (extra_headers or {}).items():
        if value is None or not _given(value):
            headers.pop(name, None)
            for key in [k for k in headers if k.lower() == name.lower()]:
                del headers[key]
        else:
            headers[name] = value
    for name in [k for k in headers if k.lower().startswith(_OWN_HEADER_PREFIX)]:
        del headers[name]
    return headers


def _credentials(headers: Mapping[str, str]) -> list[str]:
    """The headers that say who is asking, as ``name=value`` strings in a fixed order."""
    return sorted(f"{k.lower()}={v}" for k, v in headers.items() if k.lower() in _CREDENTIALS)


def _header_choice(
    options: Mapping[str, str], header: str, default: str, choices: tuple[str, ...]
) -> str:
    value = options.get(header)
    if value is None:
        return default
    if value.lower() not in choices:
        raise ConfigError(f"{header}: expected one of {', '.join(choices)}, got {value[:80]!r}")
    return value.lower()


def _policy(config: RouteConfig) -> Policy:
    if config.policy == "prefix":
        return PrefixPolicy(
            block_chars=config.prefix_block_chars,
            max_blocks=config.prefix_max_blocks,
            cache_threshold=config.cache_threshold,
            balance_abs_threshold=config.balance_abs_threshold,
            balance_rel_threshold=config.balance_rel_threshold,
            rank_by=config.rank_by,
        )
    if config.policy == "least-loaded":
        return LeastLoadedPolicy(rank_by=config.rank_by)
    if config.policy == "round-robin":
        return RoundRobinPolicy()
    if config.policy == "fastest":
        return FastestPolicy(rank_by=config.rank_by)
    if config.policy == "hedge":
        return HedgePolicy(
            rank_by=config.rank_by, hedge_after=config.hedge_after, max_hedges=config.max_hedges
        )
    if config.policy == "race":
        return RacePolicy(k=config.race, rank_by=config.rank_by)
    if config.policy == "weighted":
        return WeightedPolicy(weights=tuple(config.weights or ()))
    return FailoverPolicy()


def _route(
    name: str,
    config: RouteConfig,
    targets: Iterable[Target],
    providers: Mapping[str, ResolvedProvider],
) -> Route:
    """The engine's route for one ``[models.<name>]`` table."""
    return Route(
        name=name,
        targets=tuple(
            RouteTarget(
                provider=t.provider,
                model=t.model,
                continuation=providers[t.provider].spec.continuation,
                stream_usage=providers[t.provider].spec.stream_usage,
                protocol=providers[t.provider].spec.protocol,
            )
            for t in targets
        ),
        policy=_policy(config),
        budget=HedgeBudget(ratio=config.hedge_budget),
        first_token_timeout=config.first_token_timeout,
        continue_on_break=config.continue_on_break,
    )


def _build_router(resolved: Resolved, *, max_retries: int) -> Router:
    """The routing engine for a resolved config: its routes, live stats and health."""
    settings = resolved.routing
    stats = LiveStats(
        StatsSettings(
            window=settings.window,
            max_samples=settings.window_samples,
            prompt_classes=tuple(settings.prompt_classes),
            prior_ttft=settings.ttft_prior,
        ),
        journal=settings.stats_backend == "redis",
    )
    routes = {
        name: _route(name, resolved.route_configs[name], targets, resolved.providers)
        for name, targets in resolved.routes.items()
    }
    return Router(
        routes,
        stats=stats,
        breaker_failures=settings.breaker_failures,
        breaker_cooldown=settings.breaker_cooldown,
        explore_share=settings.explore,
        max_retries=max_retries,
    )


class _ServerPolling:
    """Reads the self-hosted servers' ``/metrics`` (their queues feed the load-aware
    policies) in the background, at most once a second while routed requests come; one per
    client, shared with its copies."""

    def __init__(self) -> None:
        self._poller: MetricsPoller | None = None
        self._next_at = 0.0

    def poll(self, router: Router, providers: Mapping[str, ResolvedProvider]) -> None:
        now = time.monotonic()
        if now < self._next_at:
            return
        self._next_at = now + _METRICS_INTERVAL
        servers = {
            target.name: providers[target.provider]
            for route in router.routes.values()
            for target in route.targets
            if providers[target.provider].kind == "sglang"
        }
        if not servers:
            return
        poller = self._poller
        if poller is None or set(poller.urls) != set(servers):
            if poller is not None:
                spawn(poller.aclose, name="metrics poller close")
            poller = self._poller = MetricsPoller(
                {name: str(p.base_url) for name, p in servers.items()},
                router.stats,
                keys={name: p.api_key for name, p in servers.items() if p.api_key},
                interval=_METRICS_INTERVAL,
                clock=router._clock,
            )
        spawn(poller.poll_once, name="server metrics")

    async def aclose(self) -> None:
        if self._poller is not None:
            await self._poller.aclose()
            self._poller = None


def _stats_sync(resolved: Resolved, router: Router) -> StatsSync | None:
    """With ``stats_backend = "redis"``: the exchange of TTFT samples with the other instances."""
    settings = resolved.routing
    if settings.stats_backend != "redis":
        return None
    from .routing.shared import RedisStatsBackend

    backend = RedisStatsBackend(
        resolved.redis.url.get_secret_value(),
        prefix=resolved.redis.prefix,
        timeout=resolved.redis.timeout,
        history=settings.window,
    )
    return StatsSync(
        router.stats,
        backend,
        interval=settings.stats_sync,
        targets={t.name for route in router.routes.values() for t in route.targets},
    )


class AsyncOpenAI:
    """A drop-in replacement for ``openai.AsyncOpenAI``.

    Takes the same constructor arguments and environment variables (``OPENAI_API_KEY``,
    ``OPENAI_ORG_ID``, ``OPENAI_PROJECT_ID``, ``OPENAI_BASE_URL``) and returns openai's own types.
    Requests go over llmroute's transport: persistent HTTP/2 over TLS, per-stream deadlines, and
    unfinished streams reset when left. ``verify`` (an llmroute extension) sets the TLS trust:
    ``True`` (system/certifi roots, ``SSL_CERT_FILE``), a CA file path, an ``ssl.SSLContext``, or
    ``False``. A given ``http_client`` is used as it is, with its own transport.
    """

    def __init__(
        self,
        *,
        api_key: ApiKey | None = None,
        organization: str | None = None,
        project: str | None = None,
        base_url: str | httpx.URL | None = None,
        timeout: Any = _NOT_GIVEN,
        max_retries: int = DEFAULT_MAX_RETRIES,
        default_headers: Mapping[str, str] | None = None,
        default_query: Mapping[str, object] | None = None,
        http_client: httpx.AsyncClient | Any | None = None,
        verify: ssl.SSLContext | str | bool = True,
        config: Config | Mapping[str, Any] | str | os.PathLike[str] | None = None,
        **unsupported: Any,
    ) -> None:
        if unsupported:
            names = ", ".join(sorted(unsupported))
            raise TypeError(f"AsyncOpenAI() got unsupported argument(s): {names}")
        loaded = load_config(config)
        # A routed client warms its default base URL only when it is meant to be used.
        self._warm_default = loaded is None or base_url is not None
        self._providers: dict[str, ResolvedProvider] = {}
        self._cache: ResponseCache | None = None
        self._stats_sync: StatsSync | None = None
        self._owns_cache = True  # False in copies made by with_options
        self._servers = _ServerPolling()  # shared with copies made by with_options
        self._metrics: ClientMetrics  # shared with copies made by with_options
        self._cache_settings: CacheSettings | None = None
        # Every client has a router, with no routes until a config or add_targets() gives some,
        # so copies made by with_options share the routes added later.
        resolved = resolve(loaded if loaded is not None else Config())
        self._router = _build_router(resolved, max_retries=max_retries)
        self._metrics = ClientMetrics(self._router.snapshot)
        if loaded is not None:
            self._providers = dict(resolved.providers)
            self._stats_sync = _stats_sync(resolved, self._router)
            if resolved.cache is not None and resolved.cache.backend != "off":
                try:
                    self._cache = open_cache(resolved.cache, resolved.redis)
                    self._cache_settings = resolved.cache
                except CacheUnavailable as exc:
                    log.warning("cache: %s; the client runs without a cache", exc)
            default = resolved.default_provider
            if default is not None:
                provider = self._providers[default]
                self._warm_default = True
                base_url = base_url or provider.base_url
                if api_key is None:
                    api_key = provider.api_key or ""
        if api_key is None:
            api_key = os.environ.get("OPENAI_API_KEY")
        if api_key is None and loaded is not None:
            api_key = ""  # only routes are usable; a request for any other model says why
            self._missing_key = True
        else:
            self._missing_key = False
        if api_key is None:
            raise OpenAIError(
                "The api_key client option must be set either by passing api_key to the client "
                "or by setting the OPENAI_API_KEY environment variable"
            )
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be a non-negative integer, got {max_retries!r}")
        self._api_key_provider: Callable[[], Awaitable[str]] | None = None
        if callable(api_key):
            self._api_key_provider = api_key
            self._api_key = ""
        else:
            self._api_key = api_key
        self.organization = organization or os.environ.get("OPENAI_ORG_ID")
        self.project = project or os.environ.get("OPENAI_PROJECT_ID")
        if base_url is None:
            base_url = os.environ.get("OPENAI_BASE_URL") or _DEFAULT_BASE_URL
        self.base_url = _check_base_url(base_url)
        self.timeout = DEFAULT_TIMEOUT if not _given(timeout) else _to_timeout(timeout)
        self.max_retries = max_retries
        self._custom_headers = dict(default_headers or {})
        self._custom_query = dict(default_query or {})
        self._verify = verify
        if verify is False or (
            isinstance(verify, ssl.SSLContext) and verify.verify_mode == ssl.CERT_NONE
        ):
            log.warning(
                "TLS certificate verification is off (verify=False): anyone on the network "
                "path can read the requests, their API keys and the answers"
            )
        self._owns_http_client = http_client is None
        self._transport: Transport | None = None
        if http_client is None:
            proxy = _proxy_for(self.base_url)
            if proxy is None:
                self._transport = Transport(verify=verify)
                http_client = httpx.AsyncClient(transport=self._transport, timeout=self.timeout)
            else:
                log.warning(
                    "A proxy is configured for %s: requests go through httpx's own transport "
                    "and the proxy, without llmroute's stream resets and per-stream deadlines",
                    self.base_url.host,
                )
                http_client = httpx.AsyncClient(
                    proxy=proxy, verify=make_ssl_context(verify), timeout=self.timeout
                )
        self._client = http_client
        self._make_resources()

    def _make_resources(self) -> None:
        self.chat = AsyncChat(self)
        self.completions = AsyncTextCompletions(self)
        self.embeddings = AsyncEmbeddings(self)
        self.models = AsyncModels(self)

    # -- openai's client surface -----------------------------------------------------------

    @property
    def api_key(self) -> str:
        return self._api_key

    @property
    def default_headers(self) -> dict[str, str]:
        headers = {
            "Accept": "application/json",
            "Content-Type": "application/json",
            "User-Agent": f"llmroute/{__version__} (openai-compatible)",
        }
        if self.organization:
            headers["OpenAI-Organization"] = self.organization
        if self.project:
            headers["OpenAI-Project"] = self.project
        headers.update(self._custom_headers)
        return headers

    def with_options(
        self,
        *,
        api_key: ApiKey | None = None,
        organization: str | None = None,
        project: str | None = None,
        base_url: str | httpx.URL | None = None,
        timeout: Any = _NOT_GIVEN,
        max_retries: int | None = None,
        default_headers: Mapping[str, str] | None = None,
        set_default_headers: Mapping[str, str] | None = None,
        default_query: Mapping[str, object] | None = None,
        set_default_query: Mapping[str, object] | None = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> AsyncOpenAI:
        """A copy of this client with some options changed; it shares the connections."""
        if default_headers is not None and set_default_headers is not None:
            raise ValueError(
                "The `default_headers` and `set_default_headers` arguments are mutually exclusive"
            )
        if default_query is not None and set_default_query is not None:
            raise ValueError(
                "The `default_query` and `set_default_query` arguments are mutually exclusive"
            )
        headers = (
            dict(set_default_headers)
            if set_default_headers is not None
            else {**self._custom_headers, **(default_headers or {})}
        )
        query = (
            dict(set_default_query)
            if set_default_query is not None
            else {**self._custom_query, **(default_query or {})}
        )
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        if api_key is not None:
            if callable(api_key):
                clone._api_key_provider, clone._api_key = api_key, ""
            else:
                clone._api_key_provider, clone._api_key = None, api_key
        clone.organization = organization or self.organization
        clone.project = project or self.project
        if base_url is not None:
            clone.base_url = _check_base_url(base_url)
        if _given(timeout):
            clone.timeout = _to_timeout(timeout)
        if max_retries is not None:
            clone.max_retries = max_retries
        clone._custom_headers = headers
        clone._custom_query = query
        clone._owns_http_client = False  # the copy shares (or is given) its connections
        clone._owns_cache = False
        if http_client is not None:
            clone._client, clone._transport = http_client, None
        clone._make_resources()
        return clone

    copy = with_options

    async def warmup(self) -> None:
        """Open the connections now, so the first requests find them warm.

        A plain client opens its base URL's connection (and raises if it cannot). A routed one
        opens every target's, concurrently; a target that cannot be reached is logged and left
        to the routing (its failures count against it), and only if none can be reached does
        this raise.
        """
        transport = self._transport
        if transport is None:
            return
        urls = {str(self.base_url): self.base_url} if self._warm_default else {}
        for provider in self._providers.values():
            urls.setdefault(str(provider.base_url), provider.base_url)
        errors: list[BaseException] = []

        async def warm(url: httpx.URL) -> None:
            try:
                with map_transport_errors(self._client.build_request("GET", url)):
                    await transport.warmup(url, timeout=self.timeout.connect)
            except APIConnectionError as exc:
                if self._providers:
                    log.warning("warmup: cannot reach %s: %s", url, exc.message)
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for url in urls.values():
                tg.start_soon(warm, url)
        # A plain client raises if its base URL cannot be reached; a routed one only if no
        # target can be. Raised here, outside the task group, as itself (not in a group).
        if errors and (not self._providers or len(errors) == len(urls)):
            raise errors[0]

    def add_provider(self, name: str, table: Mapping[str, Any]) -> None:
        """Add (or replace) a provider at run time, from a ``[providers.<name>]`` table, e.g.
        ``{"kind": "sglang", "base_url": ..., "api_key": ...}``; ``ConfigError`` if invalid."""
        self._providers[name] = resolve_provider(name, table)

    def add_targets(self, model: str, targets: Iterable[str], **route: Any) -> None:
        """Add ``"provider:model"`` targets to the route ``model``, creating it (from ``route``,
        the keys of a ``[models.<name>]`` table) when it does not exist yet. The providers must
        be known: in the config, or added with :meth:`add_provider`."""
        parsed = [Target.parse(text) for text in targets]
        for target in parsed:
            if target.provider not in self._providers:
                raise ConfigError(
                    f"models.{model}: unknown provider {target.provider!r} "
                    "(add it with add_provider() first)"
                )
        routes = self._router.routes
        existing = routes.get(model)
        if existing is None:
            config = route_config(model, {"targets": [str(t) for t in parsed], **route})
            routes[model] = _route(model, config, parsed, self._providers)
            return
        if route:
            raise ConfigError(f"models.{model}: the route exists; its settings cannot change")
        if isinstance(existing.policy, WeightedPolicy):
            raise ConfigError(
                f"models.{model}: a weighted route takes no new targets (each needs a weight)"
            )
        new = _route(model, RouteConfig(targets=[str(t) for t in parsed]), parsed, self._providers)
        known = {t.name for t in existing.targets}
        existing.targets += tuple(t for t in new.targets if t.name not in known)

    def stats(self) -> dict[str, TargetSnapshot]:
        """A snapshot of every routed target's live stats (empty for a client without routes).

        Per target (``"provider:model"``): sample count, TTFT p50/p95/p99 over the sliding
        window (overall and per prompt-length class), inter-token latency, tokens/s, error,
        timeout and 429 rates, requests in flight and the circuit breaker's state.
        """
        return self._router.snapshot()

    @property
    def metrics(self) -> ClientMetrics:
        """This client's Prometheus metrics (TTFT and inter-token histograms per target,
        requests by outcome, hedges, cache hits, breaker state, in flight); see
        :mod:`llmroute.metrics`."""
        return self._metrics

    def is_closed(self) -> bool:
        """Whether the connections are closed, as openai's ``is_closed()``."""
        return bool(self._client.is_closed)

    async def close(self) -> None:
        """Close the connections (only those this client opened itself) and the cache."""
        if self._owns_cache:
            await self._servers.aclose()
            if self._stats_sync is not None:
                await self._stats_sync.aclose()
            if self._cache is not None:
                await self._cache.aclose()
        if self._owns_http_client:
            await self._client.aclose()

    async def __aenter__(self) -> AsyncOpenAI:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        routes = f" routes={sorted(self._router.routes)!r}" if self._router.routes else ""
        return f"<llmroute.AsyncOpenAI base_url={str(self.base_url)!r}{routes}>"

    # -- requests --------------------------------------------------------------------------

    async def _auth_headers(self) -> dict[str, str]:
        if self._api_key_provider is not None:
            key = self._api_key_provider()
            self._api_key = await key if inspect.isawaitable(key) else key  # type: ignore[assignment]
        if not self._api_key:
            return {}
        return {"Authorization": f"Bearer {self._api_key}"}

    def _cache_response(self, route: Route | None, *, stream: bool) -> httpx.Response:
        """The response object of an answer the cache gave (no HTTP exchange took place)."""
        url = (
            f"llmroute://route/{route.name}"
            if route is not None
            else str(self.base_url.join("chat/completions"))
        )
        kind = "text/event-stream" if stream else "application/json"
        return httpx.Response(
            200,
            headers={"content-type": kind, "x-llmroute-cache": "hit"},
            request=httpx.Request("POST", url),
        )

    async def _cache_request(
        self,
        body: Mapping[str, Any],
        route: Route | None,
        extra_headers: Mapping[str, str | None] | None,
    ) -> CacheRequest | None:
        """What the cache may do for this request (``None``: nothing), from the config and
        the ``x-llmroute-cache*`` headers of the client and the call."""
        settings = self._cache_settings
        if settings is None:
            return None
        options: dict[str, str] = {}
        for source in (self._custom_headers, extra_headers or {}):
            for name, value in source.items():
                lower = name.lower()
                if lower.startswith(CACHE_HEADER):
                    if value is None or not _given(value):
                        options.pop(lower, None)
                    else:
                        options[lower] = str(value).strip()
        mode = _header_choice(options, CACHE_HEADER, settings.mode, _CACHE_MODES)
        if mode == "off" or (mode == "auto" and not is_deterministic(body)):
            return None
        replay = _header_choice(options, CACHE_REPLAY_HEADER, settings.replay, _REPLAY_MODES)
        namespace = options.get(CACHE_NAMESPACE_HEADER) or settings.namespace
        if namespace is None:
            # Whoever the request would be sent as: the keys and organization each target
            # gets, after the call's own headers.
            if route is not None:
                sent = [self._provider_headers(self._providers[t.provider]) for t in route.targets]
            else:
                sent = [{**self.default_headers, **await self._auth_headers()}]
            who = [_credentials(_merge_headers(headers, extra_headers)) for headers in sent]
            namespace = _tenant_namespace(*(c for credentials in who for c in credentials))
        elif not NAMESPACE_PATTERN.fullmatch(namespace):
            raise ConfigError(
                f"{CACHE_NAMESPACE_HEADER}: expected 1 to 64 letters, digits, '.', '_' or '-', "
                f"got {namespace[:80]!r}"
            )
        # A route's answers are its targets'; a plain model's are its base URL's.
        if route is not None:
            model = f"route:{route.name}:{','.join(sorted(t.name for t in route.targets))}"
        else:
            model = f"{self.base_url}{body['model']}"
        stream = bool(body.get("stream"))
        asked = body.get("stream_options")
        usage = stream and isinstance(asked, Mapping) and bool(asked.get("include_usage"))
        writes = mode != "read-only"
        return CacheRequest(
            key=request_key(body, model=model, namespace=namespace),
            stream=stream,
            include_usage=usage,
            read=True,
            write=writes,
            share=writes and settings.single_flight,
            paced=replay == "paced",
        )

    def _provider_headers(self, provider: ResolvedProvider) -> dict[str, str]:
        if provider.spec.protocol == "anthropic":
            key = provider.api_key or ""
            agent = {"User-Agent": f"llmroute/{__version__} (openai-compatible)"}
            return {**agent, **anthropic.headers(key), **provider.headers}
        headers = {
            "Accept": "application/json",
            "Content-Type": "application/json",
            "User-Agent": f"llmroute/{__version__} (openai-compatible)",
            **provider.headers,
        }
        if provider.api_key:
            headers["Authorization"] = f"Bearer {provider.api_key}"
        return headers

    async def _build_request(
        self,
        path: str,
        body: dict[str, Any],
        *,
        extra_headers: Mapping[str, str | None] | None,
        extra_query: Mapping[str, object] | None,
        timeout: Any,
        provider: ResolvedProvider | None = None,
        continuation: bool = False,
    ) -> httpx.Request:
        if provider is None:
            if self._missing_key:
                raise OpenAIError(
                    f"model {body.get('model')!r} is not a route of the config, and no default "
                    "provider is set: set default_provider in the config, or the api_key client "
                    "option, or the OPENAI_API_KEY environment variable"
                )
            base_url = self.base_url
            headers: dict[str, str] = {**self.default_headers, **await self._auth_headers()}
        else:
            base_url = provider.base_url
            if continuation and provider.spec.continuation and provider.spec.continuation.base_url:
                base_url = _check_base_url(provider.spec.continuation.base_url)
            headers = self._provider_headers(provider)
        _merge_headers(headers, extra_headers)
        # The client's default headers and query belong to its own base URL; a routed provider
        # gets its configured headers, and only what the call itself adds.
        defaults = self._custom_query if provider is None else {}
        params = {**defaults, **(extra_query or {})}
        try:
            content = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        except RecursionError:
            raise RequestBodyError(
                "The request body is nested too deeply to be encoded as JSON"
            ) from None
        except ValueError as exc:  # a circular reference, a number too long to print
            raise RequestBodyError(f"The request body cannot be encoded as JSON: {exc}") from None
        limits = self.timeout if not _given(timeout) else _to_timeout(timeout)
        # Plain values: a user's http_client may be an httpx2 client (openai >= 3 makes those).
        return self._client.build_request(
            "POST",
            str(base_url.join(path)),
            content=content,
            headers=headers,
            params=cast(Any, params) or None,
            timeout=(limits.connect, limits.read, limits.write, limits.pool),
        )

    async def _send(
        self, request: httpx.Request, *, read_body: bool, retries_done: int = 0
    ) -> tuple[httpx.Response, Timings]:
        """Send with retries on connection errors, timeouts and retryable statuses.

        Up to the response headers for a stream (the stream itself retries a failure that comes
        before its first token), up to the whole body otherwise (which ``read_body`` reads).
        ``retries_done`` retries were already spent on this request.
        """

        def retryable(exc: BaseException) -> bool:
            if isinstance(exc, APIStatusError):
                return should_retry_status(exc.status_code, exc.response.headers, now=time.time())
            return isinstance(exc, APIConnectionError)

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            headers = exc.response.headers if isinstance(exc, APIStatusError) else None
            delay = retry_delay(
                retries_done=retries_done + state.attempt_number - 1,
                max_retries=self.max_retries,
                headers=headers,
                now=time.time(),
                rand=random.random(),
            )
            log.info("Retrying request to %s in %f seconds", request.url.path, delay)
            return delay

        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.max_retries + 1 - retries_done),
            wait=wait,
            retry=retry_if_exception(retryable),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                response, timings = await self._send_once(request, read_body=read_body)
                timings.retries = retries_done + attempt.retry_state.attempt_number - 1
                return response, timings
        raise AssertionError("unreachable")  # pragma: no cover

    async def _retry_stream(
        self, request: httpx.Request, retries_done: int, error: Exception
    ) -> tuple[httpx.Response, Timings] | None:
        """Send a stream's request again after it failed before its first token.

        ``None`` when no retry is left; otherwise the new response, after openai's backoff.
        """
        if retries_done >= self.max_retries:
            return None
        delay = retry_delay(
            retries_done=retries_done,
            max_retries=self.max_retries,
            headers=None,
            now=time.time(),
            rand=random.random(),
        )
        log.info(
            "Retrying request to %s in %f seconds (%s before the first token)",
            request.url.path,
            delay,
            type(error).__name__,
        )
        await anyio.sleep(delay)
        return await self._send(request, read_body=False, retries_done=retries_done + 1)

    async def _send_once(
        self, request: httpx.Request, *, read_body: bool
    ) -> tuple[httpx.Response, Timings]:
        started = time.monotonic()
        timings = Timings(started_at=started)
        with map_transport_errors(request):
            response = await self._client.send(request, stream=True)
        timings.headers = time.monotonic() - started
        ext = response.extensions
        timings.connection_reused = ext.get("llmroute.connection_reused")
        timings.connect = ext.get("llmroute.connect_time")
        version = ext.get("http_version")
        timings.http_version = version.decode() if isinstance(version, bytes) else None
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


class AsyncChat:
    def __init__(self, client: AsyncOpenAI) -> None:
        self.completions = AsyncCompletions(client)


class AsyncCompletions:
    """``client.chat.completions``: every parameter of openai's ``create`` is passed through."""

    def __init__(self, client: AsyncOpenAI) -> None:
        self._client = client

    @functools.cached_property
    def with_raw_response(self) -> AsyncChatCompletionsWithRawResponse:
        """The same calls, returning the raw response (headers, status; ``parse()``)."""
        return AsyncChatCompletionsWithRawResponse(self)

    @functools.cached_property
    def with_streaming_response(self) -> AsyncChatCompletionsWithStreamingResponse:
        """The same calls as ``async with`` blocks giving a response read as asked."""
        return AsyncChatCompletionsWithStreamingResponse(self)

    @overload
    async def create(
        self,
        *,
        messages: Iterable[Any],
        model: str,
        stream: Literal[False] | NotGiven | Omit | None = ...,
        extra_headers: Mapping[str, str | None] | None = None,
        extra_query: Mapping[str, object] | None = None,
        extra_body: Mapping[str, object] | None = None,
        timeout: Any = ...,
        **params: Any,
    ) -> ChatCompletion: ...

    @overload
    async def create(
        self,
        *,
        messages: Iterable[Any],
        model: str,
        stream: Literal[True],
        extra_headers: Mapping[str, str | None] | None = None,
        extra_query: Mapping[str, object] | None = None,
        extra_body: Mapping[str, object] | None = None,
        timeout: Any = ...,
        **params: Any,
    ) -> AsyncStream[ChatCompletionChunk]: ...

    @overload
    async def create(
        self,
        *,
        messages: Iterable[Any],
        model: str,
        stream: bool,
        extra_headers: Mapping[str, str | None] | None = None,
        extra_query: Mapping[str, object] | None = None,
        extra_body: Mapping[str, object] | None = None,
        timeout: Any = ...,
        **params: Any,
    ) -> ChatCompletion | AsyncStream[ChatCompletionChunk]: ...

    async def create(
        self,
        *,
        messages: Iterable[Any],
        model: str,
        stream: bool | NotGiven | Omit | None = _NOT_GIVEN,
        extra_headers: Mapping[str, str | None] | None = None,
        extra_query: Mapping[str, object] | None = None,
        extra_body: Mapping[str, object] | None = None,
        timeout: Any = _NOT_GIVEN,
        **params: Any,
    ) -> ChatCompletion | AsyncStream[ChatCompletionChunk]:
        """Create a chat completion; with ``stream=True`` an :class:`AsyncStream` of chunks."""
        body: dict[str, Any] = {"messages": messages, "model": model}
        if _given(stream):
            body["stream"] = stream
        body.update((key, value) for key, value in params.items() if _given(value))
        if isinstance(body["messages"], Iterable) and not isinstance(body["messages"], list):
            body["messages"] = list(body["messages"])
        if extra_body:
            body.update(extra_body)
        client = self._client
        router = client._router
        route = router.routes.get(model)
        telemetry = client._metrics.begin(
            model,
            body,
            stream=bool(body.get("stream")),
            host=None if route is not None else client.base_url.host,
        )
        try:
            result = await self._create(
                client, router, route, body, extra_headers, extra_query, timeout
            )
        except BaseException as exc:
            telemetry.failed(exc)
            raise
        if isinstance(result, AsyncStream):
            result._on_end = telemetry.stream_ended
        else:
            telemetry.completed(result)
        return result

    async def _create(
        self,
        client: AsyncOpenAI,
        router: Router,
        route: Route | None,
        body: dict[str, Any],
        extra_headers: Mapping[str, str | None] | None,
        extra_query: Mapping[str, object] | None,
        timeout: Any,
    ) -> ChatCompletion | AsyncStream[ChatCompletionChunk]:
        async def live() -> ChatCompletion | AsyncStream[ChatCompletionChunk]:
            if route is not None:
                return await self._create_routed(
                    router, route, body, extra_headers, extra_query, timeout
                )
            return await self._create_direct(body, extra_headers, extra_query, timeout)

        if client._cache is not None:
            cached = await client._cache_request(body, route, extra_headers)
            if cached is not None:
                result = await self._create_cached(client._cache, cached, body, route, live)
                if isinstance(result, ChatCompletion) and not has_response(result):
                    attach_response(result, client._cache_response(route, stream=False))
                return result
        return await live()

    async def _create_direct(
        self,
        body: dict[str, Any],
        extra_headers: Mapping[str, str | None] | None,
        extra_query: Mapping[str, object] | None,
        timeout: Any,
    ) -> ChatCompletion | AsyncStream[ChatCompletionChunk]:
        """A request for a model name that is not a route: the client's own base URL."""
        client = self._client
        request = await client._build_request(
            "chat/completions",
            body,
            extra_headers=extra_headers,
            extra_query=extra_query,
            timeout=timeout,
        )
        target = request.url.host
        stream = bool(body.get("stream"))
        response, timings = await client._send(request, read_body=not stream)
        if stream:
            return AsyncStream(
                response=response,
                timings=timings,
                new_decoder=lambda: ChatStreamDecoder(request=request, target=target),
                retry=lambda done, exc: client._retry_stream(request, done, exc),
            )
        completion = parse_chat_completion(
            response.content, request=request, target=target, response=response
        )
        if isinstance(completion, ChatCompletion):
            usage = completion.usage
            timings.tokens = usage.completion_tokens if usage is not None else 0
            completion._request_id = response.headers.get("x-request-id")
            object.__setattr__(completion, "timings", timings)
            object.__setattr__(completion, "route", None)  # not a route, as stream.route
        attach_response(completion, response, timings.retries)
        return completion

    async def _create_routed(
        self,
        router: Router,
        route: Any,
        body: dict[str, Any],
        extra_headers: Mapping[str, str | None] | None,
        extra_query: Mapping[str, object] | None,
        timeout: Any,
    ) -> ChatCompletion | AsyncStream[ChatCompletionChunk]:
        """A request for a route: the engine picks, hedges, fails over and continues."""
        client = self._client
        sync = client._stats_sync
        if sync is not None and sync.due():
            spawn(sync.sync, name="stats sync")
        client._servers.poll(router, client._providers)

        async def send(
            target: RouteTarget, body: dict[str, Any], *, stream: bool, continuation: bool
        ) -> tuple[httpx.Response, Timings]:
            path = "chat/completions"
            if target.protocol == "anthropic":
                path, body = "messages", anthropic.translate_request(body, target=target.name)
            request = await client._build_request(
                path,
                body,
                extra_headers=extra_headers,
                extra_query=extra_query,
                timeout=timeout,
                provider=client._providers[target.provider],
                continuation=continuation,
            )
            return await client._send_once(request, read_body=not stream)

        if body.get("stream"):
            routed = await router.stream(route, body, send)
            return AsyncStream._from_route(routed)
        done = await router.complete(route, body, send)
        completion = done.completion
        if isinstance(completion, ChatCompletion):
            usage = completion.usage
            done.timings.tokens = usage.completion_tokens if usage is not None else 0
            completion._request_id = done.response.headers.get("x-request-id")
            object.__setattr__(completion, "timings", done.timings)
            object.__setattr__(completion, "route", done.report)
        attach_response(completion, done.response, done.timings.retries)
        return completion

    async def _create_cached(
        self,
        cache: ResponseCache,
        request: CacheRequest,
        body: dict[str, Any],
        route: Route | None,
        live: Callable[[], Awaitable[ChatCompletion | AsyncStream[ChatCompletionChunk]]],
    ) -> ChatCompletion | AsyncStream[ChatCompletionChunk]:
        """A request the cache may answer: a stored answer, a shared call, or a live one."""
        started = time.monotonic()
        model = body["model"]
        policy = route.policy.name if route is not None else "direct"
        hit = await cache.lookup(request) if request.read else None
        if hit is not None:
            report = RouteReport(route=model, policy=policy, cache_hit=True)
            timings = Timings(started_at=started)
            response = self._client._cache_response(route, stream=request.stream)
            if hit.completion is None:
                return AsyncStream._from_chunks(
                    cache.replay(hit, request), response=response, timings=timings, route=report
                )
            _attach(hit.completion, timings, report, started)
            return hit.completion
        if not request.share and not request.write:
            return await live()
        seat, leader = cache.join(request, live)
        try:
            result = await seat.opened()
        except BaseException:
            seat.leave()
            raise
        shared = None if leader else _shared_report(result, model, policy)
        if request.stream:
            stream = AsyncStream._from_chunks(
                seat.chunks(),
                response=result.response,
                timings=result.timings if leader else Timings(started_at=started),
                route=result.route if leader else shared,
                on_close=seat.leave,
                measure=not leader,
                complete=lambda: seat.flight.complete,
            )
            return stream
        seat.leave()
        if leader:
            return result
        completion = result.model_copy(deep=True)  # each caller may change its own
        _attach(completion, Timings(started_at=started), shared, started)
        return completion


def _attach(
    completion: ChatCompletion, timings: Timings, report: RouteReport | None, started: float
) -> None:
    """Give a completion that did not come from its own call its timings and route report."""
    timings.first_byte = timings.first_token = timings.total = time.monotonic() - started
    usage = completion.usage
    timings.tokens = usage.completion_tokens if usage is not None else 0
    object.__setattr__(completion, "timings", timings)
    object.__setattr__(completion, "route", report)


def _shared_report(result: object, model: str, policy: str) -> RouteReport:
    """The route report of a request that read an identical request's call."""
    own = getattr(result, "route", None)
    if isinstance(own, RouteReport):
        return dataclasses.replace(own, attempts=list(own.attempts), shared=True)
    return RouteReport(route=model, policy=policy, shared=True)
