"""What the limits count and decide with: the counters' units (buckets of a minute, budget
periods, clamped counts), a scope's :class:`Counts`, an admission's :class:`Grant` or
:class:`Refusal`, and the :class:`Limits` both backends keep (the package's docstring tells
how they count)."""

from __future__ import annotations

import calendar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from ...routing.windows import MAX_TOKENS_CAP
from .._tenants import Scope, Tenant

__all__ = [
    "BUCKET",
    "BUCKETS",
    "MAX_MONEY",
    "MAX_TOKENS",
    "WINDOW",
    "Alert",
    "Counts",
    "Grant",
    "Limits",
    "Refusal",
    "SlotClaim",
    "clamp",
    "clamp_money",
    "period_of",
    "scope_period",
]

WINDOW = 60.0
BUCKETS = 6
"""Buckets a minute is counted in; the newest ``BUCKETS + 1`` are summed."""
BUCKET = WINDOW / BUCKETS
"""Seconds a bucket covers."""
MAX_TOKENS = MAX_TOKENS_CAP
"""The most tokens one request is counted at, or corrected by (2^40): far above any answer, and
exact in a Lua number (a double)."""


def clamp(tokens: int) -> int:
    """``tokens`` within ``0..MAX_TOKENS`` (what can enter a counter)."""
    return max(0, min(int(tokens), MAX_TOKENS))


MAX_MONEY = 10**15
"""The most nano-dollars one request is counted at, or corrected by (a million dollars, as
the largest budget): exact in a Lua number."""


def clamp_money(nanos: int) -> int:
    """``nanos`` within ``0..MAX_MONEY``."""
    return max(0, min(int(nanos), MAX_MONEY))


@dataclass(frozen=True, slots=True)
class Counts:
    """A scope's counters as one admission read them (after counting it, when admitted)."""

    requests: int = 0
    requests_oldest: int | None = None
    """The oldest bucket with a request in it."""
    tokens: int = 0
    tokens_oldest: int | None = None
    spent: int = 0
    """Of the budget, in the current period."""
    money: int = 0
    """Of the money budget (nano-dollars), in the current period."""


@dataclass(frozen=True, slots=True)
class Alert:
    """A scope's budget reached its ``soft_limit`` share: said once per period."""

    scope: Scope
    spent: int
    ends: float | None
    """When the period ends (Unix seconds)."""


@dataclass(frozen=True, slots=True)
class SlotClaim:
    """The key's concurrency slot, taken in the admission's own script."""

    limit: int
    lease: float
    token: str


@dataclass(frozen=True, slots=True)
class Grant:
    """An admitted request: where its tokens were counted, to correct them when it ends."""

    key: str
    bucket: int
    period: int | None
    """The budget period of its first scope (``None``: no budget)."""
    reserved: int
    """Tokens counted at admission (its estimate)."""
    headers: dict[str, str] = field(default_factory=dict)
    """OpenAI's ``x-ratelimit-*`` headers for the answer."""
    local: bool = False
    """Counted in this process (Redis was down)."""
    counted: tuple[tuple[Scope, int | None], ...] = ()
    """Each scope counted, with its budget period."""
    slot: str | None = None
    """The concurrency slot taken with it (:class:`SlotClaim`'s token)."""
    alerts: tuple[Alert, ...] = ()
    """Soft limits this admission reached."""
    money: int = 0
    """Nano-dollars counted at admission in the money budgets (its dearest cost)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request the limits refuse: an OpenAI-shaped 429 (or 503)."""

    status: int
    reason: str
    """``requests``, ``tokens``, ``too_large``, ``budget``, ``concurrency``,
    ``limits_unavailable`` or ``limits_error``."""
    code: str
    type: str
    message: str
    headers: dict[str, str] = field(default_factory=dict)


class Limits(Protocol):
    async def admit(
        self, tenant: Tenant, tokens: int, *, model: str | None = None, money: int = 0
    ) -> Grant | Refusal:
        """Count one request of ``tenant`` to ``model`` estimated at ``tokens`` (and at
        ``money`` nano-dollars in money budgets), or refuse it."""
        ...

    async def settle(
        self, grant: Grant, tokens: int, money: int | None = None
    ) -> tuple[Alert, ...]:
        """The request ended having used ``tokens`` (and cost ``money``): correct its
        estimates."""
        ...

    async def peek(self, tenant: Tenant) -> Counts:
        """The counters of the key's first scope now (nothing counted)."""
        ...

    async def peek_scope(self, scope: Scope) -> Counts:
        """A scope's counters now (nothing counted)."""
        ...

    def close(self) -> None: ...

    async def aclose(self) -> None: ...


def period_of(period: str | float, now: float) -> tuple[int, float]:
    """The budget period ``now`` falls in: its number and when it ends (Unix seconds)."""
    if period == "day":
        index = int(now // 86400)
        return index, (index + 1) * 86400.0
    if period == "month":
        day = datetime.fromtimestamp(now, UTC)
        index = day.year * 12 + day.month - 1
        year, month = divmod(index + 1, 12)
        return index, float(calendar.timegm((year, month + 1, 1, 0, 0, 0)))
    assert isinstance(period, float | int)
    index = int(now // period)
    return index, (index + 1) * float(period)


def scope_period(scope: Scope, now: float) -> tuple[int | None, float | None]:
    """The scope's budget period now and its end (``None, None`` without a budget)."""
    if scope.budget_period is None or (scope.budget_tokens is None and not scope.budget_nanos):
        return None, None
    return period_of(scope.budget_period, now)
