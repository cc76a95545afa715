"""The routing engine: carries out a policy's plan for one request.

Attempts run in one task group. The first to produce a token wins; the others are cancelled by
leaving their scopes, which resets their HTTP/2 streams while the connections stay warm. Before
a first token, a failing attempt hands over to the next target (failover) and a slow one is
hedged when the plan says so and the route's hedge budget allows. After the first token the
caller reads the winner; if it breaks mid-answer, the engine continues the answer on a target
that supports assistant-prefix continuation, so the caller's iterator goes on without a seam,
or raises :class:`~llmroute.StreamInterrupted` with the partial text.

The engine sends through a :data:`Sender` the client gives it (request building, keys and
URLs are the client's), decodes with the protocol module and records every outcome in the live
stats and the targets' health.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
import random
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast

import anyio
import httpx
from openai import BadRequestError
from openai.types.chat import ChatCompletionChunk

from .._background import spawn
from .._catalog import Continuation
from .._errors import (
    AllTargetsFailed,
    APIConnectionError,
    APIError,
    APIStatusError,
    APITimeoutError,
    FirstTokenTimeout,
    RequestBodyError,
    StallTimeout,
    StreamInterrupted,
    TargetUnavailable,
    describe_error,
    map_transport_errors,
)
from .._types import AttemptReport, RouteReport, Timings
from ..protocols import anthropic
from ..protocols.openai import (
    REQUEST_ID_HEADER,
    ChatStreamDecoder,
    ResponsesStreamDecoder,
    build_chunk,
    is_preamble_chunk,
    is_token_chunk,
    parse_chat_completion,
    parse_response,
    response_text_delta,
)
from ..transport import body_receiver, bound_wait, replay_head
from .backoff import parse_retry_after, retry_delay, should_retry_status
from .budget import HedgeBudget
from .causes import REQUEST_CAUSES, CauseRules, classify, react
from .goal import LatencyGoal, meet_goal
from .health import CircuitBreaker, TargetHealth
from .policies import Plan, Policy, explore
from .seam import REASONING_FIELDS, ContinuationMismatch, Seam
from .stats import (
    STALL_STREAM_GAPS,
    LiveStats,
    StatsReport,
    class_label,
    estimate_prompt_tokens,
    first_token_deadline,
    prompt_class,
    stall_deadline,
    stream_stall_deadline,
)
from .tokens import estimate_tokens, visible_tokens
from .windows import answer_room, larger_windows, needed_tokens, refused_sizes, too_long

__all__ = [
    "PROBE_PATIENCE",
    "REMEASURE_AFTER",
    "SENDING",
    "SERVER_METRICS_MAX_AGE",
    "Route",
    "RouteTarget",
    "RoutedCompletion",
    "RoutedStream",
    "Router",
    "Sender",
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
_RETRY_SLACK = 0.05
"""Seconds an ordered route's retry of the same target may wait past its Retry-After for the
target's cooldown to end (the clocks of the cooldown and of the wait may differ slightly)."""
_MAX_WAIT_UNAVAILABLE = 2.0
"""How long a request waits, at most, for one of its targets to be free again when none can be
asked (all cooling down after a 429, or with open circuits); a stream also within its first-token
deadline. A longer wait is the caller's to decide: it gets AllTargetsFailed saying why."""


class Sender(Protocol):
    """Sends one request to one target: the client's part (URL, keys, headers, timeouts).

    Returns once the response headers arrived with a status below 400 (a status error raises
    openai's exception); with ``stream=False`` the body has been read. ``continuation`` says
    the request continues an answer (some vendors take those on another base URL).
    """

    def __call__(
        self, target: RouteTarget, body: dict[str, Any], *, stream: bool, continuation: bool
    ) -> Awaitable[tuple[httpx.Response, Timings]]: ...


SENDING: contextvars.ContextVar[AttemptReport | None] = contextvars.ContextVar(
    "llmroute_sending", default=None
)
"""The attempt a :data:`Sender` is called for (the sender puts its trace span on it)."""


async def _sending(record: AttemptReport, opening: Awaitable[_Ready]) -> _Ready:
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


@dataclass(frozen=True, slots=True)
class RouteTarget:
    """A provider and the model name it serves a route with."""

    provider: str
    model: str
    continuation: Continuation | None = None
    stream_usage: bool = True
    stream_usage_continuous: bool = False
    """Whether the target takes ``stream_options.continuous_usage_stats`` (vLLM, SGLang)."""
    protocol: str = "openai"
    """The wire protocol: ``"openai"`` (chat completions) or ``"anthropic"`` (Messages)."""
    context_window: int | None = None
    """Tokens (prompt plus answer) the model takes at most, if declared (:mod:`.windows`)."""
    trial: Mapping[str, Any] = field(
        default_factory=lambda: {"max_tokens": 1}, compare=False, hash=False
    )
    """Top-level fields of the trial request sent while its circuit is open (the catalog's)."""
    request_id_headers: tuple[str, ...] = ()
    """Response headers carrying the vendor's request id, tried before the protocol's own."""
    max_tokens_field: str | None = None
    """The field the vendor takes for the answer's length limit (the catalog's): a caller's
    ``max_tokens`` / ``max_completion_tokens`` is renamed to it; ``None``: sent as written."""

    @property
    def name(self) -> str:
        return f"{self.provider}:{self.model}"


@dataclass
class Route:
    """One model name the application uses, served by several targets under a policy."""

    name: str
    targets: tuple[RouteTarget, ...]
    policy: Policy
    budget: HedgeBudget = field(default_factory=HedgeBudget)
    first_token_timeout: float | None = 30.0
    continue_on_break: bool = True
    max_continuations: int = 3
    retry_after_max: float = 5.0
    """An ordered (``failover``) route waits out a Retry-After up to this long to retry the
    same target (0: fail over at once)."""
    server_error_retries: int = 1
    """An ordered route retries the same target this many times after a 5xx."""
    stall_timeout: float | Literal["auto"] | None = "auto"
    """Seconds a stream may send nothing after its first token before it counts as broken
    (and is continued on another target): ``"auto"`` derives it from the target's live
    pauses between chunks (:func:`~.stats.stall_deadline`), ``None`` turns it off."""
    connect_timeout: float | None = None
    """Seconds to open a connection to a target (``None``: the call's own timeout)."""
    failover_on: frozenset[str] = frozenset()
    """Request-caused errors (``invalid_request``, ``content_policy``, ``context_length``)
    the route fails over on instead of returning them to the caller."""
    goal: LatencyGoal | None = None
    """The route's latency goal (``ttft_target``, ``min_tokens_per_s``); a request's own
    options override it (:mod:`.goal`)."""

    def rules(self) -> CauseRules:
        """How the route reacts to each cause of failure (:mod:`.causes`)."""
        return CauseRules(
            ordered=self.policy.name == "failover",
            retry_after_max=self.retry_after_max,
            server_error_retries=self.server_error_retries,
            failover_on=self.failover_on,
        )

    @functools.cached_property
    def windows(self) -> dict[str, int | None]:
        """Each target's declared context window, by name; empty when none declares one."""
        windows = {t.name: t.context_window for t in self.targets}
        return windows if any(windows.values()) else {}

    def target(self, name: str) -> RouteTarget:
        for target in self.targets:
            if target.name == name:
                return target
        raise KeyError(name)


@dataclass(slots=True)
class _Ready:
    """An attempt that produced its first token (or its whole answer, when not streamed)."""

    target: RouteTarget
    response: httpx.Response
    timings: Timings
    decoder: ChatStreamDecoder | None = None
    receive: Callable[[], Awaitable[bytes | None]] | None = None
    buffered: list[ChatCompletionChunk] = field(default_factory=list)
    ended: bool = False
    completion: Any = None


class _Race:
    """What the attempts of one race share: the winner and a wake-up for the coordinator."""

    def __init__(self) -> None:
        self.winner: _Ready | None = None
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


async def _close_quietly(response: httpx.Response) -> None:
    """Close a response even inside a cancelled scope (this is what resets its HTTP/2 stream)."""
    # One scope: shielded from outside, bounded by its own deadline.
    with anyio.CancelScope(shield=True, deadline=anyio.current_time() + 5):
        with contextlib.suppress(Exception):
            await response.aclose()


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
            stats.record_outcome(_outcome(exc))
        status = exc.status_code if isinstance(exc, APIStatusError) else None
        cause = classify(exc) if exc is not None else None
        if status == 429 and isinstance(exc, APIStatusError):
            health.cool_down(_cooldown(exc.response.headers))
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
        )
        run = _Run(self, route, body, send, report, tokens, stream, kind)
        run.goal = goal.over(route.goal) if goal is not None else route.goal
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
        outcome = _outcome(exc)
        if outcome == "rate_limited" and isinstance(exc, APIStatusError):
            health.cool_down(_cooldown(exc.response.headers))
        if classify(exc) == "misconfigured":
            health.misconfigured(describe_error(exc), self.misconfigured_cooldown, exc)
        if _is_health_failure(exc):
            health.failed(exc, kind)
            health.breaker.record_failure()
        stats.record_outcome(outcome)

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
        run.ready = await run.race(run.plan(), retries=self.max_retries)
        return RoutedStream(run)

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
        text = _plain_answer(ready.completion)
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
        """Whether an attempt on a cold target runs on to its first token whoever wins (a
        stream's: its TTFT is the sample; :meth:`_Run.runs_on`)."""
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


class _Run:
    """The state of one routed request: its attempts, the winner, and the text so far."""

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
        self.complete = False
        self.prompt_tokens = prompt_tokens
        self.stream = stream
        self.kind = kind
        """``"chat"`` or ``"responses"``: the API of the call, and how its answer is decoded."""
        self.clock = router._clock
        self.t0 = self.clock()
        self.view = _View(router, prompt_tokens, stream, prompt_messages(body, kind))
        self.ready: _Ready | None = None
        self.text: list[str] = []
        self.tokens = 0
        """Token chunks yielded (``timings.tokens``); a chunk may carry several tokens."""
        self.delivered = 0
        """Completion tokens the attempts that broke mid-answer delivered (each counted by
        :meth:`_delivered_by`): what a continuation's ``max_tokens`` and ``usage`` account for."""
        self.limit = _token_limit(body)
        """The caller's ``max_tokens`` / ``max_completion_tokens`` (the smaller): held on the
        whole answer, however many attempts it took."""
        asked = body.get("stream_options")
        self.usage_asked = isinstance(asked, Mapping) and bool(asked.get("include_usage"))
        """Whether the caller asked for usage in the stream (llmroute asks targets for it
        anyway, to count their tokens, and leaves out what the caller did not ask for)."""
        self.continuous_asked = self.usage_asked and bool(
            cast(Mapping[str, Any], asked).get("continuous_usage_stats")
        )
        self.prompt_usage: int | None = None
        """The prompt tokens of the vendors' latest usage (for an answer llmroute ends)."""
        self._since = 0
        """Where the current attempt's text starts in ``text``."""
        self.reasoned = False
        """The answer streamed reasoning (its first attempt: the caller saw it)."""
        self._uncounted = False
        """The current attempt's usage may count text the caller never gets as the answer's:
        reasoning (shown, or dropped from a continuation) or a prefix its vendor echoed and
        llmroute stripped. Its text deltas count it then (a lower bound: never cut short)."""
        self._counted: tuple[int, int] | None = None
        """The current attempt's own usage count of its completion tokens, and the length of
        ``text`` it covers (a vendor that sends usage with its chunks, or at the end)."""
        self.broken: list[str] = []
        self._in_flight: str | None = None
        self.key: object = None
        """The key of the served plan, for a policy that wants to learn its outcome."""
        self.refused: set[str] = set()
        """Targets whose protocol cannot express the request: never tried, never penalised."""
        self.mismatched: set[str] = set()
        """Targets whose continuation did not begin as their vendor documents (:mod:`.seam`):
        not asked to continue this answer again."""
        self.retried: dict[str, int] = {}
        """Retries of the same target in this request (an ordered route's primary)."""
        self.longest_gap = 0.0
        """The longest pause between chunks of the first stream (a sample when it completes)."""
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
            if target.protocol != "anthropic" or self.kind != "chat":
                continue
            try:
                anthropic.translate_request(self.body_for(target, None), target=target.name)
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
        declared one, else the one its error names (:func:`.windows.refused_sizes`), else
        the request's own estimate (which errs low); a need the error names raises it."""
        window = self.route.target(target).context_window
        said, needed = refused_sizes(_error_message(exc))
        if window is None:
            window = said
        if window is None:
            window = needed_tokens(self.prompt_tokens, answer_room(self.body, self.kind))
        if needed is not None:
            window = max(window, needed - 1)  # a window must hold ``needed`` at least
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
        if route.policy.name in ("fastest", "hedge", "race"):
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
        self._probe_open_circuits()
        return plan

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
        elif self._asks_usage(target):
            # The vendor's count of its tokens: at the end of a completed answer (it calibrates
            # the target's estimate, :mod:`.tokens`), or on every chunk where it can.
            options = dict(cast(Mapping[str, Any], body.get("stream_options") or {}))
            options["include_usage"] = True
            if target.stream_usage_continuous:
                options["continuous_usage_stats"] = True
            body["stream_options"] = options
        if target.max_tokens_field is not None and target.protocol == "openai":
            _rename_limit(body, target.max_tokens_field)
        if prefix is not None and target.continuation is not None:
            message = {"role": "assistant", "content": prefix, **target.continuation.message}
            body["messages"] = [*body["messages"], message]
            body.update(target.continuation.body)
            for key in ("max_tokens", "max_completion_tokens"):
                if isinstance(body.get(key), int):
                    body[key] = max(1, body[key] - self.delivered)
        return body

    def _counted_now(self, decoder: ChatStreamDecoder | None) -> tuple[int, int] | None:
        """The current attempt's own usage count and the length of ``text`` it covers: from
        its chunks, or Anthropic's ``message_delta`` once its answer finished; none for an
        attempt whose count may include text it did not deliver (``_uncounted``)."""
        if self._uncounted:
            return None
        counted = self._counted
        if counted is None and decoder is not None and decoder.finished:
            usage = getattr(decoder, "usage", None)  # Anthropic's, from message_delta
            if isinstance(usage, dict):
                count = visible_tokens(usage)
                if count is not None:
                    counted = (count, len(self.text))
        return counted if counted is not None and counted[1] >= self._since else None

    def _asks_usage(self, target: RouteTarget) -> bool:
        """Whether :meth:`body_for` asks ``target`` for usage in the stream."""
        return (
            self.stream
            and not self.raw
            and self.kind == "chat"
            and target.stream_usage
            and target.protocol == "openai"
            and isinstance(self.body.get("stream_options") or {}, Mapping)
        )

    def _delivered_by(
        self, decoder: ChatStreamDecoder | None, target: str
    ) -> tuple[int, str, int | None]:
        """The completion tokens the current attempt delivered, counted so as never to be
        more than the vendor's count, how they were counted, and the calibrated estimate.

        The count: the vendor's usage where it covers the text (``"usage"``, its visible
        tokens: reasoning tokens left out), plus one token per delta with text after it or
        without it (``"deltas"``): a delta with text holds at least one token. Only this lower
        bound sizes a continuation and ends an answer at the caller's limit (a high count
        would cut the answer short). The estimate from the target's completed answers
        (:mod:`.tokens`, ``None`` where the usage covers all) is for the route report only."""
        text = self.text
        counted = self._counted_now(decoder)
        start, tokens, how = self._since, 0, "deltas"
        if counted is not None:
            tokens, start = counted[0], counted[1]
            how = "usage"
        estimate: int | None = None
        if start < len(text):
            rest = text[start:]
            counts = self.router.stats.target(target).token_counts
            more, _ = estimate_tokens("".join(rest), len(rest), counts)
            estimate = tokens + max(more, len(rest))
            tokens += len(rest)
            how = "deltas"
        return tokens, how, estimate

    def _calibrate(self, decoder: ChatStreamDecoder | None, target: str) -> None:
        """A completed answer of plain text: its vendor's count against its text and deltas."""
        counted = self._counted_now(decoder)
        text = self.text
        if counted is not None and counted[1] == len(text) and len(text) > self._since:
            rest = text[self._since :]
            counts = self.router.stats.target(target).token_counts
            counts.record(counted[0], "".join(rest), len(rest))

    def _combined(self) -> int:
        """The tokens of a continued answer so far, counted low: what the broken attempts
        delivered, plus the continuing attempt's usage or one token per delta."""
        counted, since = self._counted, self._since
        if counted is not None and counted[1] >= since:
            own = counted[0] + len(self.text) - counted[1]
        else:
            own = len(self.text) - since
        return self.delivered + own

    def _ending(
        self, template: ChatCompletionChunk | None, chunk_id: str | None, tokens: int
    ) -> list[Any]:
        """The chunks that end an answer llmroute ended at the caller's limit: the
        ``finish_reason="length"`` chunk, and the usage chunk when the caller asked for it."""
        base: dict[str, Any] = {
            "id": chunk_id or "chatcmpl-llmroute",
            "object": "chat.completion.chunk",
            "created": template.created if template is not None else int(time.time()),
            "model": template.model if template is not None else self.body.get("model", ""),
        }
        finish = {"index": 0, "delta": {}, "finish_reason": "length", "logprobs": None}
        out: list[Any] = [build_chunk({**base, "choices": [finish]})]
        if self.usage_asked:
            prompt = self.prompt_usage if self.prompt_usage is not None else self.prompt_tokens
            if self.prompt_usage is None:
                self._estimated("prompt_tokens")
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": tokens,
                "total_tokens": prompt + tokens,
            }
            out.append(build_chunk({**base, "choices": [], "usage": usage}))
        return out

    def _estimated(self, field: str) -> None:
        """``usage.<field>`` of the caller's answer is llmroute's count, not a vendor's."""
        if field not in self.report.usage_estimated:
            self.report.usage_estimated.append(field)

    def _usage_seen(self, chunk: ChatCompletionChunk, usage: Any) -> None:
        """A chunk with the vendor's usage: remember its count of the visible text so far,
        and add what earlier attempts delivered when the answer was continued (the prompt
        tokens then are the first attempt's, where its vendor streamed them)."""
        completion = getattr(usage, "completion_tokens", None)
        visible = visible_tokens(usage)
        if not isinstance(completion, int) or visible is None:
            return
        if not self._uncounted:
            self._counted = (visible, len(self.text))
        prompt = getattr(usage, "prompt_tokens", None)
        if isinstance(prompt, int) and not self.delivered:
            self.prompt_usage = prompt
        self.report.usage = usage
        if not self.delivered:
            return
        total = completion + self.delivered
        update: dict[str, Any] = {"completion_tokens": total}
        if self.prompt_usage is not None:
            prompt = update["prompt_tokens"] = self.prompt_usage
        if isinstance(prompt, int):
            update["total_tokens"] = prompt + total
        chunk.usage = self.report.usage = usage.model_copy(update=update)

    # -- before the first token: attempts, hedges, failover --------------------------------

    async def race(self, plan: Plan, *, retries: int, prefix: str | None = None) -> _Ready:
        """Run ``plan`` until an attempt has a first token; raise AllTargetsFailed if none."""
        route, report, clock = self.route, self.report, self.clock
        state = _Race()
        state.continuing = prefix is not None
        try:
            try:
                await self._coordinate(plan, state, retries=retries, prefix=prefix)
            finally:
                state.decided()
        except BaseException:
            winner = state.winner
            if winner is not None:  # the caller gave up after a first token: release it too
                await _close_quietly(winner.response)
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

    def _observe(self, key: object, winner: _Ready | None) -> None:
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

    async def _coordinate(
        self, plan: Plan, state: _Race, *, retries: int, prefix: str | None
    ) -> None:
        route, report, clock = self.route, self.report, self.clock
        pending = deque(plan.order)
        rounds = 0
        hedge_at: float | None = None
        launched = hedged = 0
        budget = route.first_token_timeout if self.stream else None
        budget = min(budget or _MAX_WAIT_UNAVAILABLE, _MAX_WAIT_UNAVAILABLE)
        # On the event loop's clock, which the waits below run on (the router's may be a test's).
        give_up_at = anyio.current_time() + budget - (clock() - self.t0)
        first = "continuation" if prefix is not None else "first"
        opening = first if plan.start == 1 else "race"
        inline = plan.start == 1 and plan.hedge_delay(0) is None and bool(pending)
        if inline:
            # One attempt and no hedge to time: it runs in this task (no task group, no task
            # to schedule); the loop below takes over only if it failed.
            name = pending.popleft()
            record = self._begin_attempt(
                name, "explore" if name == plan.explored else opening, state
            )
            launched = 1
            await self._attempt(record, state, prefix)
            if state.winner is not None or state.final is not None:
                return
        async with anyio.create_task_group() as tg:

            def available_first() -> bool:
                """Move the first available pending target to the front; whether there is one."""
                for i, name in enumerate(pending):
                    if self.view.available(name):
                        if i:
                            del pending[i]
                            pending.appendleft(name)
                        return True
                return False

            def launch(reason: str) -> None:
                nonlocal launched, hedge_at
                record = self._begin_attempt(pending.popleft(), reason, state)
                delay = plan.hedge_delay(launched)
                hedge_at = anyio.current_time() + delay if delay is not None else None
                launched += 1
                if reason == "probe":
                    self._run_on(record, state)
                else:
                    tg.start_soon(self._attempt, record, state, prefix)

            def prune() -> bool:
                """Leave out the pending targets a context-length error ruled out (a window
                no larger than the one that refused); whether any are left."""
                floor = state.refused_at
                if floor is not None:
                    for name in [n for n in pending if not self._window_above(n, floor)]:
                        pending.remove(name)
                return bool(pending)

            for _ in range(0 if inline else min(plan.start, len(pending))):
                explored = pending[0] == plan.explored
                launch("probe" if explored and plan.probe else "explore" if explored else opening)
            while state.winner is None and state.final is None:
                prune()
                if state.again is not None and state.live < plan.start + hedged:
                    name, due = state.again
                    left = due - anyio.current_time()
                    if left > 0:
                        await state.wait(left)
                        continue
                    state.again = None
                    soon = self._soonest_available([name])
                    if soon is None or soon <= _RETRY_SLACK:  # else its circuit opened: move on
                        await anyio.sleep(soon or 0.0)
                        if name in pending:
                            pending.remove(name)
                        pending.appendleft(name)
                        launch("retry")
                        continue
                if state.live < plan.start + hedged and pending:
                    # Keep the plan's attempts and the hedges fired in flight: a failed hedge
                    # is replaced at once, not after another hedge delay.
                    available_first()  # else the next fails at once, and says why
                    launch("failover")
                    continue
                if state.live == 0:
                    if not _any_retryable(state.failures.values()):
                        # Nobody could be asked (cooling down, circuits open): wait for the
                        # first target to be free again if that fits the first-token deadline.
                        soon = self._soonest_available(plan.order, trials=False)
                        if soon is None or anyio.current_time() + soon > give_up_at:
                            break
                        await anyio.sleep(soon)
                        pending.extend(plan.order)
                        if not prune():
                            break
                        hedged = 0  # a new round: its hedges go through the delay and budget
                        available_first()
                        launch("retry")
                        continue
                    if rounds >= retries:
                        break
                    await anyio.sleep(self._retry_delay(rounds, state.failures))
                    rounds += 1
                    # The same plan again: planning anew would advance round-robin a second
                    # time and leave a prefix policy an insert under a key nobody observes.
                    pending.extend(plan.order)
                    if not prune():
                        break
                    hedged = 0
                    available_first()  # a circuit the last round opened: its target later
                    launch("retry")
                    continue
                wait = math.inf
                if hedge_at is not None and pending:
                    wait = hedge_at - anyio.current_time()  # timers run on the event loop
                    if wait <= 0:
                        hedge_at = None
                        if not available_first():
                            continue  # nothing to hedge on: no request, no budget spent
                        if route.budget.try_spend():
                            report.hedges += 1
                            hedged += 1
                            launch("hedge")
                        else:
                            report.hedges_denied += 1
                        continue
                await state.wait(wait)
            tg.cancel_scope.cancel()

    def _run_on(self, record: AttemptReport, state: _Race) -> None:
        """Run a probe (an attempt on a cold target, started beside the first choice to
        measure it) in a task of its own, outside the race's task group, which the winner's
        first token cancels: a probe that lost runs on to its own first token, and
        :meth:`_attempt` records that TTFT (a lost race is only a lower bound, and too low to
        be recorded: ``TargetStats.record_censored``) and closes its stream. Once the race is
        decided it waits at most until its target's predicted :data:`PROBE_PATIENCE` quantile
        (a censored sample then). It costs no request more than the probe itself: the
        server's work until that first token."""
        stats = self.router.stats.target(record.target)
        stats.probing += 1
        scope = anyio.CancelScope()
        patience = self.view.predict(record.target, PROBE_PATIENCE)
        state.running_on.append((scope, anyio.current_time() + patience))

        async def attempt() -> None:
            try:
                with scope:
                    await self._attempt(record, state, None)
            finally:
                stats.probing -= 1

        spawn(attempt, name=f"probe {record.target}")

    def _begin_attempt(self, name: str, reason: str, state: _Race) -> AttemptReport:
        """An attempt on ``name`` starting now: in the route report, and in flight in ``state``
        (the caller runs it, in its own task or in the race's task group)."""
        record = AttemptReport(target=name, started=self.clock() - self.t0, reason=reason)
        self.report.attempts.append(record)
        state.live += 1
        return record

    def _soonest_available(self, targets: Sequence[str], *, trials: bool = True) -> float | None:
        """Seconds until the first of ``targets`` that is cooling down or has its circuit open
        may be tried again; ``None`` if none of them will be (or all are unknown).
        ``trials=False`` leaves out the circuits that wait for a background trial: only the
        trial's answer opens them to requests, and no request waits on a trial."""
        now = self.clock()
        times = [
            retry_at
            for name in targets
            if name not in self.refused
            and (trials or not _awaits_trial(self.router.health(name)))
            and (retry_at := self.router.health(name).retry_at()) is not None
        ]
        return max(0.0, min(times) - now) if times else None

    def _retry_delay(self, rounds: int, failures: Mapping[str, BaseException]) -> float:
        headers = None
        for exc in failures.values():
            if isinstance(exc, APIStatusError):
                headers = exc.response.headers
        return retry_delay(
            retries_done=rounds,
            max_retries=self.router.max_retries,
            headers=headers,
            now=time.time(),
            rand=self.router._rng.random(),
        )

    async def _attempt(self, record: AttemptReport, state: _Race, prefix: str | None) -> None:
        router, clock = self.router, self.clock
        target = self.route.target(record.target)
        stats = router.stats.target(target.name)
        health = router.health(target.name)
        if not health.available() or not health.breaker.acquire():
            exc = TargetUnavailable(
                f"target {target.name!r} is unavailable: {health.describe()}",
                self.request_stub(),
                target=target.name,
                cause=health.cause
                if health.misconfiguration is not None
                else health.failure  # what opened the circuit (or failed its last trial)
                if _awaits_trial(health)
                else None,
            )
            self._failed(record, state, exc, "error", count=False)
            return
        probe = health.breaker.state == "half-open"
        started = clock()
        stats.started()
        waiting = stats.waiting() if self.stream else 0
        ready: _Ready | None = None
        timeout = self.first_token_deadline(target.name, prefix) if self.stream else None
        try:
            missed = False
            opening = _sending(
                record,
                self._open_stream(target, prefix) if self.stream else self._open_complete(target),
            )
            if not timeout:  # no first-token deadline: no cancel scope to enter
                ready = await opening
            else:
                with anyio.CancelScope(deadline=anyio.current_time() + timeout) as deadline:
                    ready = await opening
                missed = deadline.cancelled_caught
            if ready is None or missed:
                raise FirstTokenTimeout(
                    self.request_stub(), target=target.name, seconds=timeout or 0.0
                )
        except anyio.get_cancelled_exc_class():
            stats.done_waiting(waiting)
            record.outcome = "cancelled"
            stats.record_outcome("cancelled")
            if self.stream:
                raced = record.reason in ("race", "probe")
                stats.record_censored(clock() - started, self.prompt_tokens, raced=raced)
            stats.finished()
            if probe:
                health.breaker.release()
            raise
        except RequestBodyError as exc:  # the request's fault, the same on every target
            stats.done_waiting(waiting)
            stats.finished()
            if probe:
                health.breaker.release()
            record.outcome, record.error = "error", describe_error(exc)
            state.final = exc
            state.live -= 1
            state.notify()
            return
        except Exception as exc:
            stats.done_waiting(waiting)
            stats.finished()
            outcome = _outcome(exc)
            if outcome == "timeout" and self.stream and prefix is None:
                # A deadline missed is a sample too: the TTFT was at least this long.
                stats.record_censored(clock() - started, self.prompt_tokens)
            if outcome == "rate_limited" and isinstance(exc, APIStatusError):
                health.cool_down(_cooldown(exc.response.headers))
            if classify(exc) == "misconfigured":
                health.misconfigured(describe_error(exc), router.misconfigured_cooldown, exc)
            if _is_health_failure(exc):
                health.failed(exc, self.kind)
                health.breaker.record_failure()
            elif probe:
                health.breaker.release()  # no verdict on its health (a 429, a bad request)
            if isinstance(exc, APIStatusError):
                record.request_id = vendor_request_id(target, exc.response.headers)
            self._failed(record, state, exc, outcome, count=True)
            return
        stats.done_waiting(waiting)
        elapsed = clock() - started
        if state.winner is not None:  # another attempt won while this one finished
            record.outcome = "cancelled"
            stats.record_outcome("cancelled")
            if self.stream and ready.timings.tokens and prefix is None:
                stats.record_ttft(elapsed, self.prompt_tokens)  # a first token all the same
            stats.finished()
            if probe:
                health.breaker.release()
            await _close_quietly(ready.response)
            return
        record.outcome = "won"
        record.ttft = elapsed
        record.request_id = vendor_request_id(target, ready.response.headers)
        if record.reason == "hedge":
            self.route.budget.refund()  # it saved the request: no extra request lost
        if self.report.winner is None:
            self.report.winner = target.name
        health.breaker.record_success()
        stats.record_outcome("ok")
        if not self.stream:
            stats.record_latency(elapsed)
            stats.finished()
        elif ready.timings.tokens and prefix is None:
            stats.record_ttft(elapsed, self.prompt_tokens)
        state.winner = ready
        state.notify()

    def _failed(
        self, record: AttemptReport, state: _Race, exc: Exception, outcome: str, *, count: bool
    ) -> None:
        record.outcome = outcome
        record.error = describe_error(exc)
        if count:
            self.router.stats.target(record.target).record_outcome(outcome)
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

    async def _open_stream(self, target: RouteTarget, prefix: str | None) -> _Ready:
        body = self.body_for(target, prefix)
        response, timings = await self.send(
            target, body, stream=True, continuation=prefix is not None
        )
        clock = self.clock
        try:
            request = response.request
            if self.kind == "responses":
                decoder: ChatStreamDecoder = ResponsesStreamDecoder(
                    request=request, target=target.name
                )
            elif target.protocol == "anthropic":
                asked = self.body.get("stream_options")
                decoder = anthropic.AnthropicStreamDecoder(
                    request=request,
                    target=target.name,
                    include_usage=isinstance(asked, dict) and bool(asked.get("include_usage")),
                    prefill_whitespace=anthropic.prefill_whitespace(body),
                )
            else:
                decoder = ChatStreamDecoder(request=request, target=target.name)
            receive = body_receiver(response)
            buffered: list[ChatCompletionChunk] = []
            head: list[bytes] | None = [] if self.raw else None  # the caller reads the body
            started = timings.started_at
            with map_transport_errors(request):
                while True:
                    data = await receive()
                    if data is None:
                        chunks = decoder.close()
                    else:
                        if timings.first_byte is None:
                            timings.first_byte = clock() - started
                        if head is not None:
                            head.append(data)
                        chunks = decoder.feed(data)
                    buffered.extend(chunks)
                    if decoder.tokens or decoder.done or decoder.finished:
                        timings.first_token = clock() - started
                        timings.tokens = decoder.tokens
                        if head is not None:
                            replay_head(response, head)
                        return _Ready(
                            target, response, timings, decoder, receive, buffered, data is None
                        )
                    if data is None:
                        raise APIConnectionError(
                            message=f"The stream of target {target.name!r} ended before its "
                            "first token (no [DONE] and no finish_reason)",
                            request=request,  # type: ignore[arg-type]
                        )
        except BaseException:
            await _close_quietly(response)
            raise

    async def _open_complete(self, target: RouteTarget) -> _Ready:
        body = self.body_for(target, None)
        response, timings = await self.send(target, body, stream=False, continuation=False)
        if self.kind == "responses":
            completion: Any = parse_response(
                response.content, request=response.request, target=target.name, response=response
            )
        elif target.protocol == "anthropic":
            completion = anthropic.parse_message(
                response.content,
                request=response.request,
                target=target.name,
                response=response,
                prefill_whitespace=anthropic.prefill_whitespace(body),
            )
        else:
            completion = parse_chat_completion(
                response.content, request=response.request, target=target.name, response=response
            )
        return _Ready(target, response, timings, completion=completion)

    # -- after the first token: the caller reads; a break is continued elsewhere ------------

    async def chunks(self, on_switch: Callable[[httpx.Response], None]) -> AsyncIterator[Any]:
        """The answer's chunks, continued on another target if the winner breaks mid-way."""
        ready = self.ready
        assert ready is not None
        timings = ready.timings
        first_id: str | None = None
        template: ChatCompletionChunk | None = None
        skipping = False
        seam: Seam | None = None  # a continuing stream's reasoning and echo, stripped
        continuable = True
        text = self.text
        clock = self.clock
        if self.body.get("n") not in (None, 1):
            continuable = False  # several answers at once cannot be continued as one
        try:
            while True:
                decoder = ready.decoder
                receive = ready.receive
                assert decoder is not None and receive is not None
                request = ready.response.request
                failure: APIError | None = None
                buffered, ready.buffered = ready.buffered, []
                stall = self.stall_deadline(ready.target.name)
                in_transport, read_timeout = (
                    bound_wait(ready.response, stall) if stall is not None else (False, None)
                )
                if read_timeout is not None and stall is not None and read_timeout < stall:
                    stall = None  # the read timeout comes first: it is the deadline
                own = stall is not None and self.stall_from_stream(ready.target.name)
                # Usage llmroute asked for, not the caller: it is counted, and not shown.
                hide_usage = not self.usage_asked and self._asks_usage(ready.target)
                gaps, longest = 0, 0.0
                kept = self.delivered  # the tokens of the answer so far, counted low
                try:
                    with map_transport_errors(request):
                        while True:
                            for chunk in buffered:
                                if seam is not None and type(chunk) is ChatCompletionChunk:
                                    admitted = seam.admit(chunk)
                                    self._uncounted = self._uncounted or seam.stripped
                                    if not admitted:
                                        continue
                                if skipping:
                                    if is_preamble_chunk(chunk):
                                        continue
                                    skipping = False
                                if type(chunk) is ChatCompletionChunk:
                                    if first_id is None:
                                        first_id = chunk.id
                                    elif chunk.id != first_id:
                                        chunk.id = first_id
                                    template, before = chunk, len(text)
                                    for choice in chunk.choices:
                                        delta = choice.delta
                                        kind = _content_kind(delta) if choice.index == 0 else None
                                        if kind is None:
                                            continuable = False
                                            continue
                                        if kind == "reasoning":
                                            # Shown, not text; the answer's text can still be
                                            # continued once it has begun.
                                            self.reasoned = self._uncounted = True
                                        if delta.content:
                                            text.append(delta.content)
                                    if is_token_chunk(chunk):
                                        self.tokens += 1
                                        timings.tokens = self.tokens
                                    usage = chunk.usage
                                    if usage is not None:
                                        self._usage_seen(chunk, usage)
                                        if hide_usage:
                                            if not chunk.choices:
                                                continue
                                            chunk.usage = None
                                        elif (
                                            chunk.choices
                                            and ready.target.stream_usage_continuous
                                            and not self.continuous_asked
                                        ):
                                            chunk.usage = None
                                    if hide_usage:  # not even the vendor's "usage": null
                                        chunk.model_fields_set.discard("usage")
                                    if self.delivered and self.limit is not None:
                                        count = self._combined()
                                        if count > self.limit:
                                            # Past the caller's limit: the answer ends here.
                                            del text[before:]
                                            if (self._counted or (0, 0))[1] > len(text):
                                                self._counted = None  # it counted the chunk
                                            for end in self._ending(template, first_id, kept):
                                                yield end
                                            self._completed(ready)
                                            return
                                        kept = count
                                else:
                                    continuable = False  # another API's events (Responses)
                                    kind = getattr(chunk, "type", None)
                                    if type(kind) is str and kind.endswith(".delta"):
                                        self.tokens += 1
                                        timings.tokens = self.tokens
                                        piece = response_text_delta(chunk)
                                        if piece:
                                            text.append(piece)
                                yield chunk
                            if decoder.done or ready.ended:
                                break
                            waited = clock()
                            if stall is None or in_transport:
                                data = await receive()
                            else:
                                data = b""
                                with anyio.CancelScope(
                                    deadline=anyio.current_time() + stall
                                ) as scope:
                                    data = await receive()
                                if scope.cancelled_caught:
                                    raise StallTimeout(
                                        request, target=ready.target.name, seconds=stall
                                    )
                            waited = clock() - waited
                            if waited > self.longest_gap and ready is self.ready:
                                self.longest_gap = waited
                            if own and stall is not None:
                                gaps, longest = gaps + 1, max(longest, waited)
                                if gaps >= STALL_STREAM_GAPS:  # this stream's own pauses
                                    own = False
                                    first = ready.timings.first_token
                                    stall = stream_stall_deadline(longest, first, prior=stall)
                                    if in_transport:
                                        bound_wait(ready.response, stall)
                            if data is None:
                                ready.ended = True
                                buffered = decoder.close()
                            else:
                                buffered = decoder.feed(data)
                except APITimeoutError as exc:
                    failure = exc
                    if in_transport and stall is not None:  # the wait's bound was the stall's
                        failure = StallTimeout(request, target=ready.target.name, seconds=stall)
                except APIError as exc:
                    failure = exc
                if seam is not None and failure is None and (decoder.finished or decoder.done):
                    failure = seam.unfinished()  # it ended inside the echo: not spliced
                if not isinstance(failure, ContinuationMismatch) and (
                    decoder.finished or (decoder.done and failure is None)
                ):
                    # Every choice has its finish_reason: the answer is whole, even if the
                    # connection broke before the usage chunk or [DONE]. (A decoder that
                    # raised is done too, but its answer is not whole.)
                    self._completed(ready)
                    if continuable:
                        self._calibrate(decoder, ready.target.name)
                    if continuable and self.key is not None:  # one choice of plain text
                        self.answered(ready.target.name, "".join(text))
                    return
                if failure is None:
                    failure = APIConnectionError(
                        message="The stream ended before the answer was complete (no [DONE] "
                        "and no finish_reason)",
                        request=request,  # type: ignore[arg-type]
                    )
                new = await self._continue(ready, failure, continuable)
                if new is None:  # the answer already holds the tokens the caller asked for
                    for end in self._ending(template, first_id, self.delivered):
                        yield end
                    self.complete = True
                    timings.total = clock() - timings.started_at
                    return
                continuation = new.target.continuation
                echo = "".join(text) if continuation and continuation.echoes_prefix else ""
                seam = Seam(echo, request=new.response.request, target=new.target.name)
                ready = new
                on_switch(ready.response)
                skipping = True
        finally:
            if timings.total is None:
                timings.total = clock() - timings.started_at
            await _close_quietly(ready.response)
            self.finish()

    def _completed(self, ready: _Ready) -> None:
        self.complete = True
        record = self._won(ready.target.name)
        if record is not None:
            record.tokens, record.tokens_counted, record.tokens_estimate = self._delivered_by(
                ready.decoder, ready.target.name
            )
        timings = self.ready.timings if self.ready is not None else ready.timings
        timings.total = self.clock() - timings.started_at
        if ready is self.ready and self.tokens > 1:
            stats = self.router.stats.target(ready.target.name)
            span = timings.total - (timings.first_token or 0.0)
            itl = span / (self.tokens - 1) if span > 0 else None
            stats.record_stream(itl, (self.tokens - 1) / span if span > 0 else None)
            stats.record_gap(self.longest_gap)

    def first_token_deadline(self, target: str, prefix: str | None) -> float | None:
        """Seconds an attempt on ``target`` may wait for its first token: from the target's
        live p99 TTFT for the prompt's length class (:func:`~.stats.first_token_deadline`),
        the route's ``first_token_timeout`` as the cap (``None``: no deadline); the cap alone
        for a continuation, whose prompt is longer by the answer so far."""
        cap = self.route.first_token_timeout
        if cap is None or prefix is not None:
            return cap
        p99 = self.router.stats.target(target).class_quantile(0.99, self.prompt_tokens)
        return first_token_deadline(p99, cap=cap)

    def stall_deadline(self, target: str) -> float | None:
        """Seconds the stream from ``target`` may send nothing before it counts as broken."""
        setting = self.route.stall_timeout
        if setting != "auto":
            return setting
        cap = self.route.first_token_timeout or 30.0
        return stall_deadline(self.router.stats.target(target).gap_quantile(0.99), cap=cap)

    def stall_from_stream(self, target: str) -> bool:
        """Whether a stream from ``target`` sets its own deadline between chunks once it has
        shown a few pauses (:func:`~.stats.stream_stall_deadline`): with ``"auto"`` while the
        target has too few streams measured for its live statistic."""
        return (
            self.route.stall_timeout == "auto"
            and self.router.stats.target(target).gap_quantile(0.99) is None
        )

    async def _continue(self, ready: _Ready, failure: APIError, continuable: bool) -> _Ready | None:
        """Continue a broken answer on another target, or raise StreamInterrupted; ``None``
        when the answer already holds the caller's ``max_tokens`` (counted low): it ends there
        with ``finish_reason="length"``."""
        router, route = self.router, self.route
        name = ready.target.name
        await _close_quietly(ready.response)
        self.finish()
        stats = router.stats.target(name)
        stats.record_outcome("interrupted")
        health = router.health(name)
        health.failed(failure, self.kind)  # the cause a request refused while open names
        health.breaker.record_failure()
        self.broken.append(name)
        if isinstance(failure, ContinuationMismatch):
            self.mismatched.add(name)
        tokens, counted, estimate = self._delivered_by(ready.decoder, name)
        self.delivered += tokens
        if counted != "usage":  # the caller's completion_tokens are at least what it says
            self._estimated("completion_tokens")
        record = self._won(name)
        if record is not None:
            record.outcome = "interrupted"
            record.error = describe_error(failure)
            record.tokens, record.tokens_counted = tokens, counted
            record.tokens_estimate = estimate
        partial = "".join(self.text)
        cause = failure.__cause__ or failure
        request = ready.response.request
        broke = f"The stream from {name!r} broke after {self.tokens} tokens ({failure.message})"
        if len(self.report.continued_on) >= route.max_continuations:
            continuable = False
        reasoning = continuable and self.reasoned and not partial
        if not (route.continue_on_break and continuable) or reasoning:
            why = (
                "continuation is off"
                if not route.continue_on_break
                else "it broke while the model was reasoning, before its text began"
                if reasoning
                else "the answer is not plain text or was continued too often"
            )
            raise StreamInterrupted(
                f"{broke}; it cannot be continued ({why}). The text so far is in .partial_text.",
                request,
                partial_text=partial,
                cause=cause,
            ) from failure
        if self.limit is not None and self.delivered >= self.limit:
            return None  # the count errs low: the answer holds at least the tokens asked
        candidates = [
            t.name
            for t in route.targets
            if t.continuation is not None
            and t.name not in self.refused
            and t.name not in self.mismatched
        ]
        order = sorted(
            candidates,
            key=lambda t: (t in self.broken, not self.view.available(t), self.view.predict(t, 0.5)),
        )
        if not order:
            why = (
                f"the continuation on {', '.join(sorted(self.mismatched))} did not begin with "
                "the text so far"
                if self.mismatched
                else f"no target of route {route.name!r} supports continuation"
            )
            raise StreamInterrupted(
                f"{broke}; {why}. The text so far is in .partial_text.",
                request,
                partial_text=partial,
                cause=cause,
            ) from failure
        try:
            new = await self.race(Plan(tuple(order)), retries=0, prefix=partial)
        except APIError as exc:  # every target failed, or one refused the continuation
            raise StreamInterrupted(
                f"{broke}; no target could continue it ({exc.message}). The text so far is in "
                ".partial_text.",
                request,
                partial_text=partial,
                cause=cause,
            ) from failure
        self.report.continued_on.append(new.target.name)
        self._since, self._counted, self._uncounted = len(self.text), None, False
        return new

    def _won(self, target: str) -> AttemptReport | None:
        """The report of ``target``'s attempt that is serving the answer now."""
        for record in reversed(self.report.attempts):
            if record.target == target and record.outcome == "won":
                return record
        return None

    def finish(self) -> None:
        """The winner's stream ended: it no longer counts as in flight (idempotent)."""
        name, self._in_flight = self._in_flight, None
        if name is not None:
            self.router.stats.target(name).finished()


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


def _token_limit(body: Mapping[str, Any]) -> int | None:
    """The caller's limit on the answer's tokens: the smaller of ``max_tokens`` and
    ``max_completion_tokens`` (``None``: no limit asked)."""
    limits = [
        value
        for key in ("max_tokens", "max_completion_tokens")
        if isinstance(value := body.get(key), int) and not isinstance(value, bool)
    ]
    return min(limits) if limits else None


def _error_message(exc: BaseException) -> str:
    """The text of an upstream error: its message and, where the body is JSON, the
    vendor's own ``message`` (openai's exceptions keep both)."""
    parts = [str(getattr(exc, "message", "") or exc)]
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        inner = cast(Mapping[str, Any], body).get("error", body)
        text = inner.get("message") if isinstance(inner, Mapping) else None
        if isinstance(text, str):
            parts.append(text)
    return " ".join(parts)


def _plain_answer(completion: Any) -> str | None:
    """The text of a completion whose only choice is a plain text message, else ``None``."""
    choices = getattr(completion, "choices", None)
    if not choices or len(choices) != 1:
        return None
    message = choices[0].message
    content = message.content
    if not isinstance(content, str) or _content_kind(message) != "text":
        return None
    return content


def _rename_limit(body: dict[str, Any], name: str) -> None:
    """Send the caller's answer limit under ``name``, the one field the vendor takes: the
    smaller of ``max_tokens`` and ``max_completion_tokens`` when both are given."""
    limits = [
        body.pop(key)
        for key in ("max_tokens", "max_completion_tokens")
        if key in body and body[key] is not None
    ]
    if limits:
        body[name] = min(limits) if all(isinstance(v, int) for v in limits) else limits[0]


def _content_kind(delta: Any) -> Literal["text", "reasoning"] | None:
    """What a delta (or message) carries: plain ``"text"``, ``"reasoning"`` beside or instead
    of it (:data:`.seam.REASONING_FIELDS`), or ``None`` for tool calls or a refusal (an answer
    that cannot be continued as text)."""
    if delta.tool_calls or delta.function_call or delta.refusal:
        return None
    extra = delta.__pydantic_extra__
    if extra and any(extra.get(key) for key in REASONING_FIELDS):
        return "reasoning"
    return "text"


def vendor_request_id(target: RouteTarget, headers: Mapping[str, str]) -> str | None:
    """The vendor's id of a request from its response headers: the first of the catalog's
    ``request_id_headers`` present (DeepSeek's ``x-ds-trace-id``...), else by the target's
    protocol (Anthropic's ``request-id``; ``x-request-id`` for the OpenAI-style APIs)."""
    for name in target.request_id_headers:
        if value := headers.get(name):
            return value
    if target.protocol == "anthropic":
        return headers.get(anthropic.REQUEST_ID_HEADER) or headers.get(REQUEST_ID_HEADER)
    return headers.get(REQUEST_ID_HEADER)


def _outcome(exc: BaseException) -> str:
    if isinstance(exc, APIStatusError) and exc.status_code == 429:
        return "rate_limited"
    if isinstance(exc, APITimeoutError):  # FirstTokenTimeout is one too
        return "timeout"
    return "error"


def _awaits_trial(health: TargetHealth) -> bool:
    """Whether the target's circuit is open until a background trial closes it."""
    return health.breaker.in_background and health.breaker.shared_state != "closed"


def _is_health_failure(exc: BaseException) -> bool:
    """Whether a failure says the target is unwell (not that the request was bad, nor that
    it does not hold the response a Responses call continues)."""
    if isinstance(exc, APIStatusError):
        return exc.status_code not in (400, 413, 422, 429) and classify(exc) != "not_held"
    return True


def prompt_messages(body: Mapping[str, Any], kind: str) -> list[Any]:
    """The messages of a call's prompt, for its size: a chat call's ``messages``; a Responses
    call's ``instructions`` and ``input`` (a string, or a list of items)."""
    if kind != "responses":
        messages = body.get("messages")
        return messages if isinstance(messages, list) else []
    out: list[Any] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        out.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        out.append({"role": "user", "content": given})
    elif isinstance(given, list):
        out.extend(item for item in given if isinstance(item, Mapping))
    return out


def _cooldown(headers: Mapping[str, str]) -> float:
    seconds = parse_retry_after(headers, now=time.time())
    return seconds if seconds is not None and seconds > 0 else 1.0


def _any_retryable(failures: Iterable[BaseException]) -> bool:
    for exc in failures:
        if isinstance(exc, APIStatusError):
            if should_retry_status(exc.status_code, exc.response.headers, now=time.time()):
                return True
        elif isinstance(exc, APIError) and not isinstance(exc, TargetUnavailable):
            return True
    return False


class RoutedStream:
    """The engine's side of a routed stream: its chunks, report and the current response."""

    def __init__(self, run: _Run) -> None:
        assert run.ready is not None
        self.run = run
        self.report = run.report
        self.response = run.ready.response
        self.timings = run.ready.timings
        weakref.finalize(self, run.finish)

    @property
    def text(self) -> str:
        return "".join(self.run.text)
