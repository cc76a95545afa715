"""A legacy completion or an embedding on a route: failed over, metered and counted.

:func:`fail_over_call` is what :meth:`~llmroute._dispatch.Dispatch.other` does with such a
call: the route's targets that serve it, in the policy's order, failing over by the engine's
rules (:mod:`.routing.failover`); openai's machinery then parses the winner's response. The
call's telemetry counts a whole answer (its cost from the vendor's usage), a failure, or a
stream when it ends (its cost from the usage its body carried on its way to openai's
machinery, :mod:`.routing.metered`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._call import Call, Served
from .routing.engine import Router
from .routing.failover import fail_over
from .routing.metered import meter
from .routing.route import Route, Sender


async def fail_over_call(
    router: Router,
    route: Route,
    call: Call,
    send: Sender,
    *,
    unservable: Iterable[str],
    telemetry: Any,
) -> Served:
    """The call's winning response (its body unread for openai's machinery), its route
    report and timings on it; ``telemetry`` (the call's, its trace on the call) counts it."""
    try:
        done = await fail_over(
            router,
            route,
            call.body,
            send,
            kind=call.kind,
            stream=call.stream,
            unservable=unservable,
            prompt_tokens=call.prompt_tokens,
        )
    except BaseException as exc:
        telemetry.failed(exc)
        raise
    report, timings = done.report, done.timings
    if call.stream and report.winner is not None:
        telemetry.trace.mark(report)
        meter(
            done.response,
            route.target(report.winner),
            call.kind,
            report.attempts[-1],
            timings,
            lambda exc, whole: telemetry.ended(report, timings, exc, whole),
        )
    else:
        telemetry.answered(report, timings)
    object.__setattr__(done.response, "_llmroute_route", done.report)
    object.__setattr__(done.response, "_llmroute_timings", done.timings)
    return Served(None, done.response, done.retries)
