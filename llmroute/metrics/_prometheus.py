"""The Prometheus side of :class:`ClientMetrics`.

Counters and histograms are updated once per request, when it ends (a stream when it is read to
its end, breaks or is closed), from the request's :class:`~llmroute.RouteReport` and
:class:`~llmroute.Timings`: nothing runs per chunk. Gauges (requests in flight, breaker state,
the live P95 the router predicts with) and the trials of open circuits are read from the router
when scraped.

Labels are route names (the model names an application asks for) and targets
(``"provider:model"``, or ``"host:model"`` for a model name that is not a route): never a key,
a prompt or a URL's query.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    StateSetMetricFamily,
)
from prometheus_client.registry import Collector

from .._types import AttemptReport, TierDecision, Timings
from ..routing.costs import attempt_kind
from ..routing.stats import TargetSnapshot
from ._otel import Tracer
from ._request import RequestRecord, RequestTelemetry

__all__ = ["BREAKER_STATES", "CONTENT_TYPE", "ClientMetrics", "RequestRecord"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The HTTP content type of :meth:`ClientMetrics.exposition`."""

BREAKER_STATES = ("closed", "open", "half-open")

_TTFT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0,
)  # fmt: skip
MAX_MODEL_LABELS = 64
"""Distinct model names that are not routes kept as label values; the rest count as ``other``
(a gateway's clients choose model names: they must not grow the registry without bound)."""
OTHER = "other"

_DECISION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01)

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


class _ScrapeTime(Collector):
    """The gauges read from the router's live stats when scraped."""

    def __init__(
        self,
        snapshot: Callable[[], Mapping[str, TargetSnapshot]],
        trials: Callable[[], Mapping[tuple[str, str], int]] | None = None,
    ) -> None:
        self._snapshot = snapshot
        self._trials = trials

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily(
            "llmroute_in_flight",
            "Attempts in flight on each target (hedges and races included)",
            labels=["target"],
        )
        breaker = StateSetMetricFamily(
            "llmroute_breaker_state", "Each target's circuit breaker state", labels=["target"]
        )
        p95 = GaugeMetricFamily(
            "llmroute_target_ttft_p95_seconds",
            "The live P95 TTFT over the sliding window, as the router predicts with it",
            labels=["target"],
        )
        for name, snap in sorted(self._snapshot().items()):
            in_flight.add_metric([name], snap.in_flight)
            breaker.add_metric([name], {state: snap.breaker == state for state in BREAKER_STATES})
            if snap.ttft_p95 is not None:
                p95.add_metric([name], snap.ttft_p95)
        yield in_flight
        yield breaker
        yield p95
        if self._trials is not None:
            trials = CounterMetricFamily(
                "llmroute_circuit_trials",
                "Background trials of open circuits by target and verdict (closed: the target "
                "answered; failed; none: a 429 or a refused trial said nothing of its health)",
                labels=["target", "verdict"],
            )
            for (target, verdict), count in sorted(self._trials().items()):
                trials.add_metric([target, verdict], count)
            yield trials


class ClientMetrics:
    """The Prometheus metrics of one client (shared by its ``with_options`` copies).

    It is a collector itself: ``prometheus_client.REGISTRY.register(client.metrics)`` adds it to
    the default registry (``start_http_server`` then serves it); :meth:`exposition` gives the
    text of this client alone.
    """

    def __init__(
        self,
        snapshot: Callable[[], Mapping[str, TargetSnapshot]] | None = None,
        trials: Callable[[], Mapping[tuple[str, str], int]] | None = None,
    ) -> None:
        self.tracer = Tracer()
        self._models: set[str] = set()
        self.registry = registry = CollectorRegistry(auto_describe=True)
        if snapshot is not None:
            registry.register(_ScrapeTime(snapshot, trials))
        self._requests = Counter(
            "llmroute_requests",
            "Chat and Responses API requests by route, outcome (ok, error, interrupted, "
            "cancelled) and source (live, cache, shared)",
            ["route", "outcome", "source"],
            registry=registry,
        )
        self._request_ttft = Histogram(
            "llmroute_request_ttft_seconds",
            "Time to first token of streamed requests as the caller saw it (hedges included)",
            ["route", "source"],
            buckets=_TTFT_BUCKETS,
            registry=registry,
        )
        self._request_latency = Histogram(
            "llmroute_request_seconds",
            "Time to the whole answer of requests that were not streamed, as the caller saw it "
            "(hedges included)",
            ["route", "source"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._ttft = Histogram(
            "llmroute_ttft_seconds",
            "Time to first token of each target's streamed attempts that got one",
            ["target"],
            buckets=_TTFT_BUCKETS,
            registry=registry,
        )
        self._itl = Histogram(
            "llmroute_inter_token_seconds",
            "Mean time between tokens of each complete stream, by the target that served it",
            ["target"],
            buckets=_ITL_BUCKETS,
            registry=registry,
        )
        self._latency = Histogram(
            "llmroute_response_seconds",
            "Time to the whole answer of requests that were not streamed, by target",
            ["target"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._attempts = Counter(
            "llmroute_attempts",
            "Attempts by target, reason (first, race, hedge, failover, retry, explore, "
            "continuation) and outcome (won, cancelled, error, timeout, rate_limited, "
            "interrupted)",
            ["target", "reason", "outcome"],
            registry=registry,
        )
        self._hedges = Counter(
            "llmroute_hedges_fired", "Hedge attempts started", ["route"], registry=registry
        )
        self._hedges_won = Counter(
            "llmroute_hedges_won",
            "Requests whose answer came from a hedge attempt",
            ["route"],
            registry=registry,
        )
        self._hedges_denied = Counter(
            "llmroute_hedges_denied",
            "Hedges the route's hedge budget did not allow",
            ["route"],
            registry=registry,
        )
        self._continuations = Counter(
            "llmroute_continuations",
            "Answers continued on another target after a break mid-stream",
            ["route"],
            registry=registry,
        )
        self._left_out = Counter(
            "llmroute_left_out",
            "Requests not sent to a target because their estimated size exceeds its declared "
            "context window",
            ["target"],
            registry=registry,
        )
        self._cost = Counter(
            "llmroute_cost",
            "What the attempts of routed requests cost, in their prices' currency (USD for "
            "every price of the catalog), by target and kind (answer: the attempt whose text "
            "the caller got first; hedge: attempts that lost a race or hedge; retry: attempts "
            "that failed before a first token; continuation: attempts that continued a broken "
            "answer); estimates included (docs/cost.md)",
            ["target", "kind"],
            registry=registry,
        )
        self._cost_unknown = Counter(
            "llmroute_cost_unknown",
            "Attempts whose cost is unknown (no price for the model, a malformed usage)",
            ["target"],
            registry=registry,
        )
        self._cost_sums: dict[tuple[str, str, str], tuple[int, int]] = {}
        self._cost_children: dict[tuple[str, str, str], Any] = {}
        self._cache = Counter(
            "llmroute_cache_hits",
            "Requests answered without asking a target: from the cache (cache) or from an "
            "identical request's call in flight (shared)",
            ["route", "kind"],
            registry=registry,
        )

        self._tier_decisions = Counter(
            "llmroute_tier_decisions",
            "Requests for a tiered model name by model, class (the classifier's, or none on "
            "an error), tier (the route they went to; a hedged one's smaller tier) and reason "
            "(classifier, default, conversation, hedged, latency, override, shadow, error)",
            ["model", "class", "tier", "reason"],
            registry=registry,
        )
        self._tier_hedges = Counter(
            "llmroute_tier_hedged_answers",
            "Unsure requests of a tiered model name hedged across two tiers (reason hedged), "
            "by model and the tier whose answer the caller got",
            ["model", "tier"],
            registry=registry,
        )
        self._tier_seconds = Histogram(
            "llmroute_tier_decision_seconds",
            "The request classifier's time per decision, by tiered model name",
            ["model"],
            buckets=_DECISION_BUCKETS,
            registry=registry,
        )

    def tier_decided(self, decision: TierDecision) -> None:
        """Count one decision of a tiered model name (labels come from the config only)."""
        label = decision.label or "none"
        self._tier_decisions.labels(decision.model, label, decision.tier, decision.reason).inc()
        if decision.reason not in ("override", "error") or decision.micros:
            self._tier_seconds.labels(decision.model).observe(decision.micros / 1e6)

    def tier_hedge_answered(self, decision: TierDecision) -> None:
        """Count a hedged decision's answer by the tier that gave it (``decision.tier``)."""
        self._tier_hedges.labels(decision.model, decision.tier).inc()

    def counts(self) -> dict[str, dict[tuple[str, ...], float]]:
        """The counters' values now, by metric name (``"attempts"``, ``"hedges_fired"``, ...)
        and label values, and the cumulative buckets of the callers' TTFT by route, source and
        ``le`` (``"request_ttft_buckets"``): what the gateway's live page samples, without the
        per-target histograms a full :meth:`collect` would build."""
        counters = {
            "requests": self._requests,
            "attempts": self._attempts,
            "hedges_fired": self._hedges,
            "hedges_won": self._hedges_won,
            "hedges_denied": self._hedges_denied,
            "continuations": self._continuations,
            "cost": self._cost,
            "cost_unknown": self._cost_unknown,
            "cache_hits": self._cache,
            "tier_decisions": self._tier_decisions,
        }
        out: dict[str, dict[tuple[str, ...], float]] = {}
        for name, counter in counters.items():
            values: dict[tuple[str, ...], float] = {}
            for family in counter.collect():
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        values[tuple(sample.labels.values())] = sample.value
            out[name] = values
        buckets: dict[tuple[str, ...], float] = {}
        for family in self._request_ttft.collect():
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    labels = sample.labels
                    buckets[(labels["route"], labels["source"], labels["le"])] = sample.value
        out["request_ttft_buckets"] = buckets
        return out

    def costs(self) -> dict[tuple[str, str, str], Decimal]:
        """What routed requests cost so far, exact: by target, kind of attempt (``answer``,
        ``hedge``, ``retry``, ``continuation``) and currency; the Prometheus counter
        ``llmroute_cost_total`` is the same sums as floats."""
        return {
            key: Decimal(units).scaleb(exponent)
            for key, (units, exponent) in self._cost_sums.items()
        }

    def collect(self) -> Iterator[Metric]:
        """Every metric, as a Prometheus collector (so another registry can include it)."""
        yield from self.registry.collect()

    def exposition(self) -> bytes:
        """Every metric in the Prometheus text format (content type :data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)

    def begin(
        self,
        route: str,
        body: Mapping[str, Any],
        *,
        stream: bool,
        host: str | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> RequestTelemetry:
        """Start watching a chat request for ``route`` (the model name asked for); ``host`` is
        the base URL's host of a request that is not routed (its target is ``host:model``);
        ``headers``: the call's own, whose ``traceparent`` its trace continues.

        The first :data:`MAX_MODEL_LABELS` model names that are not routes get labels of their
        own; later ones are counted under ``other``.
        """
        target = None
        if host is not None:
            if route not in self._models:
                if len(self._models) < MAX_MODEL_LABELS:
                    self._models.add(route)
                else:
                    route = OTHER
            target = f"{host}:{route}"
        return RequestTelemetry(self, route, body, stream=stream, target=target, headers=headers)

    def observe(self, record: RequestRecord) -> None:
        """Count one request that ended."""
        route, source, report, timings = record.route, record.source, record.report, record.timings
        self._requests.labels(route, record.outcome, source).inc()
        if source != "live":
            self._cache.labels(route, source).inc()
        ttft = record.caller_ttft
        if record.stream and ttft is not None:
            self._request_ttft.labels(route, source).observe(ttft)
        elif not record.stream and record.outcome == "ok":
            seconds = _answer_seconds(record)
            if seconds is not None:
                self._request_latency.labels(route, source).observe(seconds)
        if source != "live":
            return  # the call that answered counted its attempts itself
        if report is None or not report.attempts:
            if record.target is not None and timings is not None:
                self._direct(record, record.target, timings)
            return
        for attempt in report.attempts:
            self._attempts.labels(attempt.target, attempt.reason, attempt.outcome).inc()
            if attempt.ttft is None:
                continue
            if record.stream:
                self._ttft.labels(attempt.target).observe(attempt.ttft)
            elif attempt.outcome == "won":
                self._latency.labels(attempt.target).observe(attempt.ttft)
            if attempt.outcome == "won" and attempt.reason == "hedge":
                self._hedges_won.labels(route).inc()
        amounts = getattr(report.pricer, "amounts", None)
        if amounts is not None:
            self._count_cost(amounts(report))
        if report.hedges:
            self._hedges.labels(route).inc(report.hedges)
        if report.hedges_denied:
            self._hedges_denied.labels(route).inc(report.hedges_denied)
        if report.continued_on:
            self._continuations.labels(route).inc(len(report.continued_on))
        for target in report.left_out:
            self._left_out.labels(target).inc()
        if record.stream and record.outcome == "ok" and report.winner is not None:
            itl = _mean_gap(timings)
            if itl is not None and not report.continued_on:
                self._itl.labels(report.winner).observe(itl)

    def _count_cost(self, amounts: list[tuple[AttemptReport, int | None, int, str]]) -> None:
        """Each priced attempt's cost (whole ``10**exponent`` units), by target and kind;
        unknown ones counted apart. The sums stay integers: exact, and cheap."""
        sums, children = self._cost_sums, self._cost_children
        for attempt, units, exponent, currency in amounts:
            if units is None:
                self._cost_unknown.labels(attempt.target).inc()
            elif units:
                kind = attempt_kind(attempt)
                key = (attempt.target, kind, currency)
                child = children.get(key)
                if child is None:
                    child = children[key] = self._cost.labels(attempt.target, kind)
                child.inc(units / 10**-exponent if exponent < 0 else units * 10**exponent)
                held = sums.get(key)
                if held is None:
                    sums[key] = (units, exponent)
                elif held[1] == exponent:
                    sums[key] = (held[0] + units, exponent)
                else:
                    low = min(held[1], exponent)
                    total = held[0] * 10 ** (held[1] - low) + units * 10 ** (exponent - low)
                    sums[key] = (total, low)

    def _direct(self, record: RequestRecord, target: str, timings: Timings) -> None:
        outcome = {"ok": "won", "cancelled": "cancelled", "interrupted": "interrupted"}.get(
            record.outcome, "error"
        )
        self._attempts.labels(target, "first", outcome).inc()
        if record.stream:
            if timings.first_token is not None:
                self._ttft.labels(target).observe(timings.first_token)
            if record.outcome == "ok":
                itl = _mean_gap(timings)
                if itl is not None:
                    self._itl.labels(target).observe(itl)
        elif record.outcome == "ok" and timings.total is not None:
            self._latency.labels(target).observe(timings.total)


def _answer_seconds(record: RequestRecord) -> float | None:
    """A whole answer's time as the caller saw it: the route's (hedges included), else the
    request's own."""
    report, timings = record.report, record.timings
    if report is not None and report.ttft is not None:
        return report.ttft
    return timings.total if timings is not None else None


def _mean_gap(timings: Timings | None) -> float | None:
    """A stream's mean time between tokens, from its first token to its end."""
    if timings is None or timings.tokens < 2:
        return None
    if timings.first_token is None or timings.total is None:
        return None
    span = timings.total - timings.first_token
    return span / (timings.tokens - 1) if span > 0 else None
