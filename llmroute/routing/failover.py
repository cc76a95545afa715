"""Failover for the calls the engine does not race: legacy completions and embeddings on a route.

The route's targets that serve the call are asked one at a time, in the order the route's
policy plans, and each failure is met by the engine's rules (:func:`.causes.react`): the same
target again (an ordered route's short Retry-After, its retries after a 5xx), the next target,
or the error back to the caller (a request-caused 400, unless the route fails over on that
cause; a context-length error goes on to the targets with a larger declared window only). A
target that may not be asked now (its circuit open, cooling down after a 429) is passed over;
when none could be asked, the call waits for the first to be free, up to
:data:`~.coordinator.MAX_WAIT_UNAVAILABLE`. When every target failed with a cause that may pass,
the order is tried again within the client's ``max_retries``, after openai's backoff. Each
attempt counts in its target's stats and health as an engine attempt does
(:meth:`~.engine.Router.record_call`). Nothing is hedged or raced: such a call has no first
token to race for, and openai's machinery parses the winner's response.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from .._errors import (
    AllTargetsFailed,
    APIConnectionError,
    APIStatusError,
    describe_error,
)
from .._types import AttemptReport, RouteReport, Timings
from ..protocols import adapter_for
from . import coordinator
from .causes import (
    any_retryable,
    error_message,
    is_health_failure,
    outcome,
    react,
    round_delay,
)
from .costs import pricer_for
from .engine import RETRY_SLACK, Router, prompt_messages, unavailable, vendor_request_id
from .estimate import prompt_tokens
from .health import fails_open
from .route import Route, Sender
from .stats import estimate_prompt_tokens
from .windows import answer_room, needed_tokens, refused_window

__all__ = ["FailedOver", "fail_over"]

_MAX_ROUNDS_UNAVAILABLE = 8
"""Rounds a call waits for a target to be free again, at most (each waits until the first
may be asked, all within ``MAX_WAIT_UNAVAILABLE``): a bound on the loop, not a tuning."""


@dataclass(slots=True)
class FailedOver:
    """The answer of a call that failed over: the winner's response (its body read unless
    the call streams), its timings, the route report and the retries taken."""

    response: httpx.Response
    timings: Timings
    report: RouteReport
    retries: int


async def fail_over(
    router: Router,
    route: Route,
    body: dict[str, Any],
    send: Sender,
    *,
    kind: str,
    stream: bool,
    unservable: Iterable[str] = (),
    prompt_tokens: int | None = None,
) -> FailedOver:
    """Ask ``route``'s targets (but the ``unservable`` ones) for the ``kind`` call ``body``,
    in its policy's order, until one answers; raise the error a request-caused failure
    returns to the caller, or :class:`AllTargetsFailed`. ``prompt_tokens``: the prompt's
    estimate, when the caller counted it already."""
    left_out = set(unservable)
    names = [name for name in router.order(route, body, kind) if name not in left_out]
    run = _Failover(router, route, body, send, kind=kind, stream=stream, tokens=prompt_tokens)
    return await run.run(names)


class _Failover:
    """One call's attempts, target after target (see the module's docstring)."""

    def __init__(
        self,
        router: Router,
        route: Route,
        body: dict[str, Any],
        send: Sender,
        *,
        kind: str,
        stream: bool,
        tokens: int | None = None,
    ) -> None:
        self.router, self.route, self.body, self.send = router, route, body, send
        self.kind, self.stream = kind, stream
        self.report = RouteReport(
            route=route.name,
            policy=route.policy.name,
            # A whole answer is priced from its vendor's usage; a stream's, once it ended, from
            # the usage :mod:`.metered` read on its way to openai's machinery.
            pricer=pricer_for(route),
            prompt_tokens=prompt_tokens(body, kind) if tokens is None else tokens,
        )
        self.failures: dict[str, BaseException] = {}
        self.last: BaseException | None = None
        self.retried: dict[str, int] = {}
        """Retries of the same target in this call (an ordered route's primary)."""
        self.retries = 0
        self.started = time.monotonic()
        self.pending: deque[str] = deque()
        self.names: list[str] = []
        self.failed_open: set[str] = set()
        """Targets asked although their circuit was open, once each (:func:`.fails_open`)."""
        self.refused_at: int | None = None
        """The largest context window a context-length error ruled out, if one did."""

    async def run(self, names: list[str]) -> FailedOver:
        give_up_at = anyio.current_time() + coordinator.MAX_WAIT_UNAVAILABLE
        rounds = waits = 0
        reason = "first"
        self.names = names
        while True:
            self.pending.extend(names)
            while self._prune():
                done = await self._target(self.pending.popleft(), reason)
                if done is not None:
                    return done
                reason = "failover"
            asked = self.failed_open  # once through an open circuit: no round for it
            if not any_retryable(e for n, e in self.failures.items() if n not in asked):
                # Nobody could be asked (cooling down, circuits open): wait for the first
                # target to be free again, within the bound.
                soon = self.router.soonest_available(names, trials=False)
                if soon is None or waits >= _MAX_ROUNDS_UNAVAILABLE:
                    break
                if anyio.current_time() + soon > give_up_at:
                    break
                await anyio.sleep(soon)
                waits += 1
            else:
                if rounds >= self.router.max_retries:
                    break
                delay = round_delay(
                    self.failures.values(),
                    rounds=rounds,
                    max_retries=self.router.max_retries,
                    rand=random.random(),
                )
                await anyio.sleep(delay)
                rounds += 1
                self.retries += 1
            reason = "retry"
        raise AllTargetsFailed(
            self.route.name, self.failures, self._stub(), report=self.report, last=self.last
        )

    async def _target(self, name: str, reason: str) -> FailedOver | None:
        """Ask ``name``, again as the rules say; ``None``: go on to the next target."""
        while True:
            failed = await self._attempt(name, reason)
            if isinstance(failed, FailedOver):
                return failed
            if failed is None:  # it may not be asked now
                return None
            reaction = react(
                failed, self.route.rules(), retried=self.retried.get(name, 0), now=time.time()
            )
            if reaction.action == "raise":
                if reaction.cause == "context_length" and self._larger_window_follows(name, failed):
                    return None
                raise failed
            if reaction.action == "failover":
                return None
            self.retried[name] = self.retried.get(name, 0) + 1
            self.retries += 1
            await anyio.sleep(reaction.delay)
            soon = self.router.soonest_available([name])
            if soon is not None and soon > RETRY_SLACK:  # its circuit opened: move on
                return None
            await anyio.sleep(soon or 0.0)
            reason = "retry"

    async def _attempt(self, name: str, reason: str) -> FailedOver | Exception | None:
        """One request to ``name``: its answer, the error it failed with, or ``None`` when
        the target may not be asked now. Counted in the route report and the target's stats."""
        router, target = self.router, self.route.target(name)
        record = AttemptReport(target=name, started=time.monotonic() - self.started, reason=reason)
        self.report.attempts.append(record)
        health = router.health(name)
        if not health.available() or not health.breaker.acquire():
            if not self._fails_open(name):
                exc = unavailable(name, health, self._stub())
                record.outcome, record.error = "error", describe_error(exc)
                self.failures.setdefault(name, exc)
                return None
            record.failed_open = True
        probe = health.breaker.state == "half-open" and not record.failed_open
        try:
            body = {**self.body, "model": target.model}
            response, timings = await self.send(
                target, body, stream=self.stream, continuation=False
            )
        except (APIStatusError, APIConnectionError) as exc:
            router.record_call(name, elapsed=None, exc=exc, kind=self.kind)
            if probe and not is_health_failure(exc):
                health.breaker.release()  # no verdict on its health (a 429, a bad request)
            record.outcome, record.error = outcome(exc), describe_error(exc)
            if isinstance(exc, APIStatusError):
                record.request_id = vendor_request_id(target, exc.response.headers)
            self.failures[name] = self.last = exc
            return exc
        except BaseException:
            if probe:
                health.breaker.release()
            raise
        record.outcome, record.ttft = "won", timings.headers
        record.request_id = vendor_request_id(target, response.headers)
        if not self.stream:  # its body is read: the vendor's usage prices it
            record.usage = adapter_for(target.protocol).answer_usage(self.kind, None, response)
        router.record_call(name, elapsed=None if self.stream else timings.total, exc=None)
        self.report.winner, self.report.ttft = name, time.monotonic() - self.started
        return FailedOver(response, timings, self.report, self.retries)

    def _fails_open(self, name: str) -> bool:
        """Whether ``name``, whose circuit is open, is asked all the same (once in a call):
        none of the call's targets may be asked (:func:`.health.fails_open`)."""
        others = [self.router.health(n) for n in self.names if n != name]
        if name in self.failed_open or not fails_open(self.router.health(name), others):
            return False
        self.failed_open.add(name)
        return True

    def _larger_window_follows(self, name: str, exc: Exception) -> bool:
        """After ``name`` answered a context-length error: whether a target with a larger
        declared context window may still take the call (then only such targets are asked
        next), the refusing window found as the engine finds it."""
        windows = self.route.windows
        if not windows:
            return False
        window = refused_window(
            self.route.target(name).context_window,
            error_message(exc),
            needed_tokens(
                estimate_prompt_tokens(prompt_messages(self.body, self.kind)),
                answer_room(self.body, self.kind),
            ),
        )
        self.refused_at = max(window, self.refused_at or 0)
        return self._prune()

    def _prune(self) -> bool:
        """Leave out the pending targets a context-length error ruled out (a window no
        larger than the one that refused); whether any are left."""
        floor = self.refused_at
        if floor is not None:
            windows = self.route.windows
            kept = [n for n in self.pending if (windows.get(n) or 0) > floor]
            self.pending = deque(kept)
        return bool(self.pending)

    def _stub(self) -> httpx.Request:
        return httpx.Request("POST", f"llmroute://route/{self.route.name}")
