"""A tiered model name's stage of a call (docs/tiers.md): which route (tier) the call goes to.

:class:`Tiering` classifies a call's body with its name's :class:`~._tiers.TieredModel`, puts
the chosen tier's route on the call (a route that hedges across two tiers when the classifier is
unsure, :mod:`.routing.tierhedge`), and, once the call is answered, puts the decision on its
route report and remembers it for the conversation's follow-ups. It runs before the cache and
the engine; a tier that cannot serve the call gives way to the name's default tier.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from openai import BadRequestError

from ._call import Call, Served, bad_request, serves
from ._response_pins import ResponsePins
from ._tiers import TieredModel, TierError, conversation_of
from ._timeouts import with_timeouts
from ._types import RouteReport, TierDecision
from .config import ResolvedProvider
from .metrics import ClientMetrics
from .routing.engine import Router
from .routing.goal import LatencyGoal
from .routing.route import Route
from .routing.tierhedge import HEDGE_QUANTILE, tier_hedge_route

__all__ = ["Tiering", "tier_option"]

log = logging.getLogger("llmroute")


class Tiering:
    """The tiered model names of one client and its copies, as their calls meet them."""

    def __init__(
        self,
        models: dict[str, TieredModel],
        *,
        router: Router,
        providers: Mapping[str, ResolvedProvider],
        pins: ResponsePins,
        metrics: ClientMetrics,
        goal: Callable[[Call], LatencyGoal | None],
    ) -> None:
        self.models = models
        """Tiered model names, each with its classifier, built on first use."""
        self.router, self.providers, self.pins, self.metrics = router, providers, pins, metrics
        self.goal = goal
        """The call's latency goal (:meth:`Dispatch.goal`)."""
        self.hedges: dict[tuple[str, str], Route] = {}
        """The routes that hedge an unsure call across two tiers, by (smaller, larger)."""

    async def decide(self, call: Call) -> TierDecision | None:
        """For a call of a tiered model name: classify its body (the classifier built on first
        use, in a worker thread) and put its tier's route on the call, as a call for that
        route would have it. Never raises for the classifier's sake (docs/tiers.md)."""
        choice = call.tiered
        if choice is None:
            return None
        if choice.decision is None:
            if choice.forced is None and not choice.model.ready:
                await choice.model.prepare()
            model = choice.model
            held = self._conversation_tier(call, model) if choice.forced is None else None
            if held is not None:  # a follow-up goes where its conversation is kept
                decision = model.conversation(held)
            else:
                if call.kind == "chat":
                    try:
                        choice.conversation = conversation_of(call.body)
                    except Exception:  # pragma: no cover - a body it cannot hash: no stickiness
                        log.debug("tiers: a chat body's conversation could not be hashed")
                goal = self.goal(call)
                target = goal.ttft_target if goal is not None else None
                decision = model.decide(
                    call.body,
                    choice.forced,
                    conversation=choice.conversation,
                    ttft_target=target,
                    p95=None if target is None else functools.partial(self._p95, call),
                )
            route = self.router.routes[decision.tier]
            why = self._cannot_serve(call, route)
            if why is None and decision.hedged is not None:
                larger = self.router.routes[decision.hedged[1]]
                why = self._cannot_serve(call, larger)
                if why is None:
                    route = self._hedge_route(route, larger)
            if why is not None and (decision.tier != model.default or decision.hedged):
                decision = dataclasses.replace(  # the default tier serves it (classify() checked)
                    decision, tier=model.default, reason="default", error=why, hedged=None
                )
                route = self.router.routes[decision.tier]
            call.route, call.timeout = with_timeouts(route, choice.timeout, choice.own)
            choice.decision = decision
        return choice.decision

    def _p95(self, call: Call, tier: str) -> float:
        """A tier's live p95 TTFT (of the whole answer for a call not streamed) for this call."""
        route = self.router.routes[tier]
        return self.router.predict_route(
            route, call.body, HEDGE_QUANTILE, kind=call.kind, stream=call.stream
        )

    def _hedge_route(self, small: Route, large: Route) -> Route:
        """The route that hedges an unsure call from ``small`` to ``large`` (built once)."""
        key = (small.name, large.name)
        route = self.hedges.get(key)
        if route is None:
            route = self.hedges[key] = tier_hedge_route(small, large)
        return route

    def answered(self, call: Call, result: Served | Any) -> TierDecision | None:
        """A tiered call's decision once answered (or failed), put on its route report: a
        hedged call's ``tier`` is the one whose target won; a chat turn's tier is
        remembered for its conversation's follow-ups."""
        choice = call.tiered
        decision = choice.decision if choice is not None else None
        if choice is None or decision is None:
            return None
        value = result.result if isinstance(result, Served) else result
        report = getattr(value, "route", None)
        if not isinstance(report, RouteReport):
            report = getattr(value, "report", None)
        if decision.hedged is not None and isinstance(report, RouteReport):
            larger = self.router.routes[decision.hedged[1]]
            won = report.winner is not None and report.winner != "cache"
            if won and not any(
                t.name == report.winner for t in self.router.routes[decision.tier].targets
            ):
                if any(t.name == report.winner for t in larger.targets):
                    decision = dataclasses.replace(decision, tier=larger.name)
            if won:
                self.metrics.tier_hedge_answered(decision)
            if call.route is not None and report.route == call.route.name:
                report.route = decision.tier  # the hedge route's name: the tier that served
        if isinstance(report, RouteReport):
            report.tier = decision
        if not isinstance(result, BaseException):
            choice.model.remember(choice.conversation, decision)
        return decision

    def _conversation_tier(self, call: Call, model: TieredModel) -> str | None:
        """The tier whose route holds the response a Responses call continues (its
        ``previous_response_id`` pinned to one of that route's targets), if any."""
        previous = call.body.get("previous_response_id") if call.kind == "responses" else None
        pinned = self.pins.holder(previous) if isinstance(previous, str) else None
        if pinned is None:
            return None
        routes = self.router.routes
        order = [model.default, *model.tiers.values()]
        return next((r for r in order if any(t.name == pinned for t in routes[r].targets)), None)

    def _cannot_serve(self, call: Call, route: Route) -> str | None:
        """Why ``route`` cannot serve ``call`` (its API, or the response it continues), or
        ``None`` when it can: a tier that cannot gives way to the default tier."""
        if not any(serves(self.providers[t.provider], call.kind) for t in route.targets):
            return f"route {route.name!r} cannot serve the {call.kind} API"
        try:
            self.pins.unservable(call, route)
        except BadRequestError as exc:
            return exc.message[:300]
        return None


def tier_option(
    options: object, tiered: TieredModel | None, model: object
) -> tuple[object, str | None]:
    """The call's ``llmroute`` options without ``tier``, and the route ``tier`` names."""
    if not isinstance(options, Mapping) or "tier" not in options:
        return options, None
    rest = {k: v for k, v in options.items() if k != "tier"}
    if tiered is None:
        raise bad_request(
            f"llmroute.tier: model {str(model)[:80]!r} is not a tiered model name",
            param="llmroute.tier",
        )
    try:
        forced = tiered.forced(options["tier"])
    except TierError as exc:
        raise bad_request(str(exc), param="llmroute.tier") from None
    return (rest or None), forced
