"""A request through admission: who it is (:class:`Door`: its key's tenant, an admin's for
the operators' paths) and, for a ``/v1`` call once its body is checked (:class:`Gate`), the key's
concurrency slot and its place in every limit of its scopes before the call
(:class:`~._admission.Admission`: the key's, its team's, the model's), what the answer used
counted after it, and whether it met the key's and the route's latency objectives.

``enter`` takes the checked call (:class:`~._calls.ApiCall`) and estimates it
(:func:`llmroute.routing.estimate_request`) only when a limit counts tokens, its dearest cost
in money only under a money budget (``budget_usd``); ``settle`` counts what the answer cost at
the target that answered and what its other attempts cost, each under the target that billed
it (:class:`~._spend.Prices`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from .._types import RouteReport
from ._admission import Admission, usage_increments
from ._alerts import SoftLimits
from ._calls import ApiCall
from ._errors import Refused, error_body
from ._exchange import Exchange, Request
from ._limits import TARGET_SPEND, Alert, Refusal
from ._metrics import ANONYMOUS, GatewayMetrics
from ._slo import Objective, SloTracker
from ._spend import (
    MAX_NANOS,
    Prices,
    PriceUnknown,
    answer_nanos,
    continued_nanos,
    extra_nanos,
)
from ._tally import Tally
from ._tenants import NANOS, Tenant, Tenants
from ._usage import new_usage

__all__ = ["Door", "Gate"]

log = logging.getLogger("llmroute.server")


@dataclass(eq=False, repr=False)
class Gate:
    """Admission and accounting of a gateway's requests (see the module's docstring)."""

    admission: Admission
    metrics: GatewayMetrics
    slo: SloTracker
    soft_limits: SoftLimits
    route_slos: Mapping[str, Objective]
    prices: Prices
    """Money budgets' estimates and each answer's cost."""
    usage: dict[str, dict[str, int]] = field(default_factory=dict, init=False)
    """Each key's usage counted by this replica: requests, errors, tokens, cache hits."""

    async def enter(self, call: ApiCall, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work`` in one of the key's slots (its ``max_concurrency``), counted in its
        limits (its own, its team's, the model's), or refuse (429; 503 without Redis)."""
        exchange = call.exchange

        def estimate() -> int:
            return call.estimate().tokens

        def money() -> int:  # its dearest cost in nano-dollars, read under a money budget
            return self.prices.estimate(call.model, call.body, call.kind, call.size)

        key = exchange.key
        decided = await self.admission.enter(call.tenant, call.model, estimate, money)
        if isinstance(decided, Refusal):
            self.metrics.rejections.labels(key, decided.reason).inc()
            raise Refused(
                decided.status,
                error_body(decided.message, decided.type, decided.code),
                decided.headers,
            )
        self.metrics.in_flight.labels(key).inc()
        exchange.ticket = decided
        exchange.headers.update(decided.headers)
        self.alerted(decided.alerts)
        try:
            await work()
        finally:
            exchange.ticket = None
            self.metrics.in_flight.labels(key).dec()

    async def renew(self, exchange: Exchange) -> None:
        """Keep the request's shared slot (with Redis) while its answer goes on."""
        if exchange.ticket is not None:
            await self.admission.renew(exchange.ticket)

    async def settle(self, exchange: Exchange, tally: Tally) -> None:
        """Count what the answer used: the key's usage (this replica's, and the fleet's with
        Redis), its slot freed and its limits corrected to it."""
        ticket = exchange.ticket
        assert ticket is not None
        prompt, completion = tally.used()
        usage = self.usage.setdefault(exchange.key, new_usage())
        exchange.counted = True
        failed = (
            exchange.status >= 400
            or exchange.failed
            or (exchange.status == 0 and not exchange.gone)
        )
        answer, estimated = self.cost(exchange, tally, prompt, completion)
        spend, hedge, by_target = _charged(exchange.report, answer)
        added = {
            "requests": 1,
            "errors": int(failed),
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "cache_hits": int(tally.cache_hit),
            "spend_nanos": spend,
            "hedge_nanos": hedge,
            "estimated_nanos": min(answer, spend) if estimated and answer else 0,
        }
        for name, value in added.items():
            usage[name] += value
        for target, nanos in by_target.items():
            usage[TARGET_SPEND + target] = usage.get(TARGET_SPEND + target, 0) + nanos
            self.metrics.spend.labels(exchange.key, target).inc(nanos / NANOS)
        if added["hedge_nanos"]:
            self.metrics.hedge_spend.labels(exchange.key).inc(added["hedge_nanos"] / NANOS)
        if added["estimated_nanos"]:
            self.metrics.estimated_spend.labels(exchange.key).inc(added["estimated_nanos"] / NANOS)
        if tally.cache_hit:
            self.metrics.cache_hits.labels(exchange.key).inc()
        if prompt:
            self.metrics.tokens.labels(exchange.key, "prompt").inc(prompt)
        if completion:
            self.metrics.tokens.labels(exchange.key, "completion").inc(completion)
        money = None if answer is None else spend
        alerts = await self.admission.leave(
            ticket, prompt + completion, usage_increments(added), money, by_target
        )
        self.alerted(alerts)

    def cost(
        self, exchange: Exchange, tally: Tally, prompt: int, completion: int
    ) -> tuple[int | None, bool]:
        """What the request's answer cost (nano-dollars; ``None`` when it cannot be priced),
        and whether that is the gateway's estimate rather than its vendor's usage (a stream
        that ended before its usage): :func:`extra_nanos` adds its other attempts'."""
        continued = continued_nanos(exchange.report)
        if continued is not None:
            return continued, True  # the broken attempt's answer tokens are counted
        billed = answer_nanos(exchange.report)  # cached prompt tokens at the cached price
        if billed is not None:
            return billed
        winner = _priced_target(exchange.report)
        model = tally.body["model"]
        try:
            if exchange.report is None and tally.usage is not None and not tally.cache_hit:
                exact = self.prices.usage_cost(model, tally.usage)  # not a route
                if exact is not None:
                    return exact, False
            counted = tally.prompt is None and not tally.cache_hit  # no vendor's count came
            return self.prices.request_cost(model, winner, prompt, completion), counted
        except PriceUnknown:
            return None, False

    def count_call(self, exchange: Exchange) -> None:
        """An API call of a key that did not reach an answer's accounting (refused before it,
        or a model list): a request of the key's usage, as ``llmroute_gateway_requests_total``
        counts it, and an error unless it was answered or its client left (the fleet's usage
        takes it at the next flush, without a round trip of its own)."""
        if exchange.key == ANONYMOUS:
            return
        usage = self.usage.setdefault(exchange.key, new_usage())
        usage["requests"] += 1
        error = not exchange.gone and not 0 < exchange.status < 400
        if error:
            usage["errors"] += 1
        self.admission.count_call(exchange.key, error)

    def objectives(self, call: ApiCall, admitted: float) -> None:
        """Whether the request met the key's and the route's latency objectives."""
        tenant, model, exchange = call.tenant, call.model, call.exchange
        route = self.route_slos.get(model)
        own = tenant.settings.slo_ttft_ms
        if route is None and own is None:
            return
        ttft = exchange.first - admitted if exchange.first else None
        if exchange.gone and ttft is None:
            return  # the client left before its first token: not the gateway's miss
        ok = exchange.status == 200 and not exchange.failed
        mine = Objective(own, tenant.settings.slo_percentile) if own is not None else None
        self.slo.observe(exchange.key, model, ttft, ok, key_objective=mine, route_objective=route)

    def alerted(self, alerts: Iterable[Alert]) -> None:
        for alert in alerts:
            self.soft_limits.notify(alert)


_NO_STORE = {"cache-control": "no-store"}  # on an admin path's 401 and 403


class Door:
    """Who a request is: the tenant of its key (of the keys ``tenants()`` accepts now, at
    ``clock()``), or OpenAI's 401; an admin key for the operators' paths, or 403."""

    def __init__(
        self,
        tenants: Callable[[], Tenants],
        clock: Callable[[], float],
        metrics: GatewayMetrics,
    ) -> None:
        self._tenants = tenants
        self._clock = clock
        self.metrics = metrics

    @property
    def admins(self) -> bool:
        """Whether any key accepted now is an admin's."""
        return self._tenants().admins

    def authenticate(self, request: Request) -> Tenant:
        """The request's tenant, by its ``Authorization: Bearer <key>``; else 401."""
        headers, exchange = request.headers, request.exchange
        tenant = self._tenants().match(headers.get("authorization"), self._clock())
        if tenant is None:
            if exchange.label.startswith("/v1/"):  # rejections are of API calls
                self.metrics.rejections.labels(ANONYMOUS, "unauthorized").inc()
            given = "authorization" in headers
            message = (
                "Incorrect API key provided."
                if given
                else "You didn't provide an API key (Authorization: Bearer <key>)."
            )
            raise Refused(
                401,
                error_body(message, "invalid_request_error", "invalid_api_key"),
                {"www-authenticate": 'Bearer realm="llmroute"'},
            )
        exchange.key = tenant.name
        exchange.tenant = tenant
        exchange.tenants = self._tenants()
        return tenant

    def admin(self, request: Request, what: str) -> Tenant:
        """The request's tenant if its key is an admin's; else 401 (no key) or 403, neither
        kept by a cache on the way."""
        try:
            tenant = self.authenticate(request)
        except Refused as refused:
            refused.headers.update(_NO_STORE)
            raise
        if not tenant.settings.admin:
            raise Refused(
                403,
                error_body(
                    f"This key may not {what} (only a key with admin = true may).",
                    "invalid_request_error",
                    "permission_denied",
                ),
                _NO_STORE,
            )
        return tenant


def _charged(report: RouteReport | None, answer: int | None) -> tuple[int, int, dict[str, int]]:
    """What a request is charged (nano-dollars): in all, the part beside its answer (its
    hedges, retries and continuations: :func:`~._spend.extra_nanos`), and by the target that
    billed each part, which add up to the whole; ``answer`` is its answer's cost (``None`` or 0:
    nothing charged)."""
    if not answer:
        return 0, 0, {}
    by_target = extra_nanos(report)
    hedge = sum(by_target.values())
    winner = _priced_target(report)
    if winner:
        by_target[winner] = by_target.get(winner, 0) + answer
    spend = min(answer + hedge, MAX_NANOS)
    left = spend  # a clamped whole (a million dollars) still adds up by target
    for target, nanos in by_target.items():
        by_target[target] = min(nanos, left)
        left -= by_target[target]
    return spend, min(hedge, spend), by_target


def _priced_target(report: RouteReport | None) -> str:
    """The target whose answer a request is charged at (``""``: none known)."""
    winner = report.winner if report is not None else None
    return winner if winner is not None and winner != "cache" else ""
