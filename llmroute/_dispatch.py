"""The seam: what happens to a call whose model name is a route (and to every chat call).

:class:`Dispatch` is the state one client shares with its copies (``with_options``): the
resolved config, the routing engine and its live stats, the cache, the transport and the
upstream request builder. The client's ``request()`` hands it openai's request options; it
answers with an :class:`Outcome` (the result, the HTTP response behind it, the retries) that the
client wraps in openai's own response classes. It calls only downward: cache, routing engine,
upstream requests, protocols, transport.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
import httpx
from openai import NOT_GIVEN
from openai._constants import RAW_RESPONSE_HEADER
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from ._background import spawn
from ._config import (
    CacheSettings,
    Config,
    ConfigError,
    ResolvedProvider,
    RouteConfig,
    Target,
    resolve,
    resolve_provider,
    route_config,
)
from ._errors import (
    AllTargetsFailed,
    APIConnectionError,
    APIStatusError,
    BadRequestError,
    OpenAIError,
    describe_error,
    map_transport_errors,
)
from ._model_names import check_model_name
from ._routes import ServerPolling, build_router, route_for, stats_sync_for
from ._simulated import SimulatedProviders
from ._streaming import AsyncStream
from ._tiers import Conversation, TieredModel, TierError, conversation_of
from ._timeouts import RequestTimeouts, TimeoutHeaderError, request_timeouts, with_timeouts
from ._types import AttemptReport, RouteReport, TierDecision, Timings
from ._upstream import (
    Upstream,
    credentials,
    merge_headers,
    no_cookies,
    proxy_for,
)
from .cache import (
    NAMESPACE_PATTERN,
    CacheRequest,
    CacheUnavailable,
    Hit,
    ResponseCache,
    is_deterministic,
    open_cache,
    request_key,
)
from .cache import tenant_namespace as _tenant_namespace
from .cache._flight import Flight
from .metrics import ClientMetrics
from .protocols import adapter_for
from .routing.backoff import retry_delay, should_retry_status
from .routing.goal import TTFT_TARGET_HEADER, GoalError, LatencyGoal, read_goal
from .routing.policies import (
    WeightedPolicy,
)
from .routing.route import Route, Sender
from .routing.stats import TargetSnapshot
from .routing.tierhedge import HEDGE_QUANTILE, tier_hedge_route
from .routing.trials import TRIAL_TIMEOUT, CircuitTrials
from .transport import Transport

__all__ = ["CACHE_HEADER", "Call", "Dispatch", "Outcome", "Posted"]

log = logging.getLogger("llmroute")

CACHE_HEADER = "x-llmroute-cache"
"""Per request (``extra_headers``) or per client (``default_headers``): ``auto``, ``on``,
``read-only`` or ``off``; never sent upstream, like every ``x-llmroute-*`` header."""
CACHE_NAMESPACE_HEADER = "x-llmroute-cache-namespace"
CACHE_REPLAY_HEADER = "x-llmroute-cache-replay"
_CACHE_MODES = ("auto", "on", "read-only", "off")
_REPLAY_MODES = ("immediate", "paced")
_STATEFUL = ("previous_response_id", "conversation", "background")
"""Responses API fields whose answer depends on what the vendor keeps (never cached)."""

LOOKED_UP: contextvars.ContextVar[tuple[str, Flight | None] | None] = contextvars.ContextVar(
    "llmroute_looked_up", default=None
)
"""The cache key a call was already looked up under, and missed, before openai's machinery
built its request (:meth:`Dispatch.from_cache`), with the identical call that was pending then
(:meth:`ResponseCache.pending`): the seam does not look the key up twice, unless an identical
call ended or was stored in between (:meth:`ResponseCache.after_miss`)."""

ROUTABLE = {
    "chat/completions": "chat",
    "responses": "responses",
    "completions": "completions",
    "embeddings": "embeddings",
}
"""The endpoints (relative to the base URL) where a model name may be a route, by kind."""


@dataclass
class Call:
    """One call of openai's machinery that llmroute serves itself."""

    kind: str
    """"chat", "responses", "completions" or "embeddings"."""
    path: str
    route: Route | None
    """``None``: a chat call for a model name that is not a route (the client's base URL)."""
    body: dict[str, Any]
    stream: bool
    headers: Mapping[str, Any]
    """The call's own headers (``extra_headers``)."""
    query: Mapping[str, object] | None
    timeout: httpx.Timeout
    client_headers: Mapping[str, str] = field(default_factory=dict)
    """The client's ``default_headers`` as given (llmroute reads its ``x-llmroute-*`` ones)."""
    sent_headers: Mapping[str, str] = field(default_factory=dict)
    """What a direct call is sent with (the client's default and auth headers)."""
    signed_late: bool = False
    """A direct call whose credentials only openai's machinery knows, as it sends the request
    (an API key provider, a workload identity, a cloud provider's signing): ``sent_headers``
    do not say who asks, so the cache answers it only in a namespace the call names."""
    base_url: str = ""
    http: Any = None
    """The application's own async HTTP client (``http_client=``), which routed calls use
    too; ``None``: llmroute's transport."""
    goal_options: object = None
    """The call's ``extra_body={"llmroute": {...}}`` options, taken out of the body (never
    sent upstream); read by :meth:`Dispatch.goal`."""
    tiered: TierCall | None = None
    """A call for a tiered model name: ``route`` is its default tier until the decision."""
    trace: Any = None
    """The call's trace (``metrics._traceparent.RequestTrace``): its attempts' traceparent."""


@dataclass
class TierCall:
    """What a call for a tiered model name needs to choose its tier (:meth:`Dispatch.tier`)."""

    model: TieredModel
    forced: str | None
    """The route the call's ``llmroute.tier`` option named, if any."""
    own: RequestTimeouts
    timeout: httpx.Timeout
    """The call's HTTP timeout before its route's were applied."""
    decision: TierDecision | None = None
    conversation: Conversation | None = None
    """A chat call's conversation (hashes of its messages), for stickiness."""


class Posted:
    """openai's request options as the seam reads them, for a call that has not been through
    openai's machinery (the client's early cache check, the gateway's hand-off): a POST of a
    JSON body, with the call's own headers, no query, the client's timeout."""

    __slots__ = ("headers", "json_data", "url")
    method = "post"
    extra_json = None
    params = None
    timeout: Any = NOT_GIVEN
    post_parser: Any = NOT_GIVEN

    def __init__(
        self, url: str, json_data: dict[str, Any], headers: Mapping[str, str] | None = None
    ) -> None:
        self.url = url
        self.json_data = json_data
        self.headers = headers


@dataclass
class Outcome:
    """What a routed call produced: ``result`` (``None``: openai's machinery parses
    ``response``), the HTTP response behind it and the retries taken."""

    result: Any
    response: httpx.Response
    retries: int = 0


def _header_choice(
    options: Mapping[str, str], header: str, default: str, choices: tuple[str, ...]
) -> str:
    value = options.get(header)
    if value is None:
        return default
    if value.lower() not in choices:
        raise ConfigError(f"{header}: expected one of {', '.join(choices)}, got {value[:80]!r}")
    return value.lower()


def _serves(provider: ResolvedProvider, kind: str) -> bool:
    """Whether ``provider`` serves the endpoint ``kind`` (chat is served by every one)."""
    if kind == "chat":
        return True
    if not adapter_for(provider.spec.protocol).serves(kind):
        return False
    if kind == "responses":
        return provider.spec.responses
    return True


def attach(
    completion: Any, timings: Timings, report: RouteReport | None, started: float | None = None
) -> None:
    """Give a completion its timings and route report (``started``: measured until now)."""
    if started is not None:
        timings.first_byte = timings.first_token = timings.total = time.monotonic() - started
    usage = getattr(completion, "usage", None)
    tokens = getattr(usage, "completion_tokens", None) or getattr(usage, "output_tokens", 0)
    timings.tokens = tokens if isinstance(tokens, int) else 0
    object.__setattr__(completion, "timings", timings)
    object.__setattr__(completion, "route", report)


@functools.lru_cache(maxsize=64)
def _host_of(base_url: str) -> str:
    return httpx.URL(base_url).host


@functools.lru_cache(maxsize=64)
def _answer_response(where: str, stream: bool) -> httpx.Response:
    """The response of a cached answer, as a template (see :meth:`Dispatch._cache_response`)."""
    kind = "text/event-stream" if stream else "application/json"
    return httpx.Response(
        200, headers={"content-type": kind, CACHE_HEADER: "hit"}, request=_answer_request(where)
    )


@functools.lru_cache(maxsize=64)
def _answer_request(where: str) -> httpx.Request:
    """The request a cached answer's response names (no HTTP exchange took place): a route's
    URL, or a base URL's chat endpoint. Built once per URL: parsing it was most of a
    memory-cache hit's time in llmroute."""
    url = httpx.URL(where)
    return httpx.Request("POST", url if url.scheme == "llmroute" else url.join("chat/completions"))


def _shared_report(result: object, model: str, policy: str) -> RouteReport:
    """The route report of a request that read an identical request's call."""
    own = getattr(result, "route", None)
    if isinstance(own, RouteReport):
        return dataclasses.replace(own, attempts=list(own.attempts), shared=True)
    return RouteReport(route=model, policy=policy, shared=True)


class Dispatch:
    """Routes, stats, cache and connections of one client and its copies."""

    def __init__(
        self,
        config: Config | None,
        *,
        verify: Any = True,
        max_retries: int = 2,
    ) -> None:
        self.simulated = SimulatedProviders(config)
        """The config's simulated providers, running until :meth:`aclose`."""
        try:
            resolved = resolve(
                config if config is not None else Config(), simulated=self.simulated.addresses
            )
        except BaseException:
            self.simulated.stop()
            raise
        self.config = config
        """The config this state was built from (a copy given a new ``verify`` reuses it)."""
        self.configured = config is not None
        self.resolved = resolved
        self.providers: dict[str, ResolvedProvider] = (
            dict(resolved.providers) if config is not None else {}
        )
        self.router = build_router(resolved, max_retries=max_retries)
        self.metrics = ClientMetrics(self.router.snapshot, trials=lambda: self.trials.verdicts)
        self.servers = ServerPolling()
        self.stats_sync = stats_sync_for(resolved, self.router) if config is not None else None
        self.cache: ResponseCache | None = None
        self.cache_settings: CacheSettings | None = None
        if config is not None and resolved.cache is not None and resolved.cache.backend != "off":
            try:
                self.cache = open_cache(resolved.cache, resolved.redis)
                self.cache_settings = resolved.cache
            except CacheUnavailable as exc:
                log.warning("cache: %s; the client runs without a cache", exc)
        self.verify = verify
        self.transport = Transport(
            verify=verify,
            verify_by_origin=resolved.verify_by_origin(),
            max_connections=resolved.connections.max_per_origin,
            max_streams_per_connection=resolved.connections.max_streams,
        )
        # Routed calls keep no cookies: a vendor's Set-Cookie never rides on another call.
        self.http = httpx.AsyncClient(transport=self.transport, timeout=None, cookies=no_cookies())
        self.upstream = Upstream(self.providers, self.http, self.transport)
        self.trial_http: Any = None
        """The application's own ``http_client`` (the first one given), which trials use too."""
        self.trials = CircuitTrials(
            self.router,
            self._trial_sender,
            keyed=lambda target: bool(self.providers[target.provider].api_key),
        )
        self.tiered = {name: TieredModel(s) for name, s in resolved.tiered.items()}
        """Tiered model names (docs/tiers.md), each with its classifier, built on first use."""
        self.tier_hedges: dict[tuple[str, str], Route] = {}
        """The routes that hedge an unsure call across two tiers, by (smaller, larger)."""
        self.warm_urls: dict[str, httpx.URL] = {}
        self.pins: dict[str, str] = {}
        """Responses API ids by the target that holds them (``previous_response_id``)."""
        self.closed = False

    def _trial_sender(self, kind: str) -> Sender:
        """What a trial of a call of ``kind`` is sent with: that kind's endpoint, the
        provider's key and headers (no caller's), the application's client if it gave one."""
        path = next((path for path, k in ROUTABLE.items() if k == kind), "chat/completions")
        timeout = httpx.Timeout(TRIAL_TIMEOUT)
        return self.upstream.sender(
            headers=None, query=None, timeout=timeout, path=path, http=self.trial_http
        )

    @property
    def default_provider(self) -> ResolvedProvider | None:
        name = self.resolved.default_provider if self.configured else None
        return self.providers.get(name) if name is not None else None

    def http_client(self, base_url: httpx.URL, timeout: Any) -> httpx.AsyncClient:
        """The ``httpx.AsyncClient`` openai's machinery sends with: llmroute's transport,
        or, when the environment sets a proxy for ``base_url``, httpx's own with the proxy."""
        proxy = proxy_for(base_url)
        if proxy is not None:
            log.warning(
                "A proxy is configured for %s: requests go through httpx's own transport "
                "and the proxy, without llmroute's stream resets and per-stream deadlines",
                base_url.host,
            )
            from .transport import make_ssl_context

            client = httpx.AsyncClient(
                proxy=proxy, verify=make_ssl_context(self.verify), timeout=timeout
            )
        else:
            client = httpx.AsyncClient(
                transport=self.transport, timeout=timeout, follow_redirects=True
            )
        client._llmroute_owned = True  # type: ignore[attr-defined]
        client._llmroute_of = self  # type: ignore[attr-defined]  # (a copy of its own builds its own)
        return client

    # -- which calls are llmroute's ----------------------------------------------------------

    def classify(self, options: Any, *, timeout: httpx.Timeout) -> Call | None:
        """The call llmroute serves for openai's request ``options``, or ``None`` (openai's
        machinery sends it). A route on an endpoint that cannot be routed is a
        :class:`BadRequestError`, never a request to the client's base URL."""
        if str(options.method).lower() != "post":
            return None
        body = options.json_data
        if not isinstance(body, Mapping):
            return None
        model = body.get("model")
        path = str(options.url).lstrip("/")
        kind = ROUTABLE.get(path)
        route = self.router.routes.get(model) if isinstance(model, str) else None
        tiered = None
        if route is None and self.tiered and isinstance(model, str):
            tiered = self.tiered.get(model)
        if tiered is not None:
            route = self.router.routes[tiered.default]  # until the decision (tier())
        # llmroute's own options leave the body before anything can return: a call openai's
        # machinery sends (a plain model, an endpoint llmroute does not route) never carries them
        goal_options = _take_own_options(options)
        body = options.json_data
        goal_options, forced = _tier_option(goal_options, tiered, model)
        if kind is None:
            if route is not None:
                raise _bad_request(
                    f"model {model!r} is a route of llmroute's config; /{path} cannot be routed "
                    "(routes serve chat/completions, responses, completions and embeddings): "
                    "use a model name of the provider",
                    param="model",
                )
            return None
        if route is None and isinstance(model, str) and self.configured:
            # A typo of a route ("caht") must not leave the machine for the default provider.
            names = [*self.router.routes, *self.tiered] if self.tiered else self.router.routes
            check_model_name(model, names, self.resolved.unknown_models)
        if route is None and kind != "chat":
            return None
        merged: dict[str, Any] = dict(body)
        if isinstance(options.extra_json, Mapping):
            merged.update(options.extra_json)
        if forced is not None:
            route = self.router.routes[forced]  # (completions and embeddings too)
        headers = dict(options.headers) if isinstance(options.headers, Mapping) else {}
        tier_call = None
        if route is not None:
            self._check_servable(route, kind, path)
            try:
                own = request_timeouts(headers)
            except TimeoutHeaderError as exc:
                raise _bad_request(str(exc), param=exc.header) from None
            if tiered is not None:
                tier_call = TierCall(tiered, forced, own, timeout)
            route, timeout = with_timeouts(route, timeout, own)
        return Call(
            kind=kind,
            path=path,
            route=route,
            body=merged,
            stream=bool(merged.get("stream")),
            headers=headers,
            query=dict(options.params) if isinstance(options.params, Mapping) else None,
            timeout=timeout,
            goal_options=goal_options,
            tiered=tier_call,
        )

    def _check_servable(self, route: Route, kind: str, path: str) -> None:
        able = [t for t in route.targets if _serves(self.providers[t.provider], kind)]
        if not able:
            names = ", ".join(t.name for t in route.targets)
            raise _bad_request(
                f"route {route.name!r} cannot serve /{path}: none of its targets ({names}) "
                f"serves the {kind} API (see the providers' `{kind}` capability in the catalog)",
                param="model",
            )

    # -- chat: the cache, then the route or the client's base URL ----------------------------

    def goal(self, call: Call) -> LatencyGoal | None:
        """The call's latency goal: its ``llmroute`` body options over the
        ``x-llmroute-ttft-target-ms`` header (the call's over the client's). A wrong name,
        type or value is a ``BadRequestError`` naming it, raised before anything is sent."""
        header = None
        for source in (call.client_headers, call.headers):
            for name, value in source.items():
                if name.lower() == TTFT_TARGET_HEADER and value is not None:
                    header = value
        try:
            return read_goal(call.goal_options, header)
        except GoalError as exc:
            raise _bad_request(str(exc), param=exc.param) from None

    async def answer(self, call: Call, live: Callable[[], Awaitable[Any]]) -> Outcome | Any:
        """A chat call, or a Responses call on a route: the cache if it may answer, else
        ``live()`` (a direct chat call, openai's machinery) or the route's engine. Metrics
        count it either way."""
        self.goal(call)  # a wrong option fails here, before the cache or any request
        decision = await self.tier(call)
        if decision is not None:
            self.metrics.tier_decided(decision)
        telemetry = self._telemetry(call)
        call.trace = telemetry.trace
        try:
            result = await self._answer(call, live)
        except BaseException as exc:
            self._served(call, exc)  # AllTargetsFailed's report
            telemetry.failed(exc)
            raise
        self._served(call, result)
        _observe(telemetry, result)
        return result

    async def tier(self, call: Call) -> TierDecision | None:
        """For a call of a tiered model name: classify its body (the classifier built on first
        use, in a worker thread) and put its tier's route on the call, as a call for that
        route would have it. Never raises for the classifier's sake (docs/tiers.md)."""
        choice = call.tiered
        if choice is None:
            return None
        if choice.decision is None:
            if choice.forced is None and not choice.model.ready:
                await choice.model.prepare()
            model = choice.model
            held = self._conversation_tier(call, model) if choice.forced is None else None
            if held is not None:  # a follow-up goes where its conversation is kept
                decision = model.conversation(held)
            else:
                if call.kind == "chat":
                    try:
                        choice.conversation = conversation_of(call.body)
                    except Exception:  # pragma: no cover - a body it cannot hash: no stickiness
                        log.debug("tiers: a chat body's conversation could not be hashed")
                goal = self.goal(call)
                target = goal.ttft_target if goal is not None else None
                decision = model.decide(
                    call.body,
                    choice.forced,
                    conversation=choice.conversation,
                    ttft_target=target,
                    p95=None if target is None else functools.partial(self._tier_p95, call),
                )
            route = self.router.routes[decision.tier]
            why = self._cannot_serve(call, route)
            if why is None and decision.hedged is not None:
                larger = self.router.routes[decision.hedged[1]]
                why = self._cannot_serve(call, larger)
                if why is None:
                    route = self._hedge_route(route, larger)
            if why is not None and (decision.tier != model.default or decision.hedged):
                decision = dataclasses.replace(  # the default tier serves it (classify() checked)
                    decision, tier=model.default, reason="default", error=why, hedged=None
                )
                route = self.router.routes[decision.tier]
            call.route, call.timeout = with_timeouts(route, choice.timeout, choice.own)
            choice.decision = decision
        return choice.decision

    def _tier_p95(self, call: Call, tier: str) -> float:
        """A tier's live p95 TTFT (of the whole answer for a call not streamed) for this call."""
        route = self.router.routes[tier]
        return self.router.predict_route(
            route, call.body, HEDGE_QUANTILE, kind=call.kind, stream=call.stream
        )

    def _hedge_route(self, small: Route, large: Route) -> Route:
        """The route that hedges an unsure call from ``small`` to ``large`` (built once)."""
        key = (small.name, large.name)
        route = self.tier_hedges.get(key)
        if route is None:
            route = self.tier_hedges[key] = tier_hedge_route(small, large)
        return route

    def _served(self, call: Call, result: Outcome | Any) -> TierDecision | None:
        """A tiered call's decision once answered (or failed), put on its route report: a
        hedged call's ``tier`` is the one whose target won; a chat turn's tier is
        remembered for its conversation's follow-ups."""
        choice = call.tiered
        decision = choice.decision if choice is not None else None
        if choice is None or decision is None:
            return None
        value = result.result if isinstance(result, Outcome) else result
        report = getattr(value, "route", None)
        if not isinstance(report, RouteReport):
            report = getattr(value, "report", None)
        if decision.hedged is not None and isinstance(report, RouteReport):
            larger = self.router.routes[decision.hedged[1]]
            won = report.winner is not None and report.winner != "cache"
            if won and not any(
                t.name == report.winner for t in self.router.routes[decision.tier].targets
            ):
                if any(t.name == report.winner for t in larger.targets):
                    decision = dataclasses.replace(decision, tier=larger.name)
            if won:
                self.metrics.tier_hedge_answered(decision)
            if call.route is not None and report.route == call.route.name:
                report.route = decision.tier  # the hedge route's name: the tier that served
        if isinstance(report, RouteReport):
            report.tier = decision
        if not isinstance(result, BaseException):
            choice.model.remember(choice.conversation, decision)
        return decision

    def _conversation_tier(self, call: Call, model: TieredModel) -> str | None:
        """The tier whose route holds the response a Responses call continues (its
        ``previous_response_id`` pinned to one of that route's targets), if any."""
        previous = call.body.get("previous_response_id") if call.kind == "responses" else None
        pinned = self.pins.get(previous) if isinstance(previous, str) else None
        if pinned is None:
            return None
        routes = self.router.routes
        order = [model.default, *model.tiers.values()]
        return next((r for r in order if any(t.name == pinned for t in routes[r].targets)), None)

    def _cannot_serve(self, call: Call, route: Route) -> str | None:
        """Why ``route`` cannot serve ``call`` (its API, or the response it continues), or
        ``None`` when it can: a tier that cannot gives way to the default tier."""
        if not any(_serves(self.providers[t.provider], call.kind) for t in route.targets):
            return f"route {route.name!r} cannot serve the {call.kind} API"
        try:
            self._unservable(call, route)
        except BadRequestError as exc:
            return exc.message[:300]
        return None

    async def from_cache(
        self, call: Call
    ) -> tuple[Outcome | None, tuple[str, Flight | None] | None]:
        """A chat call's stored answer, looked up before openai's machinery builds its
        request (the client's ``chat.completions.create`` asks, for a body that is plain
        JSON): ``(outcome, key)`` on a hit, ``(None, key)`` on a miss (the call then goes the
        usual way, and the seam does not look ``key`` up again while :data:`LOOKED_UP` holds
        it), ``(None, None)`` when the cache may not answer this call."""
        self.goal(call)  # raised before metrics count the call, as in answer()
        decision = await self.tier(call)
        cache = self.cache
        try:
            request = self._cache_request(call) if cache is not None else None
        except Exception as exc:  # counted as answer() counts it (it raises the same there)
            self._telemetry(call).failed(exc)
            raise
        if cache is None or request is None or not request.read:
            return None, None
        started = time.monotonic()
        pending = cache.pending(request)
        hit = await cache.lookup(request)
        if hit is None:
            return None, (request.key, pending)
        telemetry = self._telemetry(call)
        outcome = self._hit(cache, hit, request, call, started)
        if decision is not None:  # a miss is counted by answer(), which decides again
            self.metrics.tier_decided(decision)
            self._served(call, outcome)
        _observe(telemetry, outcome)
        return outcome, (request.key, pending)

    def _telemetry(self, call: Call) -> Any:
        host = None if call.route is not None else _host_of(call.base_url)
        return self.metrics.begin(
            call.body["model"], call.body, stream=call.stream, host=host, headers=call.headers
        )

    async def _answer(self, call: Call, live: Callable[[], Awaitable[Any]]) -> Outcome | Any:
        async def answer() -> Outcome | Any:
            if call.route is not None:
                return await self._routed(call, call.route)
            return await live()

        if self.cache is not None:
            request = self._cache_request(call)
            if request is not None:
                return await self._cached(self.cache, request, call, answer)
        return await answer()

    async def _routed(self, call: Call, route: Route) -> Outcome:
        """A chat or Responses call on a route, through the routing engine."""
        await self._fresh_stats()
        self._background()
        send = self.upstream.sender(
            headers=call.headers,
            query=call.query,
            timeout=call.timeout,
            path=call.path,
            http=call.http,
            trace=call.trace,
        )
        kind = call.kind
        unservable = self._unservable(call, route)
        if call.stream:
            routed = await self.router.stream(
                route,
                call.body,
                send,
                kind=kind,
                unservable=unservable,
                goal=self.goal(call),
                raw=bool(call.headers.get(RAW_RESPONSE_HEADER)),  # the caller reads the body
            )
            stream: AsyncStream[Any] = AsyncStream._from_route(routed)
            if kind == "responses":
                stream._iterator = self._pinning(stream._iterator, routed.report.winner)
            return Outcome(stream, stream.response, stream.timings.retries)
        done = await self.router.complete(
            route, call.body, send, kind=kind, unservable=unservable, goal=self.goal(call)
        )
        completion = done.completion
        if isinstance(completion, ChatCompletion | Response):
            won = [a.request_id for a in done.report.attempts if a.outcome == "won"]
            completion._request_id = won[-1] if won else None  # the vendor's header, by protocol
            attach(completion, done.timings, done.report)
            if kind == "responses" and done.report.winner is not None:
                self.pin(completion.id, done.report.winner)
        return Outcome(completion, done.response, done.timings.retries)

    def _unservable(self, call: Call, route: Route) -> set[str]:
        """The route's targets that cannot serve ``call``: those whose vendor lacks its API,
        and for a Responses call that continues an earlier response (``previous_response_id``)
        every target but the one that holds it (when this client made it), else those that do
        not keep responses. Raises ``BadRequestError`` if none is left."""
        if call.kind == "chat":
            return set()
        providers = self.providers
        out = {t.name for t in route.targets if not _serves(providers[t.provider], call.kind)}
        previous = call.body.get("previous_response_id")
        if call.kind == "responses" and isinstance(previous, str):
            pinned = self.pins.get(previous)
            out.update(
                t.name
                for t in route.targets
                if (t.name != pinned if pinned else not providers[t.provider].spec.responses_stored)
            )
            if len(out) >= len(route.targets):
                raise _bad_request(
                    f"route {route.name!r}: no target keeps responses, so none can continue "
                    f"previous_response_id {previous[:64]!r} (see `responses_stored` in the "
                    "catalog)",
                    param="previous_response_id",
                )
        return out

    async def _pinning(self, events: AsyncIterator[Any], target: str | None) -> AsyncIterator[Any]:
        """A routed Responses stream's events, remembering the target that holds its response."""
        try:
            async for event in events:
                self.note_event(event, target)
                yield event
        finally:
            await events.aclose()  # type: ignore[attr-defined]  # resets an unfinished stream

    async def _fresh_stats(self) -> None:
        """Route on the fleet's statistics: a view older than the sync interval (or never
        read) is refreshed first, waiting at most the Redis timeout (then the local stats)."""
        sync = self.stats_sync
        if sync is not None and sync.stale():
            await sync.refresh(self.resolved.redis.timeout)

    def _background(self) -> None:
        sync = self.stats_sync
        if sync is not None and sync.due():
            spawn(sync.sync, name="stats sync")
        self.servers.poll(self.router, self.providers)

    def _cache_request(self, call: Call) -> CacheRequest | None:
        """What the cache may do for this call (``None``: nothing), from the config and the
        ``x-llmroute-cache*`` headers of the client and the call."""
        settings = self.cache_settings
        if settings is None:
            return None
        body, route = call.body, call.route
        # A tiered name's answers are the name's, whichever of its tiers served them (a request
        # decided differently later, a follow-up held on a larger tier, a hedge the large tier
        # won, still finds them), unless the call forced its tier.
        targets = route.targets if route is not None else ()
        tiered = call.tiered
        shared = tiered is not None and not (
            tiered.decision is not None and tiered.decision.reason == "override"
        )
        if tiered is not None and shared:
            routes = self.router.routes
            seen = {t.name: t for r in sorted(tiered.model.routes) for t in routes[r].targets}
            targets = tuple(seen.values())
        options: dict[str, str] = {}
        for source in (call.client_headers, call.headers):
            for name, value in source.items():
                lower = name.lower()
                if lower.startswith(CACHE_HEADER):
                    if not isinstance(value, str):
                        options.pop(lower, None)
                    else:
                        options[lower] = value.strip()
        mode = _header_choice(options, CACHE_HEADER, settings.mode, _CACHE_MODES)
        if mode == "off" or (mode == "auto" and not is_deterministic(body)):
            return None
        if call.kind == "responses" and any(body.get(k) for k in _STATEFUL):
            return None  # the answer depends on state a vendor keeps, not on the body alone
        replay = _header_choice(options, CACHE_REPLAY_HEADER, settings.replay, _REPLAY_MODES)
        namespace = options.get(CACHE_NAMESPACE_HEADER) or settings.namespace
        if namespace is None:
            # Whoever the request would be sent as: the keys and organization each target
            # gets, after the call's own headers.
            if call.signed_late and route is None:
                return None  # who asks is unknown here: tenants would share one namespace
            if route is not None:
                sent = [self.upstream.provider_headers(self.providers[t.provider]) for t in targets]
            else:
                sent = [dict(call.sent_headers)]
            who = [credentials(merge_headers(headers, call.headers)) for headers in sent]
            namespace = _tenant_namespace(*(c for group in who for c in group))
        elif not NAMESPACE_PATTERN.fullmatch(namespace):
            raise ConfigError(
                f"{CACHE_NAMESPACE_HEADER}: expected 1 to 64 letters, digits, '.', '_' or '-', "
                f"got {namespace[:80]!r}"
            )
        # A route's answers are its targets'; a plain model's are its base URL's.
        if tiered is not None and shared:
            model = f"tiers:{tiered.model.name}:{','.join(sorted(t.name for t in targets))}"
        elif route is not None:
            model = f"route:{route.name}:{','.join(sorted(t.name for t in route.targets))}"
        else:
            model = f"{call.base_url}{body['model']}"
        if call.kind != "chat":
            model = f"{call.kind}:{model}"  # another API's answers never replay as chat's
        asked = body.get("stream_options")
        usage = call.stream and isinstance(asked, Mapping) and bool(asked.get("include_usage"))
        writes = mode != "read-only"
        return CacheRequest(
            key=request_key(body, model=model, namespace=namespace),
            stream=call.stream,
            include_usage=usage,
            read=True,
            write=writes,
            share=writes and settings.single_flight,
            paced=replay == "paced",
            kind=call.kind,
        )

    def _cache_response(self, call: Call) -> httpx.Response:
        """The response object of an answer the cache gave (no HTTP exchange took place)."""
        route = call.route
        where = f"llmroute://route/{route.name}" if route is not None else call.base_url
        # A copy of a template built once (building and reading an empty httpx.Response was
        # most of a memory hit's remaining time in llmroute): its own headers, extensions and
        # history, the same (immutable) empty body and request.
        template = _answer_response(where, call.stream)
        response = httpx.Response.__new__(httpx.Response)
        response.__dict__.update(template.__dict__)
        response.headers = template.headers.copy()
        response.extensions = {}
        response.history = []
        return response

    async def _cached(
        self,
        cache: ResponseCache,
        request: CacheRequest,
        call: Call,
        live: Callable[[], Awaitable[Outcome | Any]],
    ) -> Outcome | Any:
        """A call the cache may answer: a stored answer, a shared call, or a live one."""
        started = time.monotonic()
        route = call.route
        model = call.body["model"]
        policy = route.policy.name if route is not None else "direct"
        looked = LOOKED_UP.get()
        if looked is not None and looked[0] == request.key:
            hit, pending = None, looked[1]  # just missed, before openai's machinery
        else:
            pending = cache.pending(request)
            hit = await cache.lookup(request) if request.read else None
        if hit is None and request.read:
            # An identical call that ended, or was stored, as the lookup missed.
            hit = await cache.after_miss(request, pending)
        if hit is not None:
            return self._hit(cache, hit, request, call, started)
        if not request.share and not request.write:
            return await live()

        async def result_of_live() -> Any:
            value = await live()
            return value.result if isinstance(value, Outcome) else value

        seat, leader = cache.join(request, result_of_live)
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
            return Outcome(stream, stream.response)
        seat.leave()
        response = getattr(result, "_llmroute_response", None) or self._cache_response(call)
        if leader:
            return Outcome(result, response)
        completion = result.model_copy(deep=True)  # each caller may change its own
        attach(completion, Timings(started_at=started), shared, started)
        return Outcome(completion, response)

    def _hit(
        self, cache: ResponseCache, hit: Hit, request: CacheRequest, call: Call, started: float
    ) -> Outcome:
        """The outcome of a call the cache answers: the stored answer, or its replay."""
        route = call.route
        policy = route.policy.name if route is not None else "direct"
        report = RouteReport(
            route=call.body["model"], policy=policy, cache_hit=True, winner="cache"
        )
        timings = Timings(started_at=started)
        response = self._cache_response(call)
        if hit.completion is None:
            stream: AsyncStream[Any] = AsyncStream._from_chunks(
                cache.replay(hit, request), response=response, timings=timings, route=report
            )
            return Outcome(stream, response)
        attach(hit.completion, timings, report, started)
        hit.completion._request_id = None  # openai's attribute: no vendor answered this call
        report.ttft = timings.first_token
        return Outcome(hit.completion, response)

    # -- the other routable endpoints: failover across the route's targets -------------------

    async def other(self, call: Call) -> Outcome:
        """A ``completions`` or ``embeddings`` call on a route: the targets that serve it, in
        the policy's order, each tried before the next (failover before the answer starts;
        openai's machinery parses the winner's response)."""
        route = call.route
        assert route is not None
        await self._fresh_stats()
        self._background()
        body = call.body
        targets = [t for t in route.targets if _serves(self.providers[t.provider], call.kind)]
        order = {name: i for i, name in enumerate(self.router.order(route, body, call.kind))}
        targets.sort(key=lambda t: order.get(t.name, len(order)))
        # Targets whose circuit is open or that cool down after a 429 go last.
        targets.sort(key=lambda t: not self.router.health(t.name).available())
        report = RouteReport(route=route.name, policy=route.policy.name)
        failures: dict[str, BaseException] = {}
        started = time.monotonic()
        retries = 0
        for target in targets:
            # One retry of the same target for a retryable failure, if the client allows any.
            for attempt in range(1 + min(1, self.router.max_retries)):
                record = AttemptReport(
                    target=target.name,
                    started=time.monotonic() - started,
                    reason="first" if not report.attempts else ("retry" if attempt else "failover"),
                )
                report.attempts.append(record)
                request = self.upstream.build(
                    self.providers[target.provider],
                    call.path,
                    {**body, "model": target.model},
                    headers=call.headers,
                    query=call.query,
                    timeout=call.timeout,
                    http=call.http,
                )
                try:
                    response, timings = await self.upstream.send(
                        request, read_body=not call.stream, http=call.http
                    )
                except (APIStatusError, APIConnectionError) as exc:
                    record.outcome, record.error = "error", describe_error(exc)
                    failures[target.name] = exc
                    self.router.record_call(target.name, elapsed=None, exc=exc, kind=call.kind)
                    if isinstance(exc, APIStatusError) and not should_retry_status(
                        exc.status_code, exc.response.headers, now=time.time()
                    ):
                        if 400 <= exc.status_code < 500 and exc.status_code not in (401, 403, 429):
                            raise  # the call itself is at fault: another target will not help
                        break
                    if attempt == 0:
                        retries += 1
                        await anyio.sleep(
                            retry_delay(
                                retries_done=0,
                                max_retries=1,
                                headers=exc.response.headers
                                if isinstance(exc, APIStatusError)
                                else None,
                                now=time.time(),
                                rand=random.random(),
                            )
                        )
                    continue
                record.outcome = "won"
                record.ttft = timings.headers
                self.router.record_call(
                    target.name, elapsed=None if call.stream else timings.total, exc=None
                )
                report.winner, report.ttft = target.name, time.monotonic() - started
                object.__setattr__(response, "_llmroute_route", report)
                object.__setattr__(response, "_llmroute_timings", timings)
                return Outcome(None, response, retries)
        stub = httpx.Request("POST", f"llmroute://route/{route.name}")
        raise AllTargetsFailed(route.name, failures, stub, report=report)

    def note_event(self, event: Any, target: str | None) -> None:
        """Remember the target of a Responses stream whose ``response.created`` event this is."""
        if target is not None and getattr(event, "type", None) == "response.created":
            rid = getattr(getattr(event, "response", None), "id", None)
            if isinstance(rid, str):
                self.pin(rid, target)

    def pin(self, response_id: str, target: str) -> None:
        """Remember that ``target`` holds the Responses API response ``response_id``, where its
        vendor keeps the responses it issued (``responses_stored``): a follow-up of a response
        no vendor kept gets llmroute's own error before anything is sent (:meth:`_unservable`),
        not a stateless vendor's 400."""
        provider = self.providers.get(target.partition(":")[0])
        if provider is not None and not provider.spec.responses_stored:
            return
        pins = self.pins
        pins[response_id] = target
        if len(pins) > 10_000:
            for key in list(pins)[:1_000]:
                del pins[key]

    # -- the client's own methods ----------------------------------------------------------

    async def warmup(self, default: httpx.URL | None, connect_timeout: float | None) -> None:
        urls = {str(default): default} if default is not None else {}
        for provider in self.providers.values():
            urls.setdefault(str(provider.base_url), provider.base_url)
        errors: list[BaseException] = []

        async def warm(url: httpx.URL) -> None:
            try:
                with map_transport_errors(self.http.build_request("GET", url)):
                    await self.transport.warmup(url, timeout=connect_timeout)
            except APIConnectionError as exc:
                if self.providers:
                    log.warning("warmup: cannot reach %s: %s", url, exc.message)
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            if self.stats_sync is not None:  # the fleet's statistics, beside the connections
                tg.start_soon(self.stats_sync.refresh, None)
            for tiered in self.tiered.values():  # the classifiers, beside the connections
                tg.start_soon(tiered.prepare)
            for url in urls.values():
                tg.start_soon(warm, url)
        if errors and (not self.providers or len(errors) == len(urls)):
            raise errors[0]

    def add_provider(self, name: str, table: Mapping[str, Any]) -> None:
        provider = resolve_provider(name, table)
        self.providers[name] = provider
        if provider.verify is not None and provider.base_url.scheme == "https":
            host, port = provider.origin
            self.transport.set_origin_verify(host, port, provider.verify)

    def add_targets(self, model: str, targets: Iterable[str], **route: Any) -> None:
        parsed = [Target.parse(text) for text in targets]
        for target in parsed:
            if target.provider not in self.providers:
                raise ConfigError(
                    f"models.{model}: unknown provider {target.provider!r} "
                    "(add it with add_provider() first)"
                )
        if model in self.tiered:
            raise ConfigError(f"models.{model}: a tiered model name, not a route")
        routes = self.router.routes
        existing = routes.get(model)
        self.tier_hedges.clear()  # built over routes whose targets may change here
        if existing is None:
            config = route_config(model, {"targets": [str(t) for t in parsed], **route})
            routes[model] = route_for(model, config, parsed, self.providers)
            return
        if route:
            raise ConfigError(f"models.{model}: the route exists; its settings cannot change")
        if isinstance(existing.policy, WeightedPolicy):
            raise ConfigError(
                f"models.{model}: a weighted route takes no new targets (each needs a weight)"
            )
        new = route_for(
            model, RouteConfig(targets=[str(t) for t in parsed]), parsed, self.providers
        )
        known = {t.name for t in existing.targets}
        existing.targets += tuple(t for t in new.targets if t.name not in known)

    def stats(self) -> dict[str, TargetSnapshot]:
        return self.router.snapshot()

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        await self.trials.aclose()
        await self.servers.aclose()
        if self.stats_sync is not None:
            await self.stats_sync.aclose()
        if self.cache is not None:
            await self.cache.aclose()
        await self.http.aclose()
        if self.simulated:
            await anyio.to_thread.run_sync(self.simulated.stop)


def _observe(telemetry: Any, result: Outcome | Any) -> None:
    """Count a call that returned: a stream when it ends, a whole answer now."""
    value = result.result if isinstance(result, Outcome) else result
    telemetry.returned(value)
    if isinstance(value, AsyncStream):
        value._on_end = telemetry.stream_ended
    else:
        telemetry.completed(value)


def _take_own_options(options: Any) -> object:
    """The call's ``llmroute`` options (``extra_body``'s over the body's), taken out of both
    openai's ``json_data`` and ``extra_json`` (copies: the caller's dicts are not changed)."""
    found: object = None
    for attr in ("json_data", "extra_json"):
        source = getattr(options, attr, None)
        if isinstance(source, Mapping) and "llmroute" in source:
            found = source["llmroute"]
            setattr(options, attr, {k: v for k, v in source.items() if k != "llmroute"})
    return found


def _tier_option(
    options: object, tiered: TieredModel | None, model: object
) -> tuple[object, str | None]:
    """The call's ``llmroute`` options without ``tier``, and the route ``tier`` names."""
    if not isinstance(options, Mapping) or "tier" not in options:
        return options, None
    rest = {k: v for k, v in options.items() if k != "tier"}
    if tiered is None:
        raise _bad_request(
            f"llmroute.tier: model {str(model)[:80]!r} is not a tiered model name",
            param="llmroute.tier",
        )
    try:
        forced = tiered.forced(options["tier"])
    except TierError as exc:
        raise _bad_request(str(exc), param="llmroute.tier") from None
    return (rest or None), forced


def _bad_request(message: str, *, param: str | None = None) -> BadRequestError:
    """openai's ``BadRequestError`` for a call llmroute refuses before sending anything."""
    request = httpx.Request("POST", "llmroute://refused")
    body = {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    response = httpx.Response(400, json={"error": body}, request=request)
    return BadRequestError(message, response=response, body=body)  # type: ignore[arg-type]


def missing_key_error(model: object, routes: Iterable[str] = ()) -> OpenAIError:
    """A call for a model that is not a route, on a client that has only routes."""
    known = ", ".join(repr(r) for r in sorted(routes)) or "(none)"
    return OpenAIError(
        f"model {model!r} is not a route of the config (the routes are: {known}), and no "
        "default provider is set: use a route, or set default_provider in the config, or the "
        "api_key client option, or the OPENAI_API_KEY environment variable"
    )
