"""Probes: ``warmup(probe=True)`` measures every routed target once before the first request.

Each target of every route gets one small real request, all at once: a chat completion of the
target's model with the trial's prompt and fields (:func:`~llmroute.routing.trials.trial_body`:
one short user message, one output token), streamed, so its time to first token is measured as
a caller's request's is. It goes through the engine on a route of that one target (the route's
settings otherwise), so its TTFT, its outcome and its health count exactly as a request's would;
its attempts are reported with the reason ``"probe"``, and priced under that kind. A target that
does not answer within the timeout, or fails, is recorded as failed (a timeout, an error); the
others are not held up by it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from .._types import AttemptReport, RouteReport, Timings
from .budget import HedgeBudget
from .costs import pricer_for
from .engine import Router
from .policies import FailoverPolicy
from .route import SENDING, Route, RouteTarget, Sender
from .stats import TIMEOUT, estimate_prompt_tokens
from .trials import trial_body

__all__ = ["PROBE", "PROBE_TIMEOUT", "Probe", "probe_targets"]

PROBE: str = "probe"
"""The reason (and the cost kind) of a probe's attempts."""
PROBE_TIMEOUT = 10.0
"""Seconds a probe may take, at most, before its target counts as timed out."""


@dataclass(slots=True)
class Probe:
    """One target's probe: its TTFT, or why it failed; ``report``: the engine's route report
    (its attempts with the reason ``"probe"``; ``report.cost`` what it cost)."""

    target: str
    ttft: float | None = None
    error: BaseException | None = None
    report: RouteReport | None = None


def probed_routes(router: Router) -> dict[str, Route]:
    """One route per target (the first route it is in), with that target alone."""
    routes: dict[str, Route] = {}
    for route in router.routes.values():
        for target in route.targets:
            if target.name not in routes:
                routes[target.name] = dataclasses.replace(
                    route,
                    targets=(target,),
                    policy=FailoverPolicy(),
                    budget=HedgeBudget(ratio=0.0),
                    cost_budget=None,
                    price_book={},  # its own: the route's pricer prices the route's targets
                )
    return routes


async def probe_targets(
    router: Router,
    send: Sender,
    *,
    timeout: float = PROBE_TIMEOUT,
    on_done: Callable[[Probe], None] | None = None,
) -> list[Probe]:
    """Probe every target of ``router``'s routes at once, each within ``timeout`` seconds;
    ``on_done`` is called with each probe as it ends. Never raises a target's failure: it is in
    its :class:`Probe`."""
    if not timeout > 0 or math.isnan(timeout):
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    probes: list[Probe] = []

    async def one(route: Route) -> None:
        target = route.targets[0]
        probe = Probe(target.name)
        probes.append(probe)
        sent: list[AttemptReport] = []  # the attempts, as they start: a timeout leaves no report

        def sending(
            target: RouteTarget, body: dict[str, Any], *, stream: bool, continuation: bool
        ) -> Awaitable[tuple[httpx.Response, Timings]]:
            record = SENDING.get()
            if record is not None:
                sent.append(record)
            return send(target, body, stream=stream, continuation=continuation)

        try:
            with anyio.fail_after(timeout):
                await _probe(router, route, target, sending, probe)
        except TimeoutError:
            probe.error = TimeoutError(f"no answer within the probe's {timeout:g} s")
            probe.report = _timed_out(route, sent)
            router.stats.target(target.name).record_outcome(TIMEOUT)
        except Exception as exc:  # the engine recorded the failure in the target's stats
            probe.error = exc
            report = getattr(exc, "report", None)
            if isinstance(report, RouteReport):
                probe.report = report
        if probe.report is not None:
            for attempt in probe.report.attempts:
                attempt.reason = PROBE
        if on_done is not None:
            on_done(probe)

    async with anyio.create_task_group() as tg:
        for route in probed_routes(router).values():
            tg.start_soon(one, route)
    return probes


def _timed_out(route: Route, sent: list[AttemptReport]) -> RouteReport:
    """The report of a probe cut by its timeout: its attempts, those still waiting for their
    first token counted as timed out (priced as cancelled before it: the prompt billed)."""
    for record in sent:
        if record.outcome in ("pending", "cancelled") and record.ttft is None:
            record.outcome = TIMEOUT
    body = trial_body(route.targets[0], "chat")
    return RouteReport(
        route=route.name,
        policy=route.policy.name,
        attempts=sent,
        pricer=pricer_for(route),
        prompt_tokens=estimate_prompt_tokens(body["messages"]),
    )


async def _probe(
    router: Router, route: Route, target: RouteTarget, send: Sender, probe: Probe
) -> None:
    body = {**trial_body(target, "chat"), "stream": True}
    routed = await router.stream(route, body, send)
    probe.report = routed.report
    try:
        async for _ in routed.chunks(lambda response: None):
            pass
    finally:
        with anyio.CancelScope(shield=True):
            await routed.response.aclose()
        routed.finish()
    won = [a.ttft for a in routed.report.attempts if a.outcome == "won"]
    probe.ttft = won[-1] if won else routed.timings.first_token
