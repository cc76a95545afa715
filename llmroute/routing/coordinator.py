"""The race that carries out one request's plan (:func:`race`): a :class:`Coordinator` starts
an :class:`~.attempt.Attempt` per target of the plan, hedges a slow one when the plan says so
and the route's budget allows, fails over to the next target, waits for one to be free again
or retries the plan in rounds, until an attempt has its first token or none is left to make."""

from __future__ import annotations

import math
from collections import deque

import anyio
import anyio.abc

from .._background import spawn
from .._errors import AllTargetsFailed
from ..transport import close_quietly
from .answer import Ready
from .attempt import Attempt
from .causes import any_retryable
from .policies import Plan
from .race import Race
from .run import Run

__all__ = ["MAX_WAIT_UNAVAILABLE", "PROBE_PATIENCE", "RETRY_SLACK", "Coordinator", "race"]

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


async def race(run: Run, plan: Plan, *, retries: int, prefix: str | None = None) -> Ready:
    """Run ``plan`` until an attempt has a first token; raise AllTargetsFailed if none."""
    route, report, clock = run.route, run.report, run.clock
    state = Race()
    state.continuing = prefix is not None
    try:
        try:
            await Coordinator(run, plan, state, retries=retries, prefix=prefix).coordinate()
        finally:
            state.decided()
    except BaseException:
        winner = state.winner
        if winner is not None:  # the caller gave up after a first token: release it too
            await close_quietly(winner.response)
            run.router.stats.target(winner.target.name).load.finished()
        raise
    if plan.key is not None:
        run.observe(plan.key, state.winner)
        if state.winner is not None:
            run.key = plan.key
    if state.winner is None and state.final is not None:
        raise state.final
    if state.winner is None:
        raise AllTargetsFailed(
            route.name, state.failures, run.request_stub(), report=run.report, last=state.last
        )
    if report.ttft is None:
        report.ttft = clock() - run.t0
    if run.stream:
        run.in_flight = state.winner.target.name
    return state.winner


class Coordinator:
    """Carries out one plan in a race: the attempts it starts, hedges, failover and rounds of
    retries, until an attempt has its first token or none is left to make (``state``)."""

    def __init__(
        self, run: Run, plan: Plan, state: Race, *, retries: int, prefix: str | None
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

    def _attempt(self, name: str, reason: str | None) -> Attempt:
        """An attempt on ``name`` (``reason`` ``None``: one the plan starts with)."""
        if reason is None and name == self.plan.explored:
            reason = "probe" if self.plan.probe else "explore"
        if reason is None:
            reason = self.opening
        record = self.run.begin_attempt(name, reason, self.state)
        return Attempt(self.run, record, self.state, self.prefix)

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

    def run_on(self, attempt: Attempt) -> None:
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
            for name in [n for n in self.pending if not self.run.failures.window_above(n, floor)]:
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
        soon = self.run.failures.soonest_available([name])
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
        state, plan, asked = self.state, self.plan, self.run.failures.failed_open
        if not any_retryable(e for n, e in state.failures.items() if n not in asked):
            # Nobody could be asked (cooling down, circuits open): wait for the
            # first target to be free again if that fits the first-token deadline.
            soon = self.run.failures.soonest_available(plan.order, trials=False)
            if soon is None or anyio.current_time() + soon > self.give_up_at:
                return False
            await anyio.sleep(soon)
        else:
            if self.rounds >= self.retries:
                return False
            await anyio.sleep(self.run.failures.retry_delay(self.rounds, state.failures))
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
