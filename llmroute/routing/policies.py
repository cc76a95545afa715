"""Routing policies: given a route's targets and what is known of them, the plan of one request.

A policy is pure: it sees targets through a :class:`RouteView` (predicted TTFT quantiles,
availability, staleness of the stats) and a random source, and returns a :class:`Plan`, the order
in which the engine tries targets, how many start at once, and when a hedge may start. It knows
nothing of HTTP, tasks or clocks.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "COLD_EXPLORE_SHARE",
    "FailoverPolicy",
    "FastestPolicy",
    "HedgePolicy",
    "Plan",
    "Policy",
    "RacePolicy",
    "RouteView",
    "WeightedPolicy",
    "explore",
    "rank_quantile",
]

_RANKS = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}

COLD_EXPLORE_SHARE = 0.1
"""The share of requests that explore a cold target (one without enough samples yet)."""


def rank_quantile(name: str) -> float | None:
    """The quantile a ranking name stands for ("p95" -> 0.95); ``None`` for "mean"."""
    if name == "mean":
        return None
    return _RANKS[name]


class RouteView(Protocol):
    """What a policy may know about targets."""

    def predict(self, target: str, q: float | None) -> float:
        """Predicted TTFT quantile ``q`` (the mean for ``None``) of ``target``, in seconds."""
        ...

    def available(self, target: str) -> bool:
        """False while the target's circuit is open or it cools down after a 429."""
        ...

    def staleness(self, target: str) -> float:
        """Seconds since the target's newest TTFT sample (``inf`` if it has none)."""
        ...

    def cold(self, target: str) -> bool:
        """Whether the target has too few samples for its own prediction (a prior still counts)."""
        ...


@dataclass(frozen=True, slots=True)
class Plan:
    """The attempts of one request, in order.

    ``start`` attempts begin at once; each following one begins when an earlier one fails
    (failover) or, for ``hedge_delays[i]`` not ``None``, when attempt ``i`` has gone that many
    seconds without a first token (a hedge).
    """

    order: tuple[str, ...]
    start: int = 1
    hedge_delays: tuple[float | None, ...] = ()
    explored: str | None = None

    def hedge_delay(self, index: int) -> float | None:
        """The hedge delay after attempt ``index`` started, or ``None`` (no hedge)."""
        return self.hedge_delays[index] if index < len(self.hedge_delays) else None


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    def plan(self, targets: Sequence[str], view: RouteView, rng: random.Random) -> Plan: ...


def _ranked(targets: Sequence[str], view: RouteView, q: float | None) -> list[str]:
    """Available targets by predicted TTFT, then unavailable ones (a last resort), stable."""
    return sorted(targets, key=lambda t: (not view.available(t), view.predict(t, q)))


@dataclass(frozen=True)
class FastestPolicy:
    """The target with the lowest predicted TTFT first; the others in order on failure."""

    rank_by: str = "p95"
    name: str = "fastest"

    def plan(self, targets: Sequence[str], view: RouteView, rng: random.Random) -> Plan:
        return Plan(tuple(_ranked(targets, view, rank_quantile(self.rank_by))))


@dataclass(frozen=True)
class HedgePolicy:
    """Start the best target; with no first token by its live quantile ``hedge_after`` (or a
    fixed delay in seconds), start the next, up to ``max_hedges`` extra attempts.

    The first target is the best by ``rank_by``; the ones after it, which only start when an
    attempt is late or failed, by their predicted median."""

    rank_by: str = "p95"
    hedge_after: str | float = "p95"
    max_hedges: int = 1
    name: str = "hedge"

    def delay(self, target: str, view: RouteView) -> float:
        if isinstance(self.hedge_after, str):
            return view.predict(target, rank_quantile(self.hedge_after))
        return float(self.hedge_after)

    def plan(self, targets: Sequence[str], view: RouteView, rng: random.Random) -> Plan:
        best, *rest = _ranked(targets, view, rank_quantile(self.rank_by))
        # A hedge starts once the first attempt is already late: what counts then is how soon
        # the next target usually answers, its median, not its tail.
        order = [best, *_ranked(rest, view, 0.5)]
        hedges = min(self.max_hedges, len(order) - 1)
        return Plan(tuple(order), hedge_delays=tuple(self.delay(t, view) for t in order[:hedges]))


@dataclass(frozen=True)
class RacePolicy:
    """Start the ``k`` best targets at once; the first token wins."""

    k: int = 2
    rank_by: str = "p95"
    name: str = "race"

    def plan(self, targets: Sequence[str], view: RouteView, rng: random.Random) -> Plan:
        order = _ranked(targets, view, rank_quantile(self.rank_by))
        return Plan(tuple(order), start=min(self.k, len(order)))


@dataclass(frozen=True)
class FailoverPolicy:
    """The targets in their configured order; the next only when one fails."""

    name: str = "failover"

    def plan(self, targets: Sequence[str], view: RouteView, rng: random.Random) -> Plan:
        ready = [t for t in targets if view.available(t)]
        return Plan((*ready, *(t for t in targets if t not in ready)))


@dataclass(frozen=True)
class WeightedPolicy:
    """A random target in proportion to its weight first; the rest, also by weight, on failure."""

    weights: tuple[float, ...]
    name: str = "weighted"

    def plan(self, targets: Sequence[str], view: RouteView, rng: random.Random) -> Plan:
        # Weighted random order without replacement: sort by u ** (1 / w) (Efraimidis-Spirakis).
        keys = {t: rng.random() ** (1.0 / w) for t, w in zip(targets, self.weights, strict=True)}
        order = sorted(targets, key=lambda t: (not view.available(t), -keys[t]))
        return Plan(tuple(order))


def explore(
    plan: Plan,
    view: RouteView,
    *,
    share: float,
    max_age: float,
    rng: random.Random,
    hedge_delay: Callable[[str], float] | None = None,
    cold_share: float = COLD_EXPLORE_SHARE,
) -> Plan:
    """Now and then, put a target the plan does not start with first, so its stats stay fresh.

    While some target is *cold* (too few samples to predict from), a request explores it with
    probability ``cold_share`` (never when ``share`` is 0: exploration is off). A target is cold
    for at most ``min_samples`` explorations per window, so this costs a bounded number of
    requests. Otherwise, with probability ``share``,
    the stalest target goes first when its newest sample is older than ``max_age`` seconds.
    A hedging plan hedges the explored target after ``hedge_delay(target)`` (its own live
    quantile, or a prior when it has no samples), so one exploration costs at most about that.
    """
    if len(plan.order) < 2:
        return plan
    candidates = [t for t in plan.order[1:] if view.available(t)]
    cold = [t for t in candidates if view.cold(t)]
    if cold:
        if share <= 0 or rng.random() >= max(share, cold_share):
            return plan
        chosen = max(cold, key=view.staleness)
    else:
        if share <= 0 or not candidates or rng.random() >= share:
            return plan
        chosen = max(candidates, key=view.staleness)
        if view.staleness(chosen) <= max_age:
            return plan
    order = (chosen, *(t for t in plan.order if t != chosen))
    delays = plan.hedge_delays
    if delays and hedge_delay is not None:
        delays = (hedge_delay(chosen), *delays[1:])
    return Plan(order, start=plan.start, hedge_delays=delays, explored=chosen)
