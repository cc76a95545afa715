"""The routing engine: carries out a policy's plan for one request (the race).

Attempts run in one task group. The first to produce a token wins; the others are cancelled by
leaving their scopes, which resets their HTTP/2 streams while the connections stay warm. Before
a first token, a failing attempt hands over to the next target (failover) and a slow one is
hedged when the plan says so and the route's hedge budget allows. After the first token the
caller reads the winner (:mod:`.answer`); if it breaks mid-answer, the engine races the
targets that can continue it (:mod:`.continuation`), so the caller's iterator goes on as one
answer, or raises :class:`~llmroute.StreamInterrupted` with the partial text. The answer's
tokens are counted in its account (:mod:`.accounts`).

The engine sends through a :data:`~.route.Sender` the client gives it (request building, keys
and URLs are the client's), decodes with the target's protocol adapter
(:func:`~llmroute.protocols.adapter_for`) and records every outcome in the live stats and the
targets' health.

This module holds :class:`Router`, the route-level facade, and the routed stream and completion
it returns; a request's phases live by concern: its state and plan in :mod:`.run` (over the
:mod:`.view` its policy reads), what it sends each target in :mod:`.bodies`, the race in
:mod:`.coordinator` with one :mod:`.attempt` per target sharing a :mod:`.race`, failures and
retry delays in :mod:`.failures`, the answer and its continuation in :mod:`.answering`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from .._errors import APIStatusError, describe_error
from .._types import RouteReport, Timings
from .answer import Answer, plain_answer
from .answering import answer_of
from .attempt import vendor_request_id
from .causes import classify, cooldown_after, is_health_failure, outcome
from .coordinator import MAX_WAIT_UNAVAILABLE, PROBE_PATIENCE, RETRY_SLACK, race
from .costs import pricer_for
from .estimate import prompt_messages
from .failures import awaits_trial, unavailable
from .goal import LatencyGoal
from .health import CircuitBreaker, TargetHealth
from .price import answer_tokens
from .route import SENDING, Route, RouteTarget, Sender
from .run import REMEASURE_AFTER, Run
from .stats import (
    LiveStats,
    StatsReport,
    class_label,
    estimate_prompt_tokens,
    prompt_class,
)
from .tokens import visible_tokens
from .view import RequestView

__all__ = [
    "MAX_WAIT_UNAVAILABLE",
    "PROBE_PATIENCE",
    "REMEASURE_AFTER",
    "RETRY_SLACK",
    "SENDING",
    "SERVER_METRICS_MAX_AGE",
    "Route",
    "RouteTarget",
    "RoutedCompletion",
    "RoutedStream",
    "Router",
    "Sender",
    "prompt_messages",
    "unavailable",
    "vendor_request_id",
]

SERVER_METRICS_MAX_AGE = 5.0
"""Seconds after which a target's ``/metrics`` reading no longer counts for its load."""


class Trials(Protocol):
    """The background trials of a router's open circuits (``routing.trials.CircuitTrials``)."""

    def start(self, target: RouteTarget, *, planned: bool = True) -> None:
        """Make sure ``target``'s trials are going (``planned``: a request was planned over
        it; else its circuit (re-)opened)."""
        ...

    def nudge(self) -> None:
        """Let the waiting trials read the clock again."""
        ...


class Router:
    """The routes of one client, their targets' live stats and health, and the engine."""

    def __init__(
        self,
        routes: Mapping[str, Route],
        *,
        stats: LiveStats | None = None,
        breaker_failures: int = 5,
        breaker_cooldown: float = 30.0,
        breaker_max_cooldown: float = 60.0,
        explore_share: float = 0.03,
        max_retries: int = 2,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.routes = dict(routes)
        self.stats = stats if stats is not None else LiveStats(clock=clock)
        self.max_retries = max_retries
        self.explore_share = explore_share
        self._breaker_failures = breaker_failures
        self._breaker_cooldown = breaker_cooldown
        self._breaker_max_cooldown = breaker_max_cooldown
        self._health: dict[str, TargetHealth] = {}
        self.trials: Trials | None = None
        """The background trials of open circuits (the client attaches them)."""
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock
        self._remeasure_credit: dict[str, float] = {}
        """Per route: its requests since its last re-measure of a stale target, times
        ``explore_share``, at most 1 (:meth:`remeasure_due`)."""
        self.misconfigured_cooldown = max(60.0, breaker_cooldown)
        """Seconds a target that answered 401, 403 or 404 (its key or model is wrong) is
        left out before it is tried again."""

    def remeasure_due(self, route: str) -> Callable[[], bool]:
        """Count one request of ``route`` towards its next re-measure of a stale target, and
        return the check :func:`~llmroute.routing.policies.explore` makes when one is stale:
        whether ``1 / explore_share`` requests came since the route's last re-measure (it then
        spends them). Pacing rather than a coin per request: at 2% a coin leaves gaps of three
        times the mean between re-measures one time in twenty, and a target that recovered
        waits out the gap on the slower one."""
        credit = min(1.0, self._remeasure_credit.get(route, 1.0) + self.explore_share)
        self._remeasure_credit[route] = credit

        def due() -> bool:
            if self._remeasure_credit.get(route, 0.0) < 1.0 - 1e-9:
                return False
            self._remeasure_credit[route] = 0.0
            return True

        return due

    def health(self, target: str) -> TargetHealth:
        health = self._health.get(target)
        if health is None:
            cooldown = self._breaker_cooldown
            breaker = CircuitBreaker(
                self._breaker_failures,
                cooldown,
                max_cooldown=max(self._breaker_max_cooldown, cooldown),
                clock=self._clock,
            )
            health = self._health[target] = TargetHealth(breaker, clock=self._clock)
            if self.trials is not None:
                breaker.trials_in_background(functools.partial(self._opened, target))
        return health

    def attach_trials(self, trials: Trials) -> None:
        """Let ``trials`` probe open circuits in the background: from now on no request is
        sent to a target whose circuit is not closed (see :mod:`.trials`)."""
        self.trials = trials
        for name, health in self._health.items():
            health.breaker.trials_in_background(functools.partial(self._opened, name))

    def _opened(self, name: str) -> None:
        """A circuit opened: its trials start."""
        trials = self.trials
        if trials is None:
            return
        for route in self.routes.values():
            for target in route.targets:
                if target.name == name:
                    trials.start(target, planned=False)
                    return

    def record_trial(self, target: str, exc: BaseException | None, *, keyed: bool = True) -> str:
        """The verdict of a background trial of ``target``'s open circuit (``exc`` ``None``:
        it answered): ``"closed"`` when the server answered, whatever it said but a 5xx or a
        wrong key or model (a 400 refusing the trial's shape proves it up; a 401 or 403 too
        when the target has no key of its own, ``keyed`` false: callers bring theirs);
        ``"failed"`` for a 5xx, a timeout, a connection error or a 401, 403 or 404 saying the
        key or model is wrong (re-opened, the next trial later, see
        :meth:`CircuitBreaker.record_failure`); ``"none"`` for a 429 (the next trial waits one
        cooldown and its Retry-After). Counted in the target's outcomes, as a request's is."""
        health, stats = self.health(target), self.stats.target(target)
        if exc is not None:
            stats.record_outcome(outcome(exc))
        status = exc.status_code if isinstance(exc, APIStatusError) else None
        cause = classify(exc) if exc is not None else None
        if status == 429 and isinstance(exc, APIStatusError):
            health.cool_down(cooldown_after(exc.response.headers))
            health.breaker.postpone()
            return "none"
        wrong = cause == "misconfigured" and (keyed or status not in (401, 403))
        if exc is None or (status is not None and cause != "server_error" and not wrong):
            health.breaker.record_success()
            if exc is None:
                stats.record_outcome("ok")
            return "closed"
        if wrong:  # a wrong key or model: trials wait for it too
            health.misconfigured(describe_error(exc), self.misconfigured_cooldown, exc)
        health.failed(exc)
        health.breaker.record_failure()
        return "failed"

    def soonest_available(self, targets: Iterable[str], *, trials: bool = True) -> float | None:
        """Seconds until the first of ``targets`` that is cooling down or has its circuit open
        may be tried again; ``None`` if none of them will be (or all are unknown).
        ``trials=False`` leaves out the circuits that wait for a background trial: only the
        trial's answer opens them to requests, and no request waits on a trial."""
        now = self._clock()
        times = [
            retry_at
            for name in targets
            if (trials or not awaits_trial(self.health(name)))
            and (retry_at := self.health(name).retry_at()) is not None
        ]
        return max(0.0, min(times) - now) if times else None

    def load(self, target: str) -> float:
        """The requests ``target`` is working on, per data-parallel rank.

        With a server reading (``stats.target(name).load.server``) younger than
        :data:`SERVER_METRICS_MAX_AGE`: the server's queued + running requests when the reading
        was taken, plus the change in this client's attempts in flight there since that time
        (see :meth:`~.load.TargetLoad.server_load`). Without one: this client's attempts in flight.
        """
        stats = self.stats.target(target)
        server = stats.load.server_load(SERVER_METRICS_MAX_AGE)
        return float(stats.load.in_flight) if server is None else server

    def snapshot(self) -> StatsReport:
        """Every target's live stats, with its circuit state (a dict that prints as a table)."""
        snaps = self.stats.snapshot()
        for route in self.routes.values():
            for target in route.targets:
                if target.name not in snaps:
                    snaps[target.name] = self.stats.target(target.name).snapshot()
        for name, snap in snaps.items():
            health = self._health.get(name)
            if health is not None:
                snaps[name] = dataclasses.replace(snap, breaker=health.breaker.state)
        return snaps

    # -- one request -----------------------------------------------------------------------

    def _begin(
        self,
        route: Route,
        body: dict[str, Any],
        send: Sender,
        *,
        stream: bool,
        kind: str = "chat",
        unservable: Iterable[str] = (),
        goal: LatencyGoal | None = None,
        prompt_tokens: int | None = None,
    ) -> Run:
        tokens = prompt_tokens
        if tokens is None:
            tokens = estimate_prompt_tokens(prompt_messages(body, kind))
        bounds = self.stats.settings.prompt_classes
        report = RouteReport(
            route=route.name,
            policy=route.policy.name,
            prompt_class=class_label(prompt_class(tokens, bounds), bounds),
            pricer=pricer_for(route),
            prompt_tokens=tokens,
        )
        run = Run(self, route, body, send, report, tokens, stream, kind)
        run.goal = run.view.goal = goal.over(route.goal) if goal is not None else route.goal
        if route.prices:
            run.view.prices = route.prices
            run.view.answer_tokens = answer_tokens(body)
        run.refuse_unservable(unservable)
        route.budget.on_request()
        return run

    def record_call(
        self,
        target: str,
        *,
        elapsed: float | None,
        exc: BaseException | None,
        kind: str = "chat",
    ) -> None:
        """Count one attempt the engine did not run itself (a completions or embeddings call,
        ``kind``, failing over across a route) in the target's stats and health, as the
        engine counts its own: ``exc`` ``None`` for a success taking ``elapsed`` seconds."""
        stats, health = self.stats.target(target), self.health(target)
        if exc is None:
            health.breaker.record_success()
            stats.record_outcome("ok")
            if elapsed is not None:
                stats.record_latency(elapsed)
            return
        counted = outcome(exc)
        if counted == "rate_limited" and isinstance(exc, APIStatusError):
            health.cool_down(cooldown_after(exc.response.headers))
        if classify(exc) == "misconfigured":
            health.misconfigured(describe_error(exc), self.misconfigured_cooldown, exc)
        if is_health_failure(exc):
            health.failed(exc, kind)
            health.breaker.record_failure()
        stats.record_outcome(counted)

    def order(self, route: Route, body: dict[str, Any], kind: str = "chat") -> list[str]:
        """The route's targets in the order its policy would try them for ``body`` (for calls
        the engine does not run itself: failover across them in this order)."""
        messages = prompt_messages(body, kind)
        view = RequestView(self, estimate_prompt_tokens(messages), False, messages)
        plan = route.policy.plan([t.name for t in route.targets], view, self._rng)
        self.probe_open_circuits(route)
        return list(plan.order)

    def predict_route(
        self, route: Route, body: dict[str, Any], q: float, *, kind: str = "chat", stream: bool
    ) -> float:
        """The lowest predicted ``q`` quantile of TTFT (of the whole answer when not
        ``stream``) among the route's available targets for ``body`` (a prior when cold;
        ``inf`` when none is available): how soon the route would answer it now."""
        messages = prompt_messages(body, kind)
        view = RequestView(self, estimate_prompt_tokens(messages), stream, messages)
        names = [t.name for t in route.targets if view.available(t.name)]
        return min((view.predict(name, q) for name in names), default=math.inf)

    def probe_open_circuits(self, route: Route) -> None:
        """Make sure every target of ``route`` whose circuit is open has its background trials
        going (the router's :class:`Trials`, on every policy), and wake those that are due.
        Called for each request planned over the route (the trials of a target nobody asks
        for stop after a while, see :mod:`.trials`)."""
        trials = self.trials
        if trials is None:
            return
        due = False
        for target in route.targets:
            health = self.health(target.name)
            if health.breaker.shared_state != "closed":
                trials.start(target)
                due = due or health.trial_due_in() == 0.0
        if due:  # on time, the trial's task wakes by itself; this is for a clock set ahead
            trials.nudge()

    async def stream(
        self,
        route: Route,
        body: dict[str, Any],
        send: Sender,
        *,
        kind: str = "chat",
        unservable: Iterable[str] = (),
        goal: LatencyGoal | None = None,
        raw: bool = False,
        prompt_tokens: int | None = None,
    ) -> RoutedStream:
        """Start a streamed request; returns once an attempt produced its first token.

        ``kind``: ``"chat"`` (chat completions) or ``"responses"`` (the Responses API, whose
        events the stream yields); ``unservable``: targets of the route that cannot serve this
        call (never tried, never penalised); ``goal``: the request's own latency goal, over the
        route's; ``raw``: the caller reads the vendor's body itself (``with_raw_response``,
        ``with_streaming_response``), so nothing it did not ask for is asked of the vendor;
        ``prompt_tokens``: the prompt's estimate (:func:`~.estimate.estimate_request`'s), when
        the caller counted it already."""
        run = self._begin(
            route,
            body,
            send,
            stream=True,
            kind=kind,
            unservable=unservable,
            goal=goal,
            prompt_tokens=prompt_tokens,
        )
        run.bodies.raw = raw
        ready = await race(run, run.plan(), retries=self.max_retries)
        return RoutedStream(run, answer_of(run, ready))

    async def complete(
        self,
        route: Route,
        body: dict[str, Any],
        send: Sender,
        *,
        kind: str = "chat",
        unservable: Iterable[str] = (),
        goal: LatencyGoal | None = None,
        prompt_tokens: int | None = None,
    ) -> RoutedCompletion:
        """A request that is not streamed: the first complete answer wins (the arguments as
        :meth:`stream`'s)."""
        run = self._begin(
            route,
            body,
            send,
            stream=False,
            kind=kind,
            unservable=unservable,
            goal=goal,
            prompt_tokens=prompt_tokens,
        )
        ready = await race(run, run.plan(), retries=self.max_retries)
        run.finish()
        text = plain_answer(ready.completion)
        if text is not None:
            tokens = visible_tokens(getattr(ready.completion, "usage", None))
            if tokens is not None:
                self.stats.target(ready.target.name).token_counts.record(tokens, text)
            if run.key is not None:
                run.answered(ready.target.name, text)
        return RoutedCompletion(ready.completion, ready.response, ready.timings, run.report)


@dataclass(slots=True)
class RoutedCompletion:
    completion: Any
    """A ``ChatCompletion``, or a Responses API ``Response``."""
    response: httpx.Response
    timings: Timings
    report: RouteReport


class RoutedStream:
    """The engine's side of a routed stream: its chunks, report and the current response."""

    def __init__(self, run: Run, answer: Answer) -> None:
        self.run = run
        self.answer = answer
        self.report = run.report
        self.response = answer.first.response
        self.timings = answer.first.timings
        weakref.finalize(self, run.finish)

    def chunks(self, on_switch: Callable[[httpx.Response], None]) -> AsyncIterator[Any]:
        """The answer's chunks; ``on_switch`` gets the response of a continuation."""
        return self.answer.chunks(on_switch)

    @property
    def complete(self) -> bool:
        """Whether the answer was read to its end and is whole."""
        return self.answer.complete

    @property
    def text(self) -> str:
        return "".join(self.run.account.text)

    def finish(self) -> None:
        """The stream ended: the winner no longer counts as in flight (idempotent)."""
        self.run.finish()
