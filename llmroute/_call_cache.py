"""The response cache as a call meets it: what the cache may do for the call, a stored
answer's replay, and identical calls in flight sharing one live call.

:class:`CallCache` reads the config's cache settings and the call's ``x-llmroute-cache*``
headers into a :class:`~.cache.CacheRequest` (the key names the route's targets, or the base
URL, and the tenant the call would be sent as), and serves the call from the cache
(:mod:`.cache`) or through ``live()``. It knows the call, not the client: the dispatch hands it
the live call as a callable.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

from ._call import Call, Served, attach
from ._streaming import AsyncStream
from ._types import RouteReport, Timings
from ._upstream import Upstream, credentials, merge_headers
from .cache import (
    NAMESPACE_PATTERN,
    CacheRequest,
    Flight,
    Hit,
    ResponseCache,
    is_deterministic,
    request_key,
)
from .cache import tenant_namespace as _tenant_namespace
from .config import CacheSettings, ConfigError
from .routing.costs import saved_by
from .routing.engine import Router
from .routing.route import RouteTarget

__all__ = ["CACHE_HEADER", "LOOKED_UP", "CallCache", "LookedUp"]

CACHE_HEADER = "x-llmroute-cache"
"""Per request (``extra_headers``) or per client (``default_headers``): ``auto``, ``on``,
``read-only`` or ``off``; never sent upstream, like every ``x-llmroute-*`` header."""
CACHE_NAMESPACE_HEADER = "x-llmroute-cache-namespace"
CACHE_REPLAY_HEADER = "x-llmroute-cache-replay"
_CACHE_MODES = ("auto", "on", "read-only", "off")
_REPLAY_MODES = ("immediate", "paced")
_STATEFUL = ("previous_response_id", "conversation", "background")
"""Responses API fields whose answer depends on what the vendor keeps (never cached)."""

LookedUp = tuple[str, Flight | None]
"""A cache key a call was looked up under, with the identical call pending then, if any."""

LOOKED_UP: contextvars.ContextVar[LookedUp | None] = contextvars.ContextVar(
    "llmroute_looked_up", default=None
)
"""The cache key a call was already looked up under, and missed, before openai's machinery
built its request (:meth:`CallCache.look_up`), with the identical call that was pending then
(:meth:`ResponseCache.pending`): the seam does not look the key up twice, unless an identical
call ended or was stored in between (:meth:`ResponseCache.after_miss`)."""


def _header_choice(
    options: Mapping[str, str], header: str, default: str, choices: tuple[str, ...]
) -> str:
    value = options.get(header)
    if value is None:
        return default
    if value.lower() not in choices:
        raise ConfigError(f"{header}: expected one of {', '.join(choices)}, got {value[:80]!r}")
    return value.lower()


def _cache_options(call: Call) -> dict[str, str]:
    """The call's ``x-llmroute-cache*`` headers, the call's over the client's (a header the
    call sets to a value that is not text, such as ``openai.Omit``, takes the client's away)."""
    options: dict[str, str] = {}
    for source in (call.client_headers, call.headers):
        for name, value in source.items():
            lower = name.lower()
            if lower.startswith(CACHE_HEADER):
                if not isinstance(value, str):
                    options.pop(lower, None)
                else:
                    options[lower] = value.strip()
    return options


@functools.lru_cache(maxsize=64)
def _answer_response(where: str, stream: bool) -> httpx.Response:
    """The response of a cached answer, as a template (see :meth:`CallCache.response`)."""
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


class CallCache:
    """A client's response cache, as its calls meet it (one for a client and its copies)."""

    def __init__(
        self,
        cache: ResponseCache,
        settings: CacheSettings,
        *,
        router: Router,
        upstream: Upstream,
    ) -> None:
        self.cache = cache
        self.settings = settings
        self.router = router
        """Its routes (a tiered name's answers are keyed by every tier's targets)."""
        self.upstream = upstream
        """Who a call would be sent as: each target's keys and headers."""

    async def look_up(self, request: CacheRequest, call: Call) -> tuple[Served | None, LookedUp]:
        """The stored answer for ``request``, looked up before openai's machinery builds the
        call's request (:meth:`Dispatch.from_cache`), with the key and the identical call that
        was pending then (what :data:`LOOKED_UP` holds on a miss)."""
        started = time.monotonic()
        cache = self.cache
        pending = cache.pending(request)
        hit = await cache.lookup(request)
        if hit is None:
            return None, (request.key, pending)
        return self.hit(hit, request, call, started), (request.key, pending)

    def request(self, call: Call) -> CacheRequest | None:
        """What the cache may do for this call (``None``: nothing), from the config and the
        ``x-llmroute-cache*`` headers of the client and the call."""
        settings, body = self.settings, call.body
        options = _cache_options(call)
        mode = _header_choice(options, CACHE_HEADER, settings.mode, _CACHE_MODES)
        if mode == "off" or (mode == "auto" and not is_deterministic(body)):
            return None
        if call.kind == "responses" and any(body.get(k) for k in _STATEFUL):
            return None  # the answer depends on state a vendor keeps, not on the body alone
        replay = _header_choice(options, CACHE_REPLAY_HEADER, settings.replay, _REPLAY_MODES)
        targets, model = self._answers_of(call)
        namespace = self._namespace(call, options, targets)
        if namespace is None:
            return None
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

    def _answers_of(self, call: Call) -> tuple[tuple[RouteTarget, ...], str]:
        """The targets whose answers the call may share, and the name the key gives them: a
        route's answers are its targets'; a plain model's are its base URL's. A tiered name's
        answers are the name's, whichever of its tiers served them (a request decided
        differently later, a follow-up held on a larger tier, a hedge the large tier won,
        still finds them), unless the call forced its tier."""
        route, tiered = call.route, call.tiered
        targets = route.targets if route is not None else ()
        shared = tiered is not None and not (
            tiered.decision is not None and tiered.decision.reason == "override"
        )
        if tiered is not None and shared:
            routes = self.router.routes
            seen = {t.name: t for r in sorted(tiered.model.routes) for t in routes[r].targets}
            targets = tuple(seen.values())
            model = f"tiers:{tiered.model.name}:{','.join(sorted(t.name for t in targets))}"
        elif route is not None:
            model = f"route:{route.name}:{','.join(sorted(t.name for t in route.targets))}"
        else:
            model = f"{call.base_url}{call.body['model']}"
        if call.kind != "chat":
            model = f"{call.kind}:{model}"  # another API's answers never replay as chat's
        return targets, model

    def _namespace(
        self, call: Call, options: Mapping[str, str], targets: tuple[RouteTarget, ...]
    ) -> str | None:
        """The call's cache namespace: the one it names, the config's, else the tenant it
        would be sent as (the keys and organization each target gets, after the call's own
        headers); ``None``: the cache may not answer it (who asks is unknown here)."""
        namespace = options.get(CACHE_NAMESPACE_HEADER) or self.settings.namespace
        if namespace is not None:
            if not NAMESPACE_PATTERN.fullmatch(namespace):
                raise ConfigError(
                    f"{CACHE_NAMESPACE_HEADER}: expected 1 to 64 letters, digits, '.', '_' or "
                    f"'-', got {namespace[:80]!r}"
                )
            return namespace
        route = call.route
        if call.signed_late and route is None:
            return None  # who asks is unknown here: tenants would share one namespace
        if route is not None:
            upstream = self.upstream
            sent = [upstream.provider_headers(upstream.providers[t.provider]) for t in targets]
        else:
            sent = [dict(call.sent_headers)]
        who = [credentials(merge_headers(headers, call.headers)) for headers in sent]
        return _tenant_namespace(*(c for group in who for c in group))

    def response(self, call: Call) -> httpx.Response:
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

    async def serve(
        self, request: CacheRequest, call: Call, live: Callable[[], Awaitable[Served | Any]]
    ) -> Served | Any:
        """A call the cache may answer: a stored answer, a shared call, or a live one."""
        started = time.monotonic()
        cache = self.cache
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
            return self.hit(hit, request, call, started)
        if not request.share and not request.write:
            return await live()

        async def result_of_live() -> Any:
            value = await live()
            return value.result if isinstance(value, Served) else value

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
            return Served(stream, stream.response)
        seat.leave()
        response = getattr(result, "_llmroute_response", None) or self.response(call)
        if leader:
            return Served(result, response)
        completion = result.model_copy(deep=True)  # each caller may change its own
        attach(completion, Timings(started_at=started), shared, started)
        return Served(completion, response)

    def hit(self, hit: Hit, request: CacheRequest, call: Call, started: float) -> Served:
        """What a call the cache answers is served with: the stored answer, or its replay."""
        cache = self.cache
        route = call.route
        policy = route.policy.name if route is not None else "direct"
        report = RouteReport(
            route=call.body["model"], policy=policy, cache_hit=True, winner="cache"
        )
        report.saved = saved_by(route, hit.entry) if route is not None else None
        timings = Timings(started_at=started)
        response = self.response(call)
        if hit.completion is None:
            stream: AsyncStream[Any] = AsyncStream._from_chunks(
                cache.replay(hit, request), response=response, timings=timings, route=report
            )
            return Served(stream, response)
        attach(hit.completion, timings, report, started)
        hit.completion._request_id = None  # openai's attribute: no vendor answered this call
        report.ttft = timings.first_token
        return Served(hit.completion, response)
