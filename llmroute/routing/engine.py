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
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import anyio
import anyio.abc
import httpx
from openai import BadRequestError
from openai.types.chat import ChatCompletionChunk

from .._background import spawn
from .._errors import (
    AllTargetsFailed,
    APIError,
    APIStatusError,
    FirstTokenTimeout,
    RequestBodyError,
    TargetUnavailable,
    describe_error,
    map_transport_errors,
    stream_ended,
)
from .._types import AttemptReport, RouteReport, Timings
from ..protocols import adapter_for
from ..protocols.reader import StreamReader
from ..transport import body_receiver, close_quietly, replay_head
from .accounts import TokenAccount
from .answer import Answer, Ready, plain_answer, won_attempt
from .causes import (
    REQUEST_CAUSES,
    any_retryable,
    classify,
    cooldown_after,
    error_message,
    is_health_failure,
    outcome,
    react,
    round_delay,
)
from .continuation import (
    continuation_body,
    continuation_order,
    interrupted,
    no_continuation_target,
    not_continuable,
)
from .costs import lost_cost, pricer_for
from .estimate import prompt_messages
from .goal import LatencyGoal, meet_goal
from .health import CircuitBreaker, TargetHealth, fails_open
from .policies import Plan, explore
from .price import EXPECTED_ANSWER_TOKENS, TargetPrice, answer_tokens
from .route import SENDING, Route, RouteTarget, Sender
from .splice import ContinuationMismatch
from .stats import (
    LiveStats,
    StatsReport,
    class_label,
    estimate_prompt_tokens,
    first_token_deadline,
    prompt_class,
)
from .tokens import visible_tokens
from .windows import answer_room, larger_windows, needed_tokens, refused_window, too_long

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
REMEASURE_AFTER = 3.0
"""Seconds: a target of a latency route that has no sample newer than this, and was not
explored since, may be re-measured (one request in ``1 / explore`` goes to it first,
:meth:`Router.remeasure_due`), so a target that was only slow wins its traffic back within
seconds of being fast again. 10 s until issue 26: a recovered target then waited up to ~12 s
for its first re-measure, and the p95 of the half-minute after its recovery was 1.3-1.6x the
per-request best (``benchmarks/routing.py --scenarios``, recover)."""
PROBE_PATIENCE = 0.99
"""A probe that lost its race runs on to its first token for at most its target's predicted
quantile this high (the prior's while it has no samples: 3.2 s with ``ttft_prior = "1s"``), then
is cancelled as a censored sample: a target that slow is known to be slow without waiting out
a stall."""
RETRY_SLACK = 0.05
"""Seconds an ordered route's retry of the same target may wait past its Retry-After for the
target's cooldown to end (the clocks of the cooldown and of the wait may differ slightly)."""
MAX_WAIT_UNAVAILABLE = 2.0
"""How long a request waits, at most, for one of its targets to be free again when none can be
asked (all cooling down after a 429, or with open circuits); a stream also within its first-token
deadline. A longer wait is the caller's to decide: it gets AllTargetsFailed saying why."""
_LATENCY_POLICIES = ("fastest", "hedge", "race", "cheapest")
"""Policies that rank by live TTFT: their plans are explored (stale, cold targets re-measured)."""


async def _sending(record: AttemptReport, opening: Awaitable[Ready]) -> Ready:
    """``opening`` with ``record`` as the attempt being sent (:data:`SENDING`)."""
    token = SENDING.set(record)
    try:
        return await opening
    finally:
        SENDING.reset(token)


class Trials(Protocol):
    """The background trials of a router's open circuits (``routing.trials.CircuitTrials``)."""

    def start(self, target: RouteTarget, *, planned: bool = True) -> None:
        """Make sure ``target``'s trials are going (``planned``: a request was planned over
        it; else its circuit (re-)opened)."""
        ...

    def nudge(self) -> None:
        """Let the waiting trials read the clock again."""
        ...


class _Race:
    """What the attempts of one race share: the winner and a wake-up for the coordinator."""

    def __init__(self) -> None:
        self.winner: Ready | None = None
        self.live = 0
        self.failures: dict[str, BaseException] = {}
        self.last: BaseException | None = None
        self.final: Exception | None = None
        """The request itself is at fault (it cannot be encoded, or a target refused it as
        invalid): the race ends with this error, raised to the caller unchanged."""
        self.again: tuple[str, float] | None = None
        """A target to try again, and when (the event loop's clock): an ordered route's
        primary after a short Retry-After or a 5xx."""
        self.refused_at: int | None = None
        """The largest declared context window that answered a context-length error: only
        targets with a larger one are tried after it."""
        self.continuing = False
        """A race for a continuation: a target that refuses the request (a 400 or 422 for
        its form) hands over to the next continuation target instead of ending the race."""
        self.running_on: list[tuple[anyio.CancelScope, float]] = []
        """Probes in tasks of their own, each with the time (the event loop's clock) it gives
        up at once the race is decided (:meth:`decided`)."""
        self._event = anyio.Event()

    def decided(self) -> None:
        """The race has its winner (or has failed): its probes wait no longer than their
        patience."""
        for scope, until in self.running_on:
            scope.deadline = until

    def notify(self) -> None:
        self._event.set()

    async def wait(self, timeout: float) -> None:
        with anyio.move_on_after(timeout):
            await self._event.wait()
        self._event = anyio.Event()


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
            if (trials or not _awaits_trial(self.health(name)))
            and (retry_at := self.health(name).retry_at()) is not None
        ]
        return max(0.0, min(times) - now) if times else None

    def load(self, target: str) -> float:
        """The requests ``target`` is working on, per data-parallel rank.

        With a server reading (``stats.target(name).server``) younger than
        :data:`SERVER_METRICS_MAX_AGE`: the server's queued + running requests when the reading
        was taken, plus the change in this client's attempts in flight there since that time
        (see :meth:`TargetStats.server_load`). Without one: this client's attempts in flight.
        """
        stats = self.stats.target(target)
        server = stats.server_load(SERVER_METRICS_MAX_AGE)
        return float(stats.in_flight) if server is None else server

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
    ) -> _Run:
        tokens = estimate_prompt_tokens(prompt_messages(body, kind))
        bounds = self.stats.settings.prompt_classes
        report = RouteReport(
            route=route.name,
            policy=route.policy.name,
            prompt_class=class_label(prompt_class(tokens, bounds), bounds),
            pricer=pricer_for(route),
            prompt_tokens=tokens,
        )
        run = _Run(self, route, body, send, report, tokens, stream, kind)
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
        view = _View(self, estimate_prompt_tokens(messages), False, messages)
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
        view = _View(self, estimate_prompt_tokens(messages), stream, messages)
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
    ) -> RoutedStream:
        """Start a streamed request; returns once an attempt produced its first token.

        ``kind``: ``"chat"`` (chat completions) or ``"responses"`` (the Responses API, whose
        events the stream yields); ``unservable``: targets of the route that cannot serve this
        call (never tried, never penalised); ``goal``: the request's own latency goal, over the
        route's; ``raw``: the caller reads the vendor's body itself (``with_raw_response``,
        ``with_streaming_response``), so nothing it did not ask for is asked of the vendor."""
        run = self._begin(
            route, body, send, stream=True, kind=kind, unservable=unservable, goal=goal
        )
        run.raw = raw
        ready = await run.race(run.plan(), retries=self.max_retries)
        return RoutedStream(run, run.answer(ready))

    async def complete(
        self,
        route: Route,
        body: dict[str, Any],
        send: Sender,
        *,
        kind: str = "chat",
        unservable: Iterable[str] = (),
        goal: LatencyGoal | None = None,
    ) -> RoutedCompletion:
        """A request that is not streamed: the first complete answer wins."""
        run = self._begin(
            route, body, send, stream=False, kind=kind, unservable=unservable, goal=goal
        )
        ready = await run.race(run.plan(), retries=self.max_retries)
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


class _View:
    """A :class:`~llmroute.routing.policies.RouteView` over the router's stats and health."""

    def __init__(
        self,
        router: Router,
        prompt_tokens: int,
        stream: bool,
        messages: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self._router = router
        self._tokens = prompt_tokens
        self._stream = stream
        self._messages = messages
        self.goal: LatencyGoal | None = None
        self.prices: Mapping[str, TargetPrice] = {}
        self.answer_tokens = EXPECTED_ANSWER_TOKENS

    def predict(self, target: str, q: float | None) -> float:
        stats = self._router.stats.target(target)
        if not self._stream:
            return stats.predict_latency(q if q is not None else 0.5)
        if q is None:
            mean = stats.snapshot().ttft_mean
            return mean if mean is not None else stats.predict(0.5, self._tokens)
        return stats.predict(q, self._tokens)

    def available(self, target: str) -> bool:
        return self._router.health(target).available()

    def rank(self, target: str, q: float) -> float:
        """What ``target`` is ranked by for the ``q`` quantile (``TargetStats.rank``)."""
        if not self._stream:
            return self.predict(target, q)
        return self._router.stats.target(target).rank(q, self._tokens)

    def hedge_delay(self, target: str, q: float, backup: float) -> float:
        """When to hedge an attempt on ``target`` (``TargetStats.hedge_delay``), its live
        ``q`` quantile at the earliest; a hedge to a target answering in ``backup`` seconds."""
        if not self._stream:
            return self.predict(target, q)
        return self._router.stats.target(target).hedge_delay(q, backup, self._tokens)

    @property
    def probes(self) -> bool:
        """Whether a probe of a cold target runs on to its first token whoever wins (a
        stream's: its TTFT is the sample; :meth:`_Coordinator.run_on`)."""
        return self._stream

    def cold(self, target: str) -> bool:
        stats = self._router.stats.target(target)
        if self._stream:  # the samples on their way (probes running on) count
            return stats.needs_samples()
        return stats.cold(streamed=False)

    def improving(self, target: str) -> bool:
        """Whether the target's newest TTFT sample is below the range of its older ones."""
        return self._stream and self._router.stats.target(target).improving

    def unanswered(self, target: str) -> int:
        """Explorations of the target since its newest sample."""
        return self._router.stats.target(target).unanswered_explorations(streamed=self._stream)

    def staleness(self, target: str) -> float:
        stats = self._router.stats.target(target)
        newest = stats.newest_at(streamed=self._stream)
        explored = stats.explored_at
        if explored is not None:
            newest = explored if newest is None else max(newest, explored)
        return math.inf if newest is None else self._router._clock() - newest

    def load(self, target: str) -> float:
        return self._router.load(target)

    def messages(self) -> Sequence[Mapping[str, Any]]:
        return self._messages

    def ttft_target(self) -> float | None:
        """The request's TTFT goal in seconds (its own over the route's), if any."""
        goal = self.goal
        return None if goal is None else goal.ttft_target

    def price(self, target: str) -> float | None:
        """The expected cost of this request on ``target`` in USD (:mod:`.price`); ``None``
        when its price is not known."""
        known = self.prices.get(target)
        return None if known is None else known.estimate(self._tokens, self.answer_tokens)


class _Run:
    """The state of one routed request: its plan, its attempts and the answer's account."""

    def __init__(
        self,
        router: Router,
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
        self.view = _View(router, prompt_tokens, stream, prompt_messages(body, kind))
        self.account = TokenAccount(body, prompt_tokens, report)
        """The answer's text and tokens, across the attempts that write it."""
        self.broken: list[str] = []
        self._in_flight: str | None = None
        self.key: object = None
        """The key of the served plan, for a policy that wants to learn its outcome."""
        self.refused: set[str] = set()
        """Targets whose protocol cannot express the request: never tried, never penalised."""
        self.mismatched: set[str] = set()
        """Targets whose continuation did not begin as their vendor documents (:mod:`.splice`):
        not asked to continue this answer again."""
        self.retried: dict[str, int] = {}
        """Retries of the same target in this request (an ordered route's primary)."""
        self.failed_open: set[str] = set()
        """Targets asked although their circuit was open (:meth:`fails_open`), once each."""
        self.goal: LatencyGoal | None = None
        """The request's latency goal (its own options over the route's), if any."""
        self.raw = False
        """The caller reads the vendor's body itself: usage it did not ask for is not asked
        (it would be in that body; the count falls back on one token per delta)."""

    def refuse_unservable(self, unservable: Iterable[str] = ()) -> None:
        """Leave out the targets the caller named as unable to serve the call, and those whose
        protocol cannot express this request (an Anthropic target asked for ``n > 1``, say);
        raise the first refusal if no target is left."""
        self.refused.update(unservable)
        first: BadRequestError | None = None
        for target in self.route.targets:
            adapter = adapter_for(target.protocol)
            if not adapter.translates or self.kind != "chat":
                continue
            try:
                adapter.wire_request(
                    "chat/completions", self.body_for(target, None), target=target.name
                )
            except BadRequestError as exc:
                self.refused.add(target.name)
                first = first or exc
        if first is not None and len(self.refused) == len(self.route.targets):
            raise first

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

    def _larger_window_follows(self, target: str, state: _Race, exc: Exception) -> bool:
        """After ``target`` answered a context-length error: whether a target of the route
        with a larger declared window may still take the request (then only such targets
        are tried next, see ``_Race.refused_at``). The refusing target's window is its
        declared one, else the one its error names, else the request's own estimate
        (:func:`.windows.refused_window`)."""
        window = refused_window(
            self.route.target(target).context_window,
            error_message(exc),
            needed_tokens(self.prompt_tokens, answer_room(self.body, self.kind)),
        )
        state.refused_at = max(window, state.refused_at or 0)
        windows = {
            name: w
            for name, w in self.route.windows.items()
            if name not in self.refused and name not in self.report.left_out
        }
        return bool(larger_windows(windows, state.refused_at))

    def _window_above(self, target: str, tokens: int) -> bool:
        window = self.route.windows.get(target)
        return window is not None and window > tokens

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
        waits on a trial: see :meth:`Router.probe_open_circuits`."""
        self.router.probe_open_circuits(self.route)

    def request_stub(self) -> httpx.Request:
        return httpx.Request("POST", f"llmroute://route/{self.route.name}")

    def body_for(self, target: RouteTarget, prefix: str | None) -> dict[str, Any]:
        body = dict(self.body)
        body["model"] = target.model
        if self.kind != "chat":
            return body
        if not target.stream_usage:
            body.pop("stream_options", None)
        elif self.asks_usage(target):
            # The vendor's count of its tokens: at the end of a completed answer (it calibrates
            # the target's estimate, :mod:`.tokens`), or on every chunk where it can.
            options = dict(cast(Mapping[str, Any], body.get("stream_options") or {}))
            options["include_usage"] = True
            if target.stream_usage_continuous:
                options["continuous_usage_stats"] = True
            body["stream_options"] = options
        if target.max_tokens_field is not None:
            adapter_for(target.protocol).send_limit_as(body, target.max_tokens_field)
        if prefix is not None:
            continuation_body(body, target, prefix, self.account.delivered)
        return body

    def asks_usage(self, target: RouteTarget) -> bool:
        """Whether :meth:`body_for` asks ``target`` for usage in the stream."""
        return (
            self.stream
            and not self.raw
            and self.kind == "chat"
            and target.stream_usage
            and adapter_for(target.protocol).stream_usage
            and isinstance(self.body.get("stream_options") or {}, Mapping)
        )

    async def race(self, plan: Plan, *, retries: int, prefix: str | None = None) -> Ready:
        """Run ``plan`` until an attempt has a first token; raise AllTargetsFailed if none."""
        route, report, clock = self.route, self.report, self.clock
        state = _Race()
        state.continuing = prefix is not None
        try:
            try:
                await _Coordinator(self, plan, state, retries=retries, prefix=prefix).coordinate()
            finally:
                state.decided()
        except BaseException:
            winner = state.winner
            if winner is not None:  # the caller gave up after a first token: release it too
                await close_quietly(winner.response)
                self.router.stats.target(winner.target.name).finished()
            raise
        if plan.key is not None:
            self._observe(plan.key, state.winner)
            if state.winner is not None:
                self.key = plan.key
        if state.winner is None and state.final is not None:
            raise state.final
        if state.winner is None:
            raise AllTargetsFailed(
                route.name, state.failures, self.request_stub(), report=self.report, last=state.last
            )
        if report.ttft is None:
            report.ttft = clock() - self.t0
        if self.stream:
            self._in_flight = state.winner.target.name
        return state.winner

    def _observe(self, key: object, winner: Ready | None) -> None:
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

    def _others(self, target: str) -> list[str]:
        """The targets of the route but ``target`` that may serve this request."""
        left_out = self.refused.union(self.report.left_out, (target,))
        return [t.name for t in self.route.targets if t.name not in left_out]

    def fails_open(self, target: str) -> bool:
        """Whether an attempt on ``target``, whose circuit is open, goes all the same (once
        in a request): no target of the request may be asked (:func:`.health.fails_open`)."""
        others = [self.router.health(name) for name in self._others(target)]
        if target in self.failed_open or not fails_open(self.router.health(target), others):
            return False
        self.failed_open.add(target)
        return True

    def _begin_attempt(self, name: str, reason: str, state: _Race) -> AttemptReport:
        """An attempt on ``name`` starting now: in the route report, and in flight in ``state``
        (the caller runs it, in its own task or in the race's task group)."""
        record = AttemptReport(target=name, started=self.clock() - self.t0, reason=reason)
        self.report.attempts.append(record)
        state.live += 1
        return record

    def _soonest_available(self, targets: Sequence[str], *, trials: bool = True) -> float | None:
        """:meth:`Router.soonest_available` of ``targets`` that may serve this request."""
        names = [name for name in targets if name not in self.refused]
        return self.router.soonest_available(names, trials=trials)

    def _retry_delay(self, rounds: int, failures: Mapping[str, BaseException]) -> float:
        router = self.router
        return round_delay(
            failures.values(),
            rounds=rounds,
            max_retries=router.max_retries,
            rand=router._rng.random(),
        )

    def _failed(
        self, record: AttemptReport, state: _Race, exc: Exception, counted: str, *, count: bool
    ) -> None:
        """``record``'s attempt failed with ``exc`` (counted as ``counted`` in its target's
        stats when ``count``): what the race does next, in ``state``."""
        record.outcome = counted
        record.error = describe_error(exc)
        if count:
            self.router.stats.target(record.target).record_outcome(counted)
        if not isinstance(exc, TargetUnavailable) or record.target not in state.failures:
            state.failures[record.target] = exc
        if not isinstance(exc, TargetUnavailable):
            state.last = exc
            rules = self.route.rules()
            if state.continuing:
                rules = dataclasses.replace(rules, failover_on=REQUEST_CAUSES)
            reaction = react(
                exc,
                rules,
                retried=self.retried.get(record.target, 0),
                now=time.time(),
            )
            if reaction.action == "raise" and state.winner is None:
                if reaction.cause != "context_length" or not self._larger_window_follows(
                    record.target, state, exc
                ):
                    state.final = exc
            elif reaction.action == "retry" and state.again is None:
                self.retried[record.target] = self.retried.get(record.target, 0) + 1
                state.again = (record.target, anyio.current_time() + reaction.delay)
        state.live -= 1
        state.notify()

    def first_token_deadline(self, target: str, prefix: str | None) -> float | None:
        """Seconds an attempt on ``target`` may wait for its first token: from the target's
        live p99 TTFT for the prompt's length class (:func:`~.stats.first_token_deadline`),
        the route's ``first_token_timeout`` as the cap (``None``: no deadline); the cap alone
        for a continuation, whose prompt is longer by the answer so far, and on the only target
        that may serve the request: the live deadline is there to move on sooner, and with
        nowhere to go, cutting the attempt only sends the request to the back of the same
        target's queue (a burst's own queueing is not a failure). Another target, even with
        its circuit open, is somewhere to go (:meth:`fails_open`)."""
        cap = self.route.first_token_timeout
        if cap is None or prefix is not None or not self._others(target):
            return cap
        p99 = self.router.stats.target(target).class_quantile(0.99, self.prompt_tokens)
        return first_token_deadline(p99, cap=cap)

    async def continue_answer(
        self, ready: Ready, failure: APIError, continuable: bool
    ) -> Ready | None:
        """Continue a broken answer on another target (:mod:`.continuation`), or raise
        StreamInterrupted; ``None`` when the answer already holds the caller's ``max_tokens``
        (counted low): it ends there with ``finish_reason="length"``."""
        await close_quietly(ready.response)
        self._broke(ready, failure)
        route, account = self.route, self.account
        partial = "".join(account.text)
        request = ready.response.request
        name = ready.target.name
        broke = f"The stream from {name!r} broke after {account.tokens} tokens ({failure.message})"
        why = not_continuable(
            route,
            continued=len(self.report.continued_on),
            continuable=continuable,
            reasoned=account.reasoned,
            partial=partial,
        )
        if why is not None:
            why = f"it cannot be continued ({why})"
            raise interrupted(broke, why, request, partial, failure) from failure
        if account.limit is not None and account.delivered >= account.limit:
            return None  # the count errs low: the answer holds at least the tokens asked
        left_out = self.refused | self.mismatched
        order = continuation_order(route, self.view, left_out=left_out, broken=self.broken)
        if not order:
            why = no_continuation_target(route, self.mismatched)
            raise interrupted(broke, why, request, partial, failure) from failure
        try:
            new = await self.race(Plan(order), retries=0, prefix=partial)
        except APIError as exc:  # every target failed, or one refused the continuation
            why = f"no target could continue it ({exc.message})"
            raise interrupted(broke, why, request, partial, failure) from failure
        self.report.continued_on.append(new.target.name)
        account.continued()
        return new

    def _broke(self, ready: Ready, failure: APIError) -> None:
        """The answer's stream from ``ready`` broke: counted against its target, in the
        route report, and its tokens in the account."""
        name = ready.target.name
        self.finish()
        stats = self.router.stats.target(name)
        stats.record_outcome("interrupted")
        health = self.router.health(name)
        health.failed(failure, self.kind)  # the cause a request refused while open names
        health.breaker.record_failure()
        self.broken.append(name)
        if isinstance(failure, ContinuationMismatch):
            self.mismatched.add(name)
        tokens, counted, estimate = self.account.delivered_by(ready.decoder, stats.token_counts)
        self.account.broke(tokens, counted)
        record = won_attempt(self.report, name)
        if record is not None:
            record.outcome = "interrupted"
            record.error = describe_error(failure)
            record.tokens, record.tokens_counted = tokens, counted
            record.tokens_estimate = estimate

    def answer(self, ready: Ready) -> Answer:
        """The reading of the answer ``ready`` began (a streamed request's winner)."""
        return Answer(
            ready,
            self.account,
            route=self.route,
            stats=self.router.stats,
            report=self.report,
            clock=self.clock,
            continuable=self.body.get("n") in (None, 1),  # several answers cannot be one
            asks_usage=self.asks_usage,
            proceed=self.continue_answer,
            answered=self.answered if self.key is not None else None,
            finish=self.finish,
        )

    def finish(self) -> None:
        """The winner's stream ended: it no longer counts as in flight (idempotent)."""
        name, self._in_flight = self._in_flight, None
        if name is not None:
            self.router.stats.target(name).finished()


class _Coordinator:
    """Carries out one plan in a race: the attempts it starts, hedges, failover and rounds of
    retries, until an attempt has its first token or none is left to make (``state``)."""

    def __init__(
        self, run: _Run, plan: Plan, state: _Race, *, retries: int, prefix: str | None
    ) -> None:
        self.run, self.plan, self.state = run, plan, state
        self.retries, self.prefix = retries, prefix
        self.pending = deque(plan.order)
        self.rounds = 0
        self.hedge_at: float | None = None
        self.launched = self.hedged = 0
        budget = run.route.first_token_timeout if run.stream else None
        budget = min(budget or MAX_WAIT_UNAVAILABLE, MAX_WAIT_UNAVAILABLE)
        # On the event loop's clock, which the waits below run on (the router's may be a test's).
        self.give_up_at = anyio.current_time() + budget - (run.clock() - run.t0)
        first = "continuation" if prefix is not None else "first"
        self.opening = first if plan.start == 1 else "race"
        self.tg: anyio.abc.TaskGroup | None = None

    async def coordinate(self) -> None:
        plan, pending, state = self.plan, self.pending, self.state
        inline = plan.start == 1 and plan.hedge_delay(0) is None and bool(pending)
        if inline:
            # One attempt and no hedge to time: it runs in this task (no task group, no task
            # to schedule); the loop below takes over only if it failed.
            self.launched = 1
            await self._attempt(pending.popleft(), None).make()
            if state.winner is not None or state.final is not None:
                return
        async with anyio.create_task_group() as tg:
            self.tg = tg
            for _ in range(0 if inline else min(plan.start, len(pending))):
                self._launch(None)
            while state.winner is None and state.final is None:
                self._prune()
                if not await self._step():
                    break
            tg.cancel_scope.cancel()

    def _attempt(self, name: str, reason: str | None) -> _Attempt:
        """An attempt on ``name`` (``reason`` ``None``: one the plan starts with)."""
        if reason is None and name == self.plan.explored:
            reason = "probe" if self.plan.probe else "explore"
        if reason is None:
            reason = self.opening
        record = self.run._begin_attempt(name, reason, self.state)
        return _Attempt(self.run, record, self.state, self.prefix)

    def _launch(self, reason: str | None) -> None:
        attempt = self._attempt(self.pending.popleft(), reason)
        delay = self.plan.hedge_delay(self.launched)
        self.hedge_at = anyio.current_time() + delay if delay is not None else None
        self.launched += 1
        if attempt.record.reason in ("probe", "explore") and self.plan.start > 1:
            # One request more, paid from the hedge budget while it has tokens (it never
            # waits for one): the losing hedges that follow are fewer by as many.
            self.run.route.budget.try_spend()
        if attempt.record.reason == "probe":
            self.run_on(attempt)
            return
        assert self.tg is not None
        self.tg.start_soon(attempt.make)

    def run_on(self, attempt: _Attempt) -> None:
        """Run a probe (an attempt on a cold target, started beside the first choice to
        measure it) in a task of its own, outside the race's task group, which the winner's
        first token cancels: a probe that lost runs on to its own first token, which is then
        a TTFT sample (a lost race is only a lower bound, and too low to be recorded:
        ``TargetStats.record_censored``), and its stream is closed. Once the race is decided
        it waits at most until its target's predicted :data:`PROBE_PATIENCE` quantile (a
        censored sample then). It costs no request more than the probe itself: the server's
        work until that first token."""
        name = attempt.record.target
        stats = self.run.router.stats.target(name)
        stats.probing += 1
        scope = anyio.CancelScope()
        patience = self.run.view.predict(name, PROBE_PATIENCE)
        self.state.running_on.append((scope, anyio.current_time() + patience))

        async def probe() -> None:
            try:
                with scope:
                    await attempt.make()
            finally:
                stats.probing -= 1

        spawn(probe, name=f"probe {name}")

    def _available_first(self) -> bool:
        """Move the first available pending target to the front; whether there is one."""
        pending = self.pending
        for i, name in enumerate(pending):
            if self.run.view.available(name):
                if i:
                    del pending[i]
                    pending.appendleft(name)
                return True
        return False

    def _prune(self) -> bool:
        """Leave out the pending targets a context-length error ruled out (a window no
        larger than the one that refused); whether any are left."""
        floor = self.state.refused_at
        if floor is not None:
            for name in [n for n in self.pending if not self.run._window_above(n, floor)]:
                self.pending.remove(name)
        return bool(self.pending)

    async def _step(self) -> bool:
        """One turn of the race: start, retry or hedge an attempt, or wait for news; False
        when no attempt is left to make."""
        state, plan = self.state, self.plan
        if state.again is not None and state.live < plan.start + self.hedged:
            if await self._again():
                return True
        if state.live < plan.start + self.hedged and self.pending:
            # Keep the plan's attempts and the hedges fired in flight: a failed hedge
            # is replaced at once, not after another hedge delay.
            self._available_first()  # else the next fails at once, and says why
            self._launch("failover")
            return True
        if state.live == 0:
            return await self._new_round()
        await self._hedge_or_wait()
        return True

    async def _again(self) -> bool:
        """The target a failure asked to try again (an ordered route's primary after a short
        Retry-After or a 5xx): waited for, then retried; False if its circuit opened since."""
        state = self.state
        assert state.again is not None
        name, due = state.again
        left = due - anyio.current_time()
        if left > 0:
            await state.wait(left)
            return True
        state.again = None
        soon = self.run._soonest_available([name])
        if soon is not None and soon > RETRY_SLACK:  # its circuit opened: move on
            return False
        await anyio.sleep(soon or 0.0)
        if name in self.pending:
            self.pending.remove(name)
        self.pending.appendleft(name)
        self._launch("retry")
        return True

    async def _new_round(self) -> bool:
        """Nothing in flight and nothing pending: wait for a target to be free again, or try
        the plan again after a retryable failure; False when neither may be done."""
        state, plan, asked = self.state, self.plan, self.run.failed_open
        if not any_retryable(e for n, e in state.failures.items() if n not in asked):
            # Nobody could be asked (cooling down, circuits open): wait for the
            # first target to be free again if that fits the first-token deadline.
            soon = self.run._soonest_available(plan.order, trials=False)
            if soon is None or anyio.current_time() + soon > self.give_up_at:
                return False
            await anyio.sleep(soon)
        else:
            if self.rounds >= self.retries:
                return False
            await anyio.sleep(self.run._retry_delay(self.rounds, state.failures))
            self.rounds += 1
        # The same plan again: planning anew would advance round-robin a second
        # time and leave a prefix policy an insert under a key nobody observes.
        self.pending.extend(plan.order)
        if not self._prune():
            return False
        self.hedged = 0  # a new round: its hedges go through the delay and budget
        self._available_first()  # a circuit the last round opened: its target later
        self._launch("retry")
        return True

    async def _hedge_or_wait(self) -> None:
        """Start a hedge if its delay has passed (and the budget allows), else wait for it
        or for news from the attempts in flight."""
        wait = math.inf
        if self.hedge_at is not None and self.pending:
            wait = self.hedge_at - anyio.current_time()  # timers run on the event loop
            if wait <= 0:
                self.hedge_at = None
                if not self._available_first():
                    return  # nothing to hedge on: no request, no budget spent
                report = self.run.report
                if self.run.spend_on_hedge(self.pending[0]):
                    report.hedges += 1
                    self.hedged += 1
                    self._launch("hedge")
                else:
                    report.hedges_denied += 1
                return
        await self.state.wait(wait)


class _Attempt:
    """One attempt on one target until its first token (its whole answer when not
    streamed), counted in the target's stats and health and in the route report."""

    def __init__(self, run: _Run, record: AttemptReport, state: _Race, prefix: str | None):
        self.run, self.record, self.state, self.prefix = run, record, state, prefix
        self.target = run.route.target(record.target)
        self.stats = run.router.stats.target(record.target)
        self.health = run.router.health(record.target)
        self.probe = False
        self.started = 0.0
        self.waiting = 0

    async def make(self) -> None:
        run, stats, health = self.run, self.stats, self.health
        if not health.available() or not health.breaker.acquire():
            if not run.fails_open(self.target.name):
                self._unavailable()
                return
            self.record.failed_open = True
        self.probe = health.breaker.state == "half-open" and not self.record.failed_open
        self.started = run.clock()
        stats.started()
        self.waiting = stats.waiting() if run.stream else 0
        try:
            ready = await self._open()
        except anyio.get_cancelled_exc_class():
            self._cancelled()
            raise
        except RequestBodyError as exc:  # the request's fault, the same on every target
            self._refused(exc)
            return
        except Exception as exc:
            self._failed(exc)
            return
        stats.done_waiting(self.waiting)
        elapsed = run.clock() - self.started
        if self.state.winner is not None:  # another attempt won while this one finished
            await self._lost(ready, elapsed)
        else:
            self._won(ready, elapsed)

    async def _open(self) -> Ready:
        """The attempt's first token (its answer), within its first-token deadline."""
        run, target, prefix = self.run, self.target, self.prefix
        timeout = run.first_token_deadline(target.name, prefix) if run.stream else None
        opening = _sending(
            self.record, self._stream(target, prefix) if run.stream else self._complete(target)
        )
        if not timeout:  # no first-token deadline: no cancel scope to enter
            return await opening
        ready: Ready | None = None
        with anyio.CancelScope(deadline=anyio.current_time() + timeout) as deadline:
            ready = await opening
        if ready is None or deadline.cancelled_caught:
            raise FirstTokenTimeout(run.request_stub(), target=target.name, seconds=timeout)
        return ready

    def _unavailable(self) -> None:
        """Its target may not be asked now (cooling down, its circuit open)."""
        exc = unavailable(self.target.name, self.health, self.run.request_stub())
        self.run._failed(self.record, self.state, exc, "error", count=False)

    def _release(self) -> None:
        """No verdict on the target's health (a trial's slot given back)."""
        if self.probe:
            self.health.breaker.release()

    def _cancelled(self) -> None:
        stats, run = self.stats, self.run
        stats.done_waiting(self.waiting)
        self.record.outcome = "cancelled"
        stats.record_outcome("cancelled")
        if run.stream:
            raced = self.record.reason in ("race", "probe")
            stats.record_censored(run.clock() - self.started, run.prompt_tokens, raced=raced)
        stats.finished()
        self._release()

    def _refused(self, exc: RequestBodyError) -> None:
        """The request cannot be sent to any target: the race ends with ``exc``."""
        self.stats.done_waiting(self.waiting)
        self.stats.finished()
        self._release()
        self.record.outcome, self.record.error = "error", describe_error(exc)
        state = self.state
        state.final = exc
        state.live -= 1
        state.notify()

    def _failed(self, exc: Exception) -> None:
        run, stats, health = self.run, self.stats, self.health
        stats.done_waiting(self.waiting)
        stats.finished()
        counted = outcome(exc)
        if counted == "timeout" and run.stream and self.prefix is None:
            # A deadline missed is a sample too: the TTFT was at least this long.
            stats.record_censored(run.clock() - self.started, run.prompt_tokens)
        if counted == "rate_limited" and isinstance(exc, APIStatusError):
            health.cool_down(cooldown_after(exc.response.headers))
        if classify(exc) == "misconfigured":
            health.misconfigured(describe_error(exc), run.router.misconfigured_cooldown, exc)
        if is_health_failure(exc):
            health.failed(exc, run.kind)
            health.breaker.record_failure()
        else:
            self._release()  # no verdict on its health (a 429, a bad request)
        if isinstance(exc, APIStatusError):
            self.record.request_id = vendor_request_id(self.target, exc.response.headers)
        run._failed(self.record, self.state, exc, counted, count=True)

    async def _lost(self, ready: Ready, elapsed: float) -> None:
        """Another attempt won while this one reached its first token."""
        stats, run = self.stats, self.run
        self.record.outcome = "cancelled"
        stats.record_outcome("cancelled")
        if run.stream and ready.timings.tokens and self.prefix is None:
            stats.record_ttft(elapsed, run.prompt_tokens)  # a first token all the same
            if self.record.reason == "probe":  # what it ran on for
                self.record.ttft = elapsed
        stats.finished()
        self._release()
        decoder = ready.decoder
        self.record.cost = lost_cost(
            self.target,
            decoder.vendor_usage if decoder is not None else ready.completion_usage,
            run.prompt_tokens,
            ready.timings.tokens if decoder is not None else None,
        )
        await close_quietly(ready.response)

    def _won(self, ready: Ready, elapsed: float) -> None:
        run, stats, record, target = self.run, self.stats, self.record, self.target
        record.outcome = "won"
        record.ttft = elapsed
        record.request_id = vendor_request_id(target, ready.response.headers)
        if record.reason == "hedge":
            run.refund_hedge(target.name)  # it saved the request: no extra request lost
        if run.report.winner is None:
            run.report.winner = target.name
        self.health.breaker.record_success()
        stats.record_outcome("ok")
        if not run.stream:
            stats.record_latency(elapsed)
            stats.finished()
        elif ready.timings.tokens and self.prefix is None:
            stats.record_ttft(elapsed, run.prompt_tokens)
        self.state.winner = ready
        self.state.notify()

    async def _stream(self, target: RouteTarget, prefix: str | None) -> Ready:
        run = self.run
        body = run.body_for(target, prefix)
        response, timings = await run.send(
            target, body, stream=True, continuation=prefix is not None
        )
        try:
            request = response.request
            asked = run.body.get("stream_options")
            decoder = adapter_for(target.protocol).stream_decoder(
                run.kind,
                request=request,
                target=target.name,
                body=body,
                include_usage=isinstance(asked, dict) and bool(asked.get("include_usage")),
            )
            reader = StreamReader(decoder, timings, clock=run.clock)
            receive = body_receiver(response)
            buffered: list[ChatCompletionChunk] = []
            head: list[bytes] | None = [] if run.raw else None  # the caller reads the body
            with map_transport_errors(request):
                while not reader.answering:
                    if reader.ended:
                        raise stream_ended(request, before_first_token=target.name)
                    data = await receive()
                    if head is not None and data is not None:
                        head.append(data)
                    buffered.extend(reader.feed(data))
            timings.first_token = run.clock() - timings.started_at
            reader.counting = False  # the answer counts the chunks it passes on (routing.answer)
            if head is not None:
                replay_head(response, head)
            return Ready(target, response, timings, reader, receive, buffered)
        except BaseException:
            await close_quietly(response)
            raise

    async def _complete(self, target: RouteTarget) -> Ready:
        run = self.run
        body = run.body_for(target, None)
        response, timings = await run.send(target, body, stream=False, continuation=False)
        adapter = adapter_for(target.protocol)
        completion = adapter.parse_answer(run.kind, response, target=target.name, body=body)
        ready = Ready(target, response, timings, completion=completion)
        ready.completion_usage = adapter.answer_usage(run.kind, completion, response)
        self.record.usage = ready.completion_usage
        return ready


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


def vendor_request_id(target: RouteTarget, headers: Mapping[str, str]) -> str | None:
    """The vendor's id of a request from its response headers: the first of the catalog's
    ``request_id_headers`` present (DeepSeek's ``x-ds-trace-id``...), else by the target's
    protocol (Anthropic's ``request-id``; ``x-request-id`` for the OpenAI-style APIs)."""
    for name in target.request_id_headers:
        if value := headers.get(name):
            return value
    return adapter_for(target.protocol).request_id(headers)


def unavailable(name: str, health: TargetHealth, request: httpx.Request) -> TargetUnavailable:
    """Why the target ``name`` may not be asked now (cooling down, its circuit open), as the
    attempt's failure."""
    return TargetUnavailable(
        f"target {name!r} is unavailable: {health.describe()}",
        request,
        target=name,
        cause=health.cause
        if health.misconfiguration is not None
        else health.failure  # what opened the circuit (or failed its last trial)
        if _awaits_trial(health)
        else None,
    )


def _awaits_trial(health: TargetHealth) -> bool:
    """Whether the target's circuit is open until a background trial closes it."""
    return health.breaker.in_background and health.breaker.shared_state != "closed"


class RoutedStream:
    """The engine's side of a routed stream: its chunks, report and the current response."""

    def __init__(self, run: _Run, answer: Answer) -> None:
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
