"""The seam: what happens to a call whose model name is a route (and to every chat call).

:class:`Dispatch` is the state one client shares with its copies (``with_options``): the
resolved config, the routing engine and its live stats, the cache, the transport and the
upstream request builder. The client's ``request()`` hands it openai's request options; it
answers with a :class:`Served` (the result, the HTTP response behind it, the retries) that the
client wraps in openai's own response classes. It calls only downward: cache, routing engine,
upstream requests, protocols, transport.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import anyio
import anyio.to_thread
import httpx
from openai._constants import RAW_RESPONSE_HEADER
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from ._background import spawn
from ._call import ROUTABLE, Call, Posted, Served, TierCall, attach, bad_request, serves
from ._call_cache import CallCache, LookedUp
from ._errors import (
    BadRequestError,
    OpenAIError,
)
from ._failover_call import fail_over_call
from ._model_names import check_model_name
from ._response_pins import ResponsePins
from ._routes import ServerPolling, add_targets, build_router, stats_sync_for
from ._simulated import SimulatedProviders
from ._streaming import AsyncStream
from ._tiering import Tiering, tier_option
from ._tiers import TieredModel
from ._timeouts import RequestTimeouts, TimeoutHeaderError, request_timeouts, with_timeouts
from ._types import TierDecision
from ._upstream import Upstream, no_cookies, openai_http
from ._warm_start import WarmStart
from .cache import CacheUnavailable, ResponseCache, open_cache
from .config import Config, Resolved, ResolvedProvider, resolve, resolve_provider
from .metrics import ClientMetrics
from .routing.goal import TTFT_TARGET_HEADER, GoalError, LatencyGoal, read_goal
from .routing.route import Route, Sender
from .routing.stats import TargetSnapshot
from .routing.trials import TRIAL_TIMEOUT, CircuitTrials
from .transport import Transport

__all__ = ["Call", "Dispatch", "Posted", "Served", "missing_key_error"]

log = logging.getLogger("llmroute")


@functools.lru_cache(maxsize=64)
def _host_of(base_url: str) -> str:
    return httpx.URL(base_url).host


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
        self.cache = _open_cache(resolved) if config is not None else None
        self.verify = verify
        self.transport = _transport(resolved, verify)
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
        self.call_cache = (
            CallCache(self.cache, resolved.cache, router=self.router, upstream=self.upstream)
            if self.cache is not None and resolved.cache is not None
            else None
        )
        self.pins = ResponsePins(self.providers)
        self.tiered = {name: TieredModel(s) for name, s in resolved.tiered.items()}
        """Tiered model names (docs/tiers.md), each with its classifier, built on first use."""
        self.tiering = Tiering(
            self.tiered,
            router=self.router,
            providers=self.providers,
            pins=self.pins,
            metrics=self.metrics,
            goal=self.goal,
        )
        self.warm = WarmStart(
            resolved if config is not None else None,
            self.router,
            http=self.http,
            transport=self.transport,
            providers=self.providers,
            tiered=self.tiered,
            stats_sync=self.stats_sync,
            metrics=self.metrics,
            sender=lambda timeout: self._trial_sender("chat", timeout),
        )
        """The stats file, read now and written on :meth:`aclose`, and ``warmup()``."""
        self.closed = False

    def _trial_sender(self, kind: str, timeout: float = TRIAL_TIMEOUT) -> Sender:
        """What a trial (or a probe) of a call of ``kind`` is sent with: that kind's endpoint,
        the provider's key and headers (no caller's), the application's client if it gave one."""
        path = next((path for path, k in ROUTABLE.items() if k == kind), "chat/completions")
        return self.upstream.sender(
            headers=None,
            query=None,
            timeout=httpx.Timeout(timeout),
            path=path,
            http=self.trial_http,
        )

    @property
    def default_provider(self) -> ResolvedProvider | None:
        name = self.resolved.default_provider if self.configured else None
        return self.providers.get(name) if name is not None else None

    def http_client(self, base_url: httpx.URL, timeout: Any) -> httpx.AsyncClient:
        """The ``httpx.AsyncClient`` openai's machinery sends with (:func:`openai_http`)."""
        client = openai_http(base_url, timeout, transport=self.transport, verify=self.verify)
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
        goal_options, forced = tier_option(goal_options, tiered, model)
        if kind is None:
            if route is not None:
                raise _unroutable(model, path)
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
            own = _own_timeouts(headers)
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
        able = [t for t in route.targets if serves(self.providers[t.provider], kind)]
        if not able:
            names = ", ".join(t.name for t in route.targets)
            raise bad_request(
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
            raise bad_request(str(exc), param=exc.param) from None

    async def answer(self, call: Call, live: Callable[[], Awaitable[Any]]) -> Served | Any:
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
            self.tiering.answered(call, exc)  # AllTargetsFailed's report
            telemetry.failed(exc)
            raise
        self.tiering.answered(call, result)
        _observe(telemetry, result)
        return result

    async def tier(self, call: Call) -> TierDecision | None:
        """For a call of a tiered model name: its tier decided and that tier's route put on
        the call (:meth:`Tiering.decide`); ``None`` for any other call."""
        return await self.tiering.decide(call)

    async def from_cache(self, call: Call) -> tuple[Served | None, LookedUp | None]:
        """A chat call's stored answer, looked up before openai's machinery builds its
        request (the client's ``chat.completions.create`` asks, for a body that is plain
        JSON): ``(outcome, key)`` on a hit, ``(None, key)`` on a miss (the call then goes the
        usual way, and the seam does not look ``key`` up again while :data:`LOOKED_UP` holds
        it), ``(None, None)`` when the cache may not answer this call."""
        self.goal(call)  # raised before metrics count the call, as in answer()
        decision = await self.tier(call)
        cache = self.call_cache
        try:
            request = cache.request(call) if cache is not None else None
        except Exception as exc:  # counted as answer() counts it (it raises the same there)
            self._telemetry(call).failed(exc)
            raise
        if cache is None or request is None or not request.read:
            return None, None
        outcome, key = await cache.look_up(request, call)
        if outcome is None:
            return None, key
        telemetry = self._telemetry(call)
        if decision is not None:  # a miss is counted by answer(), which decides again
            self.metrics.tier_decided(decision)
            self.tiering.answered(call, outcome)
        _observe(telemetry, outcome)
        return outcome, key

    def _telemetry(self, call: Call) -> Any:
        host = None if call.route is not None else _host_of(call.base_url)
        return self.metrics.begin(
            call.body["model"], call.body, stream=call.stream, host=host, headers=call.headers
        )

    async def _answer(self, call: Call, live: Callable[[], Awaitable[Any]]) -> Served | Any:
        async def answer() -> Served | Any:
            if call.route is not None:
                return await self._routed(call, call.route)
            return await live()

        cache = self.call_cache
        if cache is not None:
            request = cache.request(call)
            if request is not None:
                return await cache.serve(request, call, answer)
        return await answer()

    async def _routed(self, call: Call, route: Route) -> Served:
        """A chat or Responses call on a route, through the routing engine."""
        await self._fresh_stats()
        self._background()
        send = self._sender(call)
        kind = call.kind
        unservable = self.pins.unservable(call, route)
        if call.stream:
            routed = await self.router.stream(
                route,
                call.body,
                send,
                kind=kind,
                unservable=unservable,
                goal=self.goal(call),
                raw=bool(call.headers.get(RAW_RESPONSE_HEADER)),  # the caller reads the body
                prompt_tokens=call.prompt_tokens,
            )
            stream: AsyncStream[Any] = AsyncStream._from_route(routed)
            if kind == "responses":
                stream._iterator = self.pins.pinning(stream._iterator, routed.report.winner)
            return Served(stream, stream.response, stream.timings.retries)
        done = await self.router.complete(
            route,
            call.body,
            send,
            kind=kind,
            unservable=unservable,
            goal=self.goal(call),
            prompt_tokens=call.prompt_tokens,
        )
        completion = done.completion
        if isinstance(completion, ChatCompletion | Response):
            won = [a.request_id for a in done.report.attempts if a.outcome == "won"]
            completion._request_id = won[-1] if won else None  # the vendor's header, by protocol
            attach(completion, done.timings, done.report)
            if kind == "responses" and done.report.winner is not None:
                self.pins.pin(completion.id, done.report.winner)
        return Served(completion, done.response, done.timings.retries)

    def _sender(self, call: Call) -> Sender:
        """The engine's sender for the call's attempts: its headers, query, timeout, endpoint,
        the application's own HTTP client if it gave one, and its trace."""
        return self.upstream.sender(
            headers=call.headers,
            query=call.query,
            timeout=call.timeout,
            path=call.path,
            http=call.http,
            trace=call.trace,
            off_loop=call.off_loop,
        )

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

    async def other(self, call: Call) -> Served:
        """A ``completions`` or ``embeddings`` call on a route: failed over, metered and
        counted (:func:`fail_over_call`); openai's machinery parses the winner's response."""
        route = call.route
        assert route is not None
        await self._fresh_stats()
        self._background()
        unservable = self.pins.unservable(call, route)
        telemetry = self._telemetry(call)
        call.trace = telemetry.trace
        send = self._sender(call)
        return await fail_over_call(
            self.router, route, call, send, unservable=unservable, telemetry=telemetry
        )

    # -- the client's own methods ----------------------------------------------------------

    def add_provider(self, name: str, table: Mapping[str, Any]) -> None:
        provider = resolve_provider(name, table)
        self.providers[name] = provider
        if provider.verify is not None and provider.base_url.scheme == "https":
            host, port = provider.origin
            self.transport.set_origin_verify(host, port, provider.verify)

    def add_targets(self, model: str, targets: Iterable[str], **route: Any) -> None:
        add_targets(self.router, self.providers, model, targets, tiered=self.tiered, **route)
        self.tiering.hedges.clear()  # built over routes whose targets may have changed

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
        await self.warm.aclose()
        if self.cache is not None:
            await self.cache.aclose()
        await self.http.aclose()
        if self.simulated:
            await anyio.to_thread.run_sync(self.simulated.stop)


def _transport(resolved: Resolved, verify: Any) -> Transport:
    """llmroute's transport for the config's connections, checking certificates by ``verify``
    (and each provider's own ``verify``)."""
    return Transport(
        verify=verify,
        verify_by_origin=resolved.verify_by_origin(),
        max_connections=resolved.connections.max_per_origin,
        max_streams_per_connection=resolved.connections.max_streams,
    )


def _open_cache(resolved: Resolved) -> ResponseCache | None:
    """The config's response cache, if it has one that opens (else a warning: the client
    runs without it)."""
    settings = resolved.cache
    if settings is None or settings.backend == "off":
        return None
    try:
        return open_cache(settings, resolved.redis)
    except CacheUnavailable as exc:
        log.warning("cache: %s; the client runs without a cache", exc)
        return None


def _observe(telemetry: Any, result: Served | Any) -> None:
    """Count a call that returned: a stream when it ends, a whole answer now."""
    value = result.result if isinstance(result, Served) else result
    telemetry.returned(value)
    if isinstance(value, AsyncStream):
        value._on_end = telemetry.stream_ended
    else:
        telemetry.completed(value)


def _unroutable(model: object, path: str) -> BadRequestError:
    """The error of a route's name on an endpoint llmroute does not route."""
    return bad_request(
        f"model {model!r} is a route of llmroute's config; /{path} cannot be routed "
        "(routes serve chat/completions, responses, completions and embeddings): "
        "use a model name of the provider",
        param="model",
    )


def _own_timeouts(headers: Mapping[str, Any]) -> RequestTimeouts:
    """The call's ``x-llmroute-timeout-*`` headers; a wrong one is a ``BadRequestError``."""
    try:
        return request_timeouts(headers)
    except TimeoutHeaderError as exc:
        raise bad_request(str(exc), param=exc.header) from None


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


def missing_key_error(model: object, routes: Iterable[str] = ()) -> OpenAIError:
    """A call for a model that is not a route, on a client that has only routes."""
    known = ", ".join(repr(r) for r in sorted(routes)) or "(none)"
    return OpenAIError(
        f"model {model!r} is not a route of the config (the routes are: {known}), and no "
        "default provider is set: use a route, or set default_provider in the config, or the "
        "api_key client option, or the OPENAI_API_KEY environment variable"
    )
