"""Hedging across two tiers of a tiered model name: one plan over both tiers' targets.

Pure: a :class:`TierHedgePolicy` plans the smaller tier's first target, and hedges on the
larger tier's first target once the smaller one has had no first token by its live p95 (a
prior when cold), as a route's own hedges do; the rest of both tiers follows for failover.
The engine carries the plan out like any other (the first token wins, the loser's stream is
reset), so there is no second hedging machinery.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass

from .policies import Plan, Policy, RouteView
from .route import Route

__all__ = ["HEDGE_QUANTILE", "TierHedgePolicy", "tier_hedge_route"]

HEDGE_QUANTILE = 0.95
"""The smaller tier's quantile of TTFT after which the larger tier starts too."""


@dataclass(frozen=True)
class TierHedgePolicy:
    """The smaller tier's best target first, the larger tier's best after the smaller's
    p95 without a first token; each tier's own policy orders its targets."""

    small: Policy
    small_targets: tuple[str, ...]
    large: Policy
    large_targets: tuple[str, ...]
    name: str = "tier-hedge"

    def plan(self, targets: Sequence[str], view: RouteView, rng: random.Random) -> Plan:
        given = set(targets)
        small = [t for t in self.small_targets if t in given]
        large = [t for t in self.large_targets if t in given and t not in small]
        if not small or not large:  # nothing to hedge across: one tier's own plan
            policy, names = (self.small, small) if small else (self.large, large)
            return dataclasses.replace(policy.plan(names, view, rng), key=None)
        first = self.small.plan(small, view, rng).order
        then = self.large.plan(large, view, rng).order
        order = (first[0], then[0], *first[1:], *then[1:])
        return Plan(order, hedge_delays=(view.predict(first[0], HEDGE_QUANTILE),))


def tier_hedge_route(small: Route, large: Route) -> Route:
    """One route over both tiers' targets (each keeps its own upstream model), planned by
    :class:`TierHedgePolicy`, with the smaller tier's settings and hedge budget; its
    first-token timeout is the longer of the two (the larger tier's answer may need it)."""
    known = {t.name for t in small.targets}
    targets = (*small.targets, *(t for t in large.targets if t.name not in known))
    a, b = small.first_token_timeout, large.first_token_timeout
    policy = TierHedgePolicy(
        small.policy,
        tuple(t.name for t in small.targets),
        large.policy,
        tuple(t.name for t in large.targets),
    )
    return dataclasses.replace(
        small,
        name=f"{small.name}|{large.name}",
        targets=targets,
        policy=policy,
        first_token_timeout=None if a is None or b is None else max(a, b),
    )
