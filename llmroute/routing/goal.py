"""A per-request latency goal: a TTFT target in ms, and optionally a minimum decode speed.

Pure: reading the goal from a request's options, and bending a policy's plan towards it. It
knows nothing of HTTP; the client's seam reads ``extra_body={"llmroute": {...}}`` and the
``x-llmroute-ttft-target-ms`` header and turns a :class:`GoalError` into a ``BadRequestError``
before anything is sent.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .policies import Plan

__all__ = ["GOAL_KEYS", "TTFT_TARGET_HEADER", "GoalError", "LatencyGoal", "meet_goal", "read_goal"]

TTFT_TARGET_HEADER = "x-llmroute-ttft-target-ms"
GOAL_KEYS = ("ttft_target_ms", "min_tokens_per_s")
"""The keys of ``extra_body={"llmroute": {...}}``."""


class GoalError(ValueError):
    """A per-request option of the wrong name, type or range; ``param`` names it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class LatencyGoal:
    """What one request asks of its first token (seconds) and of its decode speed."""

    ttft_target: float | None = None
    min_tokens_per_s: float | None = None

    def over(self, default: LatencyGoal | None) -> LatencyGoal:
        """This goal, with what it leaves unset taken from ``default`` (the route's)."""
        if default is None:
            return self
        return LatencyGoal(
            self.ttft_target if self.ttft_target is not None else default.ttft_target,
            self.min_tokens_per_s
            if self.min_tokens_per_s is not None
            else default.min_tokens_per_s,
        )


def _positive(value: object, param: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise GoalError(f"{param}: expected a positive number, got {value!r:.80}", param)
    try:
        number = float(value)  # an int beyond a double (10**400) overflows: refused below
    except OverflowError:
        number = math.inf
    if not (math.isfinite(number) and number > 0):
        raise GoalError(f"{param}: expected a positive number, got {value!r:.80}", param)
    return number


def read_goal(options: object, header: object = None) -> LatencyGoal | None:
    """The goal of a request from its ``llmroute`` body options (``None`` if absent) and its
    ``x-llmroute-ttft-target-ms`` header (the body wins); ``None`` when it sets nothing.

    Raises :class:`GoalError` naming the option for an unknown key, a wrong type or a value
    that is not a positive number."""
    ttft_ms: float | None = None
    speed: float | None = None
    if header is not None:
        try:
            number = float(str(header).strip())
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number > 0):
            raise GoalError(
                f"{TTFT_TARGET_HEADER}: expected a positive number of milliseconds, got "
                f"{str(header)[:80]!r}",
                TTFT_TARGET_HEADER,
            )
        ttft_ms = number
    if options is not None:
        if not isinstance(options, Mapping):
            raise GoalError(
                f"llmroute: expected an object with {' and/or '.join(GOAL_KEYS)}, got "
                f"{type(options).__name__}",
                "llmroute",
            )
        for key, value in options.items():
            if key not in GOAL_KEYS:
                raise GoalError(
                    f"llmroute.{str(key)[:80]}: unknown option (expected one of "
                    f"{', '.join(GOAL_KEYS)})",
                    f"llmroute.{str(key)[:80]}",
                )
            if key == "ttft_target_ms":
                ttft_ms = _positive(value, "llmroute.ttft_target_ms")
            else:
                speed = _positive(value, "llmroute.min_tokens_per_s")
    if ttft_ms is None and speed is None:
        return None
    return LatencyGoal(None if ttft_ms is None else ttft_ms / 1000.0, speed)


def meet_goal(
    plan: Plan,
    goal: LatencyGoal,
    *,
    median: Callable[[str], float],
    speed: Callable[[str], float | None],
    available: Callable[[str], bool],
) -> Plan:
    """``plan`` bent towards ``goal``: targets predicted to miss it (a predicted median TTFT
    above the target, or a live median decode speed below the minimum) move behind those
    predicted to meet it, while one available target is; and the first attempt is hedged once
    the goal is at risk, when the next target's median would only just still meet it (or at
    the plan's own hedge delay, if sooner). A plan that starts several attempts at once (a
    race) is only reordered."""

    def meets(target: str) -> bool:
        if goal.ttft_target is not None and median(target) > goal.ttft_target:
            return False
        if goal.min_tokens_per_s is not None:
            rate = speed(target)
            if rate is not None and rate < goal.min_tokens_per_s:
                return False
        return True

    order: tuple[str, ...] = plan.order
    meeting = [t for t in order if meets(t)]
    if meeting and any(available(t) for t in meeting):
        order = (*meeting, *(t for t in order if t not in meeting))
    delays = plan.hedge_delays
    if goal.ttft_target is not None and plan.start == 1 and len(order) > 1:
        at_risk = max(0.0, goal.ttft_target - median(order[1]))
        first = plan.hedge_delay(0) if order[0] == plan.order[0] else None
        delays = (at_risk if first is None else min(first, at_risk), *delays[1:])
    if order == plan.order and delays == plan.hedge_delays:
        return plan
    explored = plan.explored if plan.explored in order[:1] else None
    return dataclasses.replace(plan, order=order, hedge_delays=delays, explored=explored)
