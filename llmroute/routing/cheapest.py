"""Policy ``cheapest``: the cheapest target whose live TTFT meets the request's latency goal.

Pure, like the other policies (:mod:`.policies`): it reads the goal and each target's expected
cost for this request from the :class:`~llmroute.routing.policies.RouteView` (``ttft_target()``
and ``price(target)``, both optional there: without them every target meets the goal and none
has a price) and returns a :class:`~llmroute.routing.policies.Plan`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .policies import Plan, RouteView, rank_quantile

__all__ = ["CheapestPolicy"]


def _none() -> None:
    return None


@dataclass(frozen=True)
class CheapestPolicy:
    """The cheapest available target whose predicted ``rank_by`` TTFT (p95) for this prompt
    meets the goal's ``ttft_target`` first; then the others that meet it, cheapest first; then
    those that miss it, fastest first. A target of unknown price meets the goal only after
    every priced one (an unknown price is never taken for free). When no available target
    meets the goal, the fastest goes first (the plan ``fastest`` would make).

    The first attempt is hedged (up to ``max_hedges`` attempts) to the next target once the
    goal is at risk: when the next target's median would only just still meet it, but not
    before the first target's own ``rank_by`` TTFT, so that a hedge, which spends money, goes
    out only when the first attempt is late by its own measure. Hedges go through the route's
    budget, in money when it has ``hedge_budget_cost``.
    """

    rank_by: str = "p95"
    max_hedges: int = 1
    name: str = "cheapest"

    def delay(self, target: str, view: RouteView) -> float:
        """The hedge delay of an explored target: its own ``rank_by`` TTFT."""
        return view.predict(target, rank_quantile(self.rank_by))

    def plan(self, targets: Sequence[str], view: RouteView, rng: random.Random) -> Plan:
        q = rank_quantile(self.rank_by)
        goal = getattr(view, "ttft_target", _none)()
        price: Callable[[str], float | None] = getattr(view, "price", lambda t: None)
        tail = {t: view.predict(t, q) for t in targets}
        ready = [t for t in targets if view.available(t)]
        meeting = [t for t in ready if goal is None or tail[t] <= goal]
        if meeting:
            costs = {t: price(t) for t in meeting}
            meeting.sort(key=lambda t: (costs[t] is None, costs[t] or 0.0, tail[t]))
            first = meeting[0]
            cost = costs[first]
            spend = "unknown price" if cost is None else f"${cost:.6f}"
            reason = f"cheapest: meets the goal at {self.rank_by} {1000 * tail[first]:.0f} ms"
            reason += f", {spend}" if goal is not None else f" (no goal), {spend}"
        else:
            reason = f"fastest: no target's {self.rank_by} TTFT meets the goal"
        rest = sorted((t for t in ready if t not in meeting), key=tail.__getitem__)
        late = sorted((t for t in targets if t not in ready), key=tail.__getitem__)
        order = (*meeting, *rest, *late)
        hedges = min(self.max_hedges, len(order) - 1)
        delays: list[float] = []
        for index in range(hedges):
            own = tail[order[index]]
            if goal is not None:
                at_risk = goal - view.predict(order[index + 1], 0.5)
                own = max(own, at_risk) if math.isfinite(at_risk) else own
            delays.append(own)
        return Plan(order, hedge_delays=tuple(delays), reason=reason)
