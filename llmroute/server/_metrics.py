"""The gateway's own Prometheus metrics, in a registry of their own."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["GatewayMetrics"]

ANONYMOUS = "-"
"""The ``key`` label of requests without a valid key."""

_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class GatewayMetrics:
    """Requests by key name, path and status; rejections by reason; in flight per key; request
    durations and client disconnects. Labels carry key *names*, never keys."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._count_traffic()
        self._count_usage()

    def _count_traffic(self) -> None:
        """Requests, refusals, requests in flight, durations, disconnects, stream errors."""
        self.requests = Counter(
            "llmroute_gateway_requests",
            "Requests answered by the gateway, by key name, path and HTTP status.",
            ["key", "path", "status"],
            registry=self.registry,
        )
        self.rejections = Counter(
            "llmroute_gateway_rejections",
            "Requests refused before reaching the routing, by key name and reason "
            "(unauthorized, body_too_large, concurrency, requests, tokens, too_large, budget, "
            "model, max_tokens, limits_unavailable, ...).",
            ["key", "reason"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "llmroute_gateway_in_flight",
            "Requests in flight per key name (a stream counts until it ends).",
            ["key"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "llmroute_gateway_request_duration_seconds",
            "Seconds from a request's arrival to the end of its response, by path.",
            ["path"],
            buckets=_DURATION_BUCKETS,
            registry=self.registry,
        )
        self.disconnects = Counter(
            "llmroute_gateway_client_disconnects",
            "Streams whose client went away before the end (the upstream stream is cancelled).",
            ["key", "path"],
            registry=self.registry,
        )
        self.stream_errors = Counter(
            "llmroute_gateway_stream_errors",
            "Streams that failed after their first chunk (ended with an error event).",
            ["key", "path"],
            registry=self.registry,
        )

    def _count_usage(self) -> None:
        """Tokens, spend and cache hits; the keys, their reloads and changes; soft limits."""
        self.tokens = Counter(
            "llmroute_gateway_tokens",
            "Tokens of upstream answers by key name and kind (prompt, completion): the "
            "vendors' usage where they sent one, else the gateway's count (a cache hit: none).",
            ["key", "kind"],
            registry=self.registry,
        )
        self.spend = Counter(
            "llmroute_gateway_spend_usd",
            "What requests cost in USD, by key name and the target that billed each attempt, "
            "at the targets' prices (requests whose targets have none: not counted).",
            ["key", "target"],
            registry=self.registry,
        )
        self.hedge_spend = Counter(
            "llmroute_gateway_hedge_spend_usd",
            "The part of llmroute_gateway_spend_usd_total that requests' hedges, retries and "
            "continuations cost, by key name.",
            ["key"],
            registry=self.registry,
        )
        self.estimated_spend = Counter(
            "llmroute_gateway_estimated_spend_usd",
            "The part of llmroute_gateway_spend_usd_total that answers' vendors did not count "
            "(a stream cut or broken before its usage), by key name: its prompt as the vendor "
            "counted it where it did first (Anthropic), else as uncached input, and the tokens "
            "sent.",
            ["key"],
            registry=self.registry,
        )
        self.cache_hits = Counter(
            "llmroute_gateway_cache_hits",
            "Answers replayed from the cache, by key name.",
            ["key"],
            registry=self.registry,
        )
        self.reloads = Counter(
            "llmroute_gateway_key_reloads",
            "Reloads of the keys file, by result (ok, error: the keys before stay).",
            ["result"],
            registry=self.registry,
        )
        self.keys = Gauge(
            "llmroute_gateway_keys",
            "Keys the gateway accepts.",
            registry=self.registry,
        )
        self.soft_limits = Counter(
            "llmroute_gateway_soft_limits",
            "Budgets that reached their soft_limit share, by scope (key, team) and the key's or "
            "team's name (owner): once per budget period (per fleet with Redis).",
            ["scope", "owner"],
            registry=self.registry,
        )
        self.key_changes = Counter(
            "llmroute_gateway_key_changes",
            "Changes made over the admin API, by action (create, update, rotate, revoke, "
            "team_put, team_delete).",
            ["action"],
            registry=self.registry,
        )

    def rejecter(self, key: str) -> Callable[[str], None]:
        """Counts a refusal of ``key``'s request by its reason (the checks' ``reject``)."""
        return lambda reason: self.rejections.labels(key, reason).inc()

    def exposition(self) -> bytes:
        """These metrics in the Prometheus text format."""
        return generate_latest(self.registry)
