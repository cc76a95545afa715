"""One routed request's run (:class:`Run`): its state, its plan and the budget its hedges spend.

Its parts live by concern: what it sends each target in :mod:`.bodies`, its attempts' failures
and retry delays in :mod:`.failures`, the race that carries out its plan in
:mod:`.coordinator` (one :class:`~.attempt.Attempt` per target), the winner's answer and its
continuation in :mod:`.answering`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import httpx

from .._types import AttemptReport, RouteReport
from .accounts import TokenAccount
from .answer import Ready
from .bodies import TargetBodies
from .estimate import prompt_messages
from .failures import RunFailures
from .goal import LatencyGoal, meet_goal
from .policies import Plan, explore
from .race import Race
from .route import Route, Sender
from .view import RequestView, RouterState
from .windows import answer_room, needed_tokens, too_long

__all__ = ["REMEASURE_AFTER", "Run"]

REMEASURE_AFTER = 3.0
"""Seconds: a target of a latency route that has no sample newer than this, and was not
explored since, may be re-measured (one request in ``1 / explore`` goes to it first,
:meth:`~.engine.Router.remeasure_due`), so a target that was only slow wins its traffic back
within seconds of being fast again. 10 s until issue 26: a recovered target then waited up to
~12 s for its first re-measure, and the p95 of the half-minute after its recovery was 1.3-1.6x
the per-request best (``benchmarks/routing.py --scenarios``, recover)."""
_LATENCY_POLICIES = ("fastest", "hedge", "race", "cheapest")
"""Policies that rank by live TTFT: their plans are explored (stale, cold targets re-measured)."""


class Run:
    """The state of one routed request: its plan, its attempts and the answer's account."""

    def __init__(
        self,
        router: RouterState,
        route: Route,
        body: dict[str, Any],
        send: Sender,
        report: RouteReport,
        prompt_tokens: int,
        stream: bool,
        kind: str = "chat",
    ) -> None:
        self.router = router
        self.route = route
        self.body = body
        self.send = send
        self.report = report
        self.prompt_tokens = prompt_tokens
        self.stream = stream
        self.kind = kind
        """``"chat"`` or ``"responses"``: the API of the call, and how its answer is decoded."""
        self.clock = router._clock
        self.t0 = self.clock()
        self.view = RequestView(router, prompt_tokens, stream, prompt_messages(body, kind))
        self.account = TokenAccount(body, prompt_tokens, report)
        """The answer's text and tokens, across the attempts that write it."""
        self.broken: list[str] = []
        self.in_flight: str | None = None
        """The winner's target while its stream is read (:meth:`finish` ends it)."""
        self.key: object = None
        """The key of the served plan, for a policy that wants to learn its outcome."""
        self.refused: set[str] = set()
        """Targets whose protocol cannot express the request: never tried, never penalised."""
        self.mismatched: set[str] = set()
        """Targets whose continuation did not begin as their vendor documents (:mod:`.splice`):
        not asked to continue this answer again."""
        self.goal: LatencyGoal | None = None
        """The request's latency goal (its own options over the route's), if any."""
        self.bodies = TargetBodies(body, kind, stream, self.account)
        """What the request sends each target."""
        self.failures = RunFailures(router, route, report, self.refused, prompt_tokens, body, kind)
        """Its attempts' failures, and what follows each."""

    def refuse_unservable(self, unservable: Iterable[str] = ()) -> None:
        """:meth:`.TargetBodies.refuse_unservable` over this request's route."""
        self.bodies.refuse_unservable(self.route, self.refused, unservable)

    def _too_long(self) -> set[str]:
        """The targets whose declared context window this request is estimated not to fit
        (:mod:`.windows`), each named in the route report with its reason."""
        windows = self.route.windows
        if not windows:
            return set()
        if self.refused:
            windows = {name: w for name, w in windows.items() if name not in self.refused}
        needed = needed_tokens(self.prompt_tokens, answer_room(self.body, self.kind))
        over = too_long(windows, needed)
        for name, window in over.items():
            self.report.left_out[name] = (
                f"context window {window} < ~{needed} tokens (prompt estimate + answer room)"
            )
        return set(over)

    def plan(self) -> Plan:
        router, route = self.router, self.route
        names = [t.name for t in route.targets]
        plan = route.policy.plan(names, self.view, router._rng)
        self.report.reason = plan.reason
        goal = self.goal
        if goal is not None and route.policy.name in ("fastest", "hedge", "race"):
            view = self.view
            plan = meet_goal(
                plan,
                goal,
                median=lambda t: view.predict(t, 0.5),
                speed=lambda t: router.stats.target(t).decode_speed(),
                available=view.available,
            )
        if route.policy.name in _LATENCY_POLICIES:
            delay = getattr(route.policy, "delay", None)
            max_age = min(router.stats.settings.window / 4, REMEASURE_AFTER)
            plan = explore(
                plan,
                self.view,
                share=router.explore_share,
                max_age=max_age,
                rng=router._rng,
                hedge_delay=(lambda t: delay(t, self.view)) if delay is not None else None,
                due=router.remeasure_due(route.name),
            )
            self.report.explored = plan.explored
            if plan.explored is not None:
                router.stats.target(plan.explored).explored(self.clock())
        left_out = self.refused | self._too_long()
        if left_out:
            plan = _without(plan, left_out, names)
            self.report.explored = plan.explored if self.report.explored else None
        if route.cost_budget is not None and plan.order:
            route.cost_budget.on_request(self.view.price(plan.order[0]))
        self._probe_open_circuits()
        return plan

    def spend_on_hedge(self, target: str) -> bool:
        """Whether the route's hedge budget allows a hedge to ``target`` (and takes it): in
        money when the route has ``hedge_budget_cost`` (a hedge of unknown price is refused),
        else in requests."""
        money = self.route.cost_budget
        if money is None:
            return self.route.budget.try_spend()
        return money.try_spend(self.view.price(target))

    def refund_hedge(self, target: str) -> None:
        """A hedge to ``target`` answered first: its budget is given back."""
        money = self.route.cost_budget
        if money is None:
            self.route.budget.refund()
        else:
            money.refund(self.view.price(target))

    def _probe_open_circuits(self) -> None:
        """The request itself is planned without the targets whose circuit is open and never
        waits on a trial: see :meth:`~.engine.Router.probe_open_circuits`."""
        self.router.probe_open_circuits(self.route)

    def request_stub(self) -> httpx.Request:
        return httpx.Request("POST", f"llmroute://route/{self.route.name}")

    def observe(self, key: object, winner: Ready | None) -> None:
        """Tell a policy that asked (a plan with a key) which target served the request."""
        observe = getattr(self.route.policy, "observe", None)
        if observe is not None:
            observe(key, winner.target.name if winner is not None else None)

    def answered(self, target: str, text: str) -> None:
        """Tell a policy that asked which target completed the answer, and its text (a plain
        text answer of one choice, as the next turn of the chat sends it back)."""
        answered = getattr(self.route.policy, "answered", None)
        if answered is not None and self.key is not None:
            answered(self.key, target, text)

    def begin_attempt(self, name: str, reason: str, state: Race) -> AttemptReport:
        """An attempt on ``name`` starting now: in the route report, and in flight in ``state``
        (the caller runs it, in its own task or in the race's task group)."""
        record = AttemptReport(target=name, started=self.clock() - self.t0, reason=reason)
        self.report.attempts.append(record)
        state.live += 1
        return record

    def finish(self) -> None:
        """The winner's stream ended: it no longer counts as in flight (idempotent)."""
        name, self.in_flight = self.in_flight, None
        if name is not None:
            self.router.stats.target(name).load.finished()


def _without(plan: Plan, refused: set[str], all_targets: Sequence[str]) -> Plan:
    """``plan`` with the attempts of ``refused`` targets left out (the policy planned for every
    target of the route: a weighted one needs them all), hedge delays kept with their attempts."""
    kept = [i for i, name in enumerate(plan.order) if name not in refused]
    if not kept:  # the policy planned only refused targets: the others, in the route's order
        return Plan(tuple(t for t in all_targets if t not in refused), key=plan.key)
    return dataclasses.replace(
        plan,
        order=tuple(plan.order[i] for i in kept),
        start=max(1, sum(1 for i in kept if i < plan.start)),
        hedge_delays=tuple(plan.hedge_delay(i) for i in kept),
        explored=plan.explored if plan.explored not in refused else None,
    )
