"""Failures of one request's attempts (:class:`RunFailures`): what the race does after each
(fail over, retry the same target, or end with the error), how long a round of retries waits,
where a context-length error leaves the request, when a target whose circuit is open is asked
all the same, and how long an attempt may wait for its first token before it has failed."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import httpx

from .._errors import TargetUnavailable, describe_error
from .._types import AttemptReport, RouteReport
from .causes import REQUEST_CAUSES, error_message, react, round_delay
from .health import TargetHealth, fails_open
from .race import Race
from .route import Route
from .stats import first_token_deadline
from .view import RouterState
from .windows import answer_room, larger_windows, needed_tokens, refused_window

__all__ = ["RunFailures", "awaits_trial", "unavailable"]


class RunFailures:
    """The failures of one request's attempts, and what follows each."""

    def __init__(
        self,
        router: RouterState,
        route: Route,
        report: RouteReport,
        refused: set[str],
        prompt_tokens: int,
        body: dict[str, Any],
        kind: str,
    ) -> None:
        self.router = router
        self.route = route
        self.report = report
        self.refused = refused
        """The request's targets that cannot express it (the run's own set)."""
        self.prompt_tokens = prompt_tokens
        self.body = body
        self.kind = kind
        self.retried: dict[str, int] = {}
        """Retries of the same target in this request (an ordered route's primary)."""
        self.failed_open: set[str] = set()
        """Targets asked although their circuit was open (:meth:`fails_open`), once each."""

    def others(self, target: str) -> list[str]:
        """The targets of the route but ``target`` that may serve this request."""
        left_out = self.refused.union(self.report.left_out, (target,))
        return [t.name for t in self.route.targets if t.name not in left_out]

    def fails_open(self, target: str) -> bool:
        """Whether an attempt on ``target``, whose circuit is open, goes all the same (once
        in a request): no target of the request may be asked (:func:`.health.fails_open`)."""
        others = [self.router.health(name) for name in self.others(target)]
        if target in self.failed_open or not fails_open(self.router.health(target), others):
            return False
        self.failed_open.add(target)
        return True

    def soonest_available(self, targets: Sequence[str], *, trials: bool = True) -> float | None:
        """:meth:`~.engine.Router.soonest_available` of ``targets`` that may serve this request."""
        names = [name for name in targets if name not in self.refused]
        return self.router.soonest_available(names, trials=trials)

    def retry_delay(self, rounds: int, failures: Mapping[str, BaseException]) -> float:
        router = self.router
        return round_delay(
            failures.values(),
            rounds=rounds,
            max_retries=router.max_retries,
            rand=router._rng.random(),
        )

    def failed(
        self, record: AttemptReport, state: Race, exc: Exception, counted: str, *, count: bool
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
                if reaction.cause != "context_length" or not self.larger_window_follows(
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
        if cap is None or prefix is not None or not self.others(target):
            return cap
        p99 = self.router.stats.target(target).class_quantile(0.99, self.prompt_tokens)
        return first_token_deadline(p99, cap=cap)

    def larger_window_follows(self, target: str, state: Race, exc: Exception) -> bool:
        """After ``target`` answered a context-length error: whether a target of the route
        with a larger declared window may still take the request (then only such targets
        are tried next, see ``Race.refused_at``). The refusing target's window is its
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

    def window_above(self, target: str, tokens: int) -> bool:
        window = self.route.windows.get(target)
        return window is not None and window > tokens


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
        if awaits_trial(health)
        else None,
    )


def awaits_trial(health: TargetHealth) -> bool:
    """Whether the target's circuit is open until a background trial closes it."""
    return health.breaker.in_background and health.breaker.shared_state != "closed"
