"""A streamed request's answer (:func:`answer_of`): the race's winner read on as the caller
iterates (:class:`~.answer.Answer`), and a break mid-answer met (:func:`continue_answer`):
counted against its target, then continued on the targets :mod:`.continuation` names (a race
of its own, :func:`~.coordinator.race`), or raised as
:class:`~llmroute.StreamInterrupted` with the text so far."""

from __future__ import annotations

import functools

from .._errors import APIError, describe_error
from ..transport import close_quietly
from .answer import Answer, Ready, won_attempt
from .continuation import (
    continuation_order,
    interrupted,
    no_continuation_target,
    not_continuable,
)
from .coordinator import race
from .policies import Plan
from .run import Run
from .splice import ContinuationMismatch

__all__ = ["answer_of", "continue_answer"]


def answer_of(run: Run, ready: Ready) -> Answer:
    """The reading of the answer ``ready`` began (a streamed request's winner)."""
    return Answer(
        ready,
        run.account,
        route=run.route,
        stats=run.router.stats,
        report=run.report,
        clock=run.clock,
        continuable=run.body.get("n") in (None, 1),  # several answers cannot be one
        asks_usage=run.bodies.asks_usage,
        proceed=functools.partial(continue_answer, run),
        answered=run.answered if run.key is not None else None,
        finish=run.finish,
    )


async def continue_answer(
    run: Run, ready: Ready, failure: APIError, continuable: bool
) -> Ready | None:
    """Continue a broken answer on another target (:mod:`.continuation`), or raise
    StreamInterrupted; ``None`` when the answer already holds the caller's ``max_tokens``
    (counted low): it ends there with ``finish_reason="length"``."""
    await close_quietly(ready.response)
    _broke(run, ready, failure)
    route, account = run.route, run.account
    partial = "".join(account.text)
    request = ready.response.request
    name = ready.target.name
    broke = f"The stream from {name!r} broke after {account.tokens} tokens ({failure.message})"
    why = not_continuable(
        route,
        continued=len(run.report.continued_on),
        continuable=continuable,
        reasoned=account.reasoned,
        partial=partial,
    )
    if why is not None:
        why = f"it cannot be continued ({why})"
        raise interrupted(broke, why, request, partial, failure) from failure
    if account.limit is not None and account.delivered >= account.limit:
        return None  # the count errs low: the answer holds at least the tokens asked
    left_out = run.refused | run.mismatched
    order = continuation_order(route, run.view, left_out=left_out, broken=run.broken)
    if not order:
        why = no_continuation_target(route, run.mismatched)
        raise interrupted(broke, why, request, partial, failure) from failure
    try:
        new = await race(run, Plan(order), retries=0, prefix=partial)
    except APIError as exc:  # every target failed, or one refused the continuation
        why = f"no target could continue it ({exc.message})"
        raise interrupted(broke, why, request, partial, failure) from failure
    run.report.continued_on.append(new.target.name)
    account.continued()
    return new


def _broke(run: Run, ready: Ready, failure: APIError) -> None:
    """The answer's stream from ``ready`` broke: counted against its target, in the
    route report, and its tokens in the account."""
    name = ready.target.name
    run.finish()
    stats = run.router.stats.target(name)
    stats.record_outcome("interrupted")
    health = run.router.health(name)
    health.failed(failure, run.kind)  # the cause a request refused while open names
    health.breaker.record_failure()
    run.broken.append(name)
    if isinstance(failure, ContinuationMismatch):
        run.mismatched.add(name)
    tokens, counted, estimate = run.account.delivered_by(ready.decoder, stats.token_counts)
    run.account.broke(tokens, counted)
    record = won_attempt(run.report, name)
    if record is not None:
        record.outcome = "interrupted"
        record.error = describe_error(failure)
        record.tokens, record.tokens_counted = tokens, counted
        record.tokens_estimate = estimate
