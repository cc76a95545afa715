"""Latency objectives (SLOs) per gateway key and route: how many requests met their TTFT
objective, and the error budget's burn rate over the windows of multi-window, multi-burn-rate
alerting (Google's SRE workbook, "Alerting on SLOs").

A request *meets* its objective when it succeeded and its TTFT (seconds, as the gateway's client
saw it) is at most ``ttft_ms``. The burn rate over a window is the share of the window's requests
that missed, divided by the share the objective allows to miss (``1 - percentile / 100``): 1.0
spends the budget exactly at the pace the objective allows, 14.4 spends a 30-day budget's 2% in
an hour.

Each (key, route) series keeps three rings of time buckets (10 s x 30, 1 min x 60, 5 min x 72:
162 buckets whatever the traffic), so ``record`` is O(1) and memory is bounded per series; the
number of series is bounded by ``max_series``. Labels carry key *names*, never keys.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["ALL_ROUTES", "WINDOWS", "Objective", "SloTracker"]

log = logging.getLogger("llmroute.server")

ALL_ROUTES: Final = "*"
"""The ``route`` label of a key's own objective: every request of the key, whatever its route."""

# (bucket width in seconds, number of buckets) per ring.
_RINGS: Final = ((10.0, 30), (60.0, 60), (300.0, 72))

WINDOWS: Final[dict[str, tuple[int, int]]] = {
    # window: (ring, buckets). A window is its last buckets, the current (partial) one included:
    # it reaches between (buckets - 1) and buckets widths back, a 1/30 to 1/72 slack.
    "5m": (0, 30),
    "30m": (1, 30),
    "1h": (1, 60),
    "6h": (2, 72),
}
"""The windows burn rates are given over, by their names in the ``window`` label."""

BURN_RATE: Final = "llmroute_gateway_slo_burn_rate"


@dataclass(frozen=True, slots=True)
class Objective:
    """``percentile`` percent of requests get their first token within ``ttft_ms``."""

    ttft_ms: float
    percentile: float = 95.0

    def __post_init__(self) -> None:
        if not (_number(self.ttft_ms) and math.isfinite(self.ttft_ms)):
            raise ValueError(f"ttft_ms must be a number of milliseconds, not {self.ttft_ms!r}")
        if self.ttft_ms <= 0:
            raise ValueError(f"ttft_ms must be above 0, not {self.ttft_ms!r}")
        if not (_number(self.percentile) and 0 < self.percentile < 100):
            raise ValueError(f"percentile must be above 0 and below 100, not {self.percentile!r}")

    @property
    def allowed_misses(self) -> float:
        """The share of requests that may miss: the error budget as a ratio."""
        return (100.0 - self.percentile) / 100.0


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class _Ring:
    """Requests and misses in ``count`` buckets of ``width`` seconds; a bucket is reused (and
    cleared) when its time comes round again."""

    __slots__ = ("count", "misses", "requests", "stamps", "width")

    def __init__(self, width: float, count: int) -> None:
        self.width = width
        self.count = count
        self.stamps = [-1] * count  # the bucket number each slot holds, -1: none yet
        self.requests = [0] * count
        self.misses = [0] * count

    def add(self, now: float, missed: bool) -> None:
        number = int(now // self.width)
        slot = number % self.count
        if self.stamps[slot] != number:
            self.stamps[slot] = number
            self.requests[slot] = 0
            self.misses[slot] = 0
        self.requests[slot] += 1
        if missed:
            self.misses[slot] += 1

    def totals(self, now: float, buckets: int) -> tuple[int, int]:
        """Requests and misses in the last ``buckets`` buckets, the current one included."""
        first = int(now // self.width) - buckets + 1
        requests = misses = 0
        for stamp, r, m in zip(self.stamps, self.requests, self.misses, strict=True):
            if stamp >= first:
                requests += r
                misses += m
        return requests, misses


class _Series:
    __slots__ = ("counted", "met", "met_counter", "objective", "requests", "rings")

    def __init__(self, objective: Objective, counted: Counter, met_counter: Counter) -> None:
        self.objective = objective
        self.requests = 0
        self.met = 0
        self.rings = tuple(_Ring(width, count) for width, count in _RINGS)
        self.counted = counted  # the series' children of the two counters, looked up once
        self.met_counter = met_counter


class SloTracker:
    """Met and missed TTFT objectives per (key name, route), as Prometheus metrics in
    ``registry`` and as burn rates over :data:`WINDOWS`.

    At most ``max_series`` (key, route) pairs are tracked: a request of a pair beyond them is not
    counted, and the first such is logged (the gateway passes only configured key names and
    routes, so keys x routes is the bound it sizes this by).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_series: int = 10_000,
    ) -> None:
        self._clock = clock
        self._max_series = max_series
        self._series: dict[tuple[str, str], _Series] = {}
        self._lock = threading.Lock()  # a scrape may run on another thread than the requests
        self._refused = False
        labels = ["key", "route"]
        self.requests = Counter(
            "llmroute_gateway_slo_requests",
            "Requests under a TTFT objective, by key name and route ('*': all the key's routes).",
            labels,
            registry=registry,
        )
        self.met = Counter(
            "llmroute_gateway_slo_met",
            "Requests that met their TTFT objective (succeeded, first token within the target).",
            labels,
            registry=registry,
        )
        self.objective_ratio = Gauge(
            "llmroute_gateway_slo_objective_ratio",
            "The share of requests that must meet the TTFT target (percentile / 100).",
            labels,
            registry=registry,
        )
        self.target = Gauge(
            "llmroute_gateway_slo_ttft_target_seconds",
            "The TTFT a request must meet to count as met, in seconds.",
            labels,
            registry=registry,
        )
        registry.register(_BurnRates(self))

    def record(
        self, key: str, route: str, objective: Objective, ttft: float | None, ok: bool
    ) -> None:
        """One request of ``key`` on ``route`` under ``objective``: ``ttft`` in seconds (None: no
        first token came), ``ok`` False when it failed. Met = ok and ttft within the target.
        Past requests keep the verdict they got when an objective changes."""
        met = ok and ttft is not None and ttft * 1000.0 <= objective.ttft_ms
        now = self._clock()
        with self._lock:
            series = self._series.get((key, route))
            if series is None:
                if len(self._series) >= self._max_series:
                    if not self._refused:
                        self._refused = True
                        log.warning(
                            "SLO: more than %d (key, route) series; requests of new ones are "
                            "not counted (first: key=%s route=%s)",
                            self._max_series,
                            key,
                            route,
                        )
                    return
                series = self._series[key, route] = _Series(
                    objective, self.requests.labels(key, route), self.met.labels(key, route)
                )
                self._show_objective(key, route, objective)
            elif series.objective != objective:
                series.objective = objective
                self._show_objective(key, route, objective)
            series.requests += 1
            if met:
                series.met += 1
            for ring in series.rings:
                ring.add(now, not met)
        series.counted.inc()
        if met:
            series.met_counter.inc()

    def observe(
        self,
        key: str,
        route: str,
        ttft: float | None,
        ok: bool,
        *,
        key_objective: Objective | None = None,
        route_objective: Objective | None = None,
    ) -> None:
        """One request under whichever objectives apply: the key's own (recorded under route
        :data:`ALL_ROUTES`) and the route's (recorded under the request's key and route)."""
        if key_objective is not None:
            self.record(key, ALL_ROUTES, key_objective, ttft, ok)
        if route_objective is not None:
            self.record(key, route, route_objective, ttft, ok)

    def forget(self, key: str) -> None:
        """Drop every series of ``key`` (a key revoked on a reload) from memory and metrics."""
        with self._lock:
            routes = [route for k, route in self._series if k == key]
            for route in routes:
                del self._series[key, route]
        for route in routes:
            for metric in (self.requests, self.met, self.objective_ratio, self.target):
                try:
                    metric.remove(key, route)
                except KeyError:
                    pass

    def burn_rate(self, key: str, route: str, window: str) -> float | None:
        """The error budget's burn rate of (key, route) over ``window`` (a key of
        :data:`WINDOWS`); None when the window holds no request (or the pair none at all)."""
        ring, buckets = WINDOWS[window]
        now = self._clock()
        with self._lock:
            series = self._series.get((key, route))
            if series is None:
                return None
            return _burn(series, ring, buckets, now)

    def snapshot(self) -> dict[str, Any]:
        """Every series as JSON-able data: its objective, requests and met since the start, and
        the burn rate per window (None: no request in it)."""
        now = self._clock()
        with self._lock:
            return {
                "windows": list(WINDOWS),
                "series": [
                    {
                        "key": key,
                        "route": route,
                        "objective": {
                            "ttft_ms": s.objective.ttft_ms,
                            "percentile": s.objective.percentile,
                        },
                        "requests": s.requests,
                        "met": s.met,
                        "burn_rate": {
                            name: _burn(s, ring, buckets, now)
                            for name, (ring, buckets) in WINDOWS.items()
                        },
                    }
                    for (key, route), s in sorted(self._series.items())
                ],
            }

    def burn_rates(self) -> list[tuple[str, str, str, float]]:
        """(key, route, window, burn rate) of every series and window that holds requests."""
        now = self._clock()
        rates: list[tuple[str, str, str, float]] = []
        with self._lock:
            for (key, route), series in self._series.items():
                for name, (ring, buckets) in WINDOWS.items():
                    rate = _burn(series, ring, buckets, now)
                    if rate is not None:
                        rates.append((key, route, name, rate))
        return rates

    def _show_objective(self, key: str, route: str, objective: Objective) -> None:
        self.objective_ratio.labels(key, route).set(objective.percentile / 100.0)
        self.target.labels(key, route).set(objective.ttft_ms / 1000.0)


def _burn(series: _Series, ring: int, buckets: int, now: float) -> float | None:
    requests, misses = series.rings[ring].totals(now, buckets)
    if requests == 0:
        return None
    return (misses / requests) / series.objective.allowed_misses


class _BurnRates(Collector):
    """``llmroute_gateway_slo_burn_rate``, computed when scraped (this replica's requests)."""

    def __init__(self, tracker: SloTracker) -> None:
        self._tracker = tracker

    def describe(self) -> list[GaugeMetricFamily]:
        return [self._family()]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = self._family()
        for key, route, window, rate in self._tracker.burn_rates():
            family.add_metric([key, route, window], rate)
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            BURN_RATE,
            "The error budget's burn rate per key name, route and window on this replica: the "
            "share of the window's requests that missed the objective over the share it allows "
            "(absent for a window without requests).",
            labels=["key", "route", "window"],
        )
