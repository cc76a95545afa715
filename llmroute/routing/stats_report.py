"""What the live stats report: each target's :class:`TargetSnapshot` (with its prompt-length
classes' and its server's own figures) and ``client.stats()``'s :class:`StatsReport`, a dict
that prints as a table. Plain data."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ClassSnapshot", "ServerMetrics", "StatsReport", "TargetSnapshot"]


@dataclass(frozen=True, slots=True)
class ClassSnapshot:
    """Observed TTFT of one prompt-length class, in seconds."""

    n: int
    ttft_p50: float | None
    ttft_p95: float | None
    ttft_p99: float | None


@dataclass(frozen=True, slots=True)
class ServerMetrics:
    """What a self-hosted server (SGLang) says of itself on ``/metrics``, read at ``read_at``.

    The TTFT and queue-time means are over the requests since the previous reading (from the
    histograms' sum and count), ``None`` when no request finished in between.
    """

    read_at: float
    """When it was read, on the stats' clock: when the scrape was sent, so that a request this
    client started later is not in it (one started while the scrape was on its way may be)."""
    queued: int
    running: int
    cache_hit_rate: float | None = None
    token_usage: float | None = None
    ttft_mean: float | None = None
    queue_time_mean: float | None = None
    ranks: tuple[int, ...] = ()
    """Queued + running requests per data-parallel rank (``--dp-size``), in rank order; empty
    when the server reports one queue. Each rank schedules its own requests."""

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks the load is spread over (1 without data parallelism)."""
        return max(1, len(self.ranks))


@dataclass(frozen=True, slots=True)
class TargetSnapshot:
    """What is known of one target right now. Latencies in seconds, ``None`` without data.

    The error, timeout and rate-limited rates are shares of the attempts that were not
    cancelled. ``breaker`` is filled in by the router.
    """

    name: str
    n: int
    ttft_p50: float | None
    ttft_p95: float | None
    ttft_p99: float | None
    ttft_mean: float | None
    itl_p50: float | None
    tokens_per_s: float | None
    latency_p50: float | None
    latency_p95: float | None
    error_rate: float
    timeout_rate: float
    rate_limited_rate: float
    in_flight: int
    outcomes: dict[str, int] = field(default_factory=dict)
    by_class: dict[str, ClassSnapshot] = field(default_factory=dict)
    breaker: str = "closed"
    server: ServerMetrics | None = None
    """A self-hosted server's own latest ``/metrics`` reading (queue, running, cache hit rate,
    server-side TTFT), if it has one."""

    def to_dict(self) -> dict[str, Any]:
        """Plain data, for JSON."""
        return dataclasses.asdict(self)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


class StatsReport(dict[str, TargetSnapshot]):
    """``client.stats()``: every target's :class:`TargetSnapshot` by name, a plain ``dict`` in
    every way, that prints as a table (``print(client.stats())``, or at a prompt)."""

    _COLUMNS = (
        "target",
        "n",
        "TTFT p50",
        "p95",
        "p99",
        "ITL p50",
        "tokens/s",
        "whole p50",
        "errors",
        "in flight",
        "circuit",
    )

    def table(self) -> str:
        """One line per target: TTFT samples (streamed requests), TTFT p50/p95/p99, inter-token
        latency p50, tokens/s, the whole-answer latency p50 of requests not streamed (their
        first token comes with the whole answer; kept apart so it does not skew the streamed
        TTFT routing relies on), the error rate (errors, timeouts and 429s), requests in flight
        and the circuit state."""
        if not self:
            return "no targets yet (a client without routes, or before its first request)"
        rows = [self._COLUMNS] + [
            (
                name,
                str(snap.n),
                _ms(snap.ttft_p50),
                _ms(snap.ttft_p95),
                _ms(snap.ttft_p99),
                _ms(snap.itl_p50),
                "-" if snap.tokens_per_s is None else f"{snap.tokens_per_s:.0f}",
                _ms(snap.latency_p50),
                f"{snap.error_rate:.0%}",
                str(snap.in_flight),
                snap.breaker,
            )
            for name, snap in self.items()
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(len(self._COLUMNS))]
        lines = [
            "  ".join(
                cell.ljust(width) if index == 0 else cell.rjust(width)
                for index, (cell, width) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
            for row in rows
        ]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain data, for JSON: each snapshot as a dict."""
        return {name: snap.to_dict() for name, snap in self.items()}

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return f"<StatsReport of {len(self)} target(s); as a table:\n{self.table()}\n>"
