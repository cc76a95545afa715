"""Limits counted in this process: the gateway's without Redis, and a replica's while its Redis
cannot be reached (the package's docstring tells how they count)."""

from __future__ import annotations

import time
from collections.abc import Callable

from .._tenants import Scope, Tenant
from ._counts import (
    BUCKET,
    BUCKETS,
    Alert,
    Counts,
    Grant,
    Refusal,
    clamp,
    clamp_money,
    scope_period,
)
from ._verdicts import ADMITTED, Row, least_left_headers, refusal, verdict_of

__all__ = ["LocalLimits"]


class LocalLimits:
    """Limits counted in this process (see the module's docstring)."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._requests: dict[str, dict[int, int]] = {}
        self._tokens: dict[str, dict[int, int]] = {}
        self._budgets: dict[str, tuple[int, int]] = {}  # scope id -> (period, spent)
        self._money: dict[str, tuple[int, int]] = {}  # scope id -> (period, nano-dollars)
        self._soft: dict[str, int] = {}  # scope id -> the period its soft limit was said in

    @staticmethod
    def _window(buckets: dict[int, int], now: int) -> tuple[int, int | None]:
        for old in [b for b in buckets if b <= now - BUCKETS - 1]:
            del buckets[old]
        used = sum(buckets.values())
        oldest = min((b for b, n in buckets.items() if n > 0), default=None)
        return used, oldest

    def _read(self, scope: Scope, bucket: int, period: int | None) -> Counts:
        used, oldest = self._window(self._requests.setdefault(scope.id, {}), bucket)
        taken, taken_oldest = self._window(self._tokens.setdefault(scope.id, {}), bucket)
        own_period, spent = self._budgets.get(scope.id, (period, 0))
        if own_period != period:
            spent = 0
        money_period, money = self._money.get(scope.id, (period, 0))
        if money_period != period:
            money = 0
        return Counts(used, oldest, taken, taken_oldest, spent, money)

    def _add(
        self,
        scope: Scope,
        counts: Counts,
        bucket: int,
        period: int | None,
        end: float | None,
        tokens: int,
        money: int = 0,
    ) -> tuple[Counts, Alert | None]:
        requests, taken = self._requests[scope.id], self._tokens[scope.id]
        requests[bucket] = requests.get(bucket, 0) + 1
        taken[bucket] = taken.get(bucket, 0) + tokens
        alert = None
        if period is not None and scope.budget_tokens is not None:
            self._budgets[scope.id] = (period, counts.spent + tokens)
            alert = self._alert(scope, period, end, counts.spent, counts.spent + tokens)
        spent_money = counts.money
        if period is not None and scope.budget_nanos is not None:
            spent_money += money
            self._money[scope.id] = (period, spent_money)
        return (
            Counts(
                counts.requests + 1,
                bucket if counts.requests_oldest is None else counts.requests_oldest,
                counts.tokens + tokens,
                bucket if counts.tokens_oldest is None and tokens else counts.tokens_oldest,
                counts.spent + tokens,
                spent_money,
            ),
            alert,
        )

    def _alert(
        self, scope: Scope, period: int, end: float | None, before: int, after: int
    ) -> Alert | None:
        at = scope.soft_at
        if at is None or after < at or self._soft.get(scope.id) == period:
            return None
        self._soft[scope.id] = period
        return Alert(scope, after, end)

    async def admit(
        self, tenant: Tenant, tokens: int, *, model: str | None = None, money: int = 0
    ) -> Grant | Refusal:
        return self.admit_now(tenant, tokens, model=model, money=money)

    def admit_now(
        self, tenant: Tenant, tokens: int, *, model: str | None = None, money: int = 0
    ) -> Grant | Refusal:
        tokens, money = clamp(tokens), clamp_money(money)
        scopes = tenant.scopes_for(model)
        now = self._clock()
        bucket = int(now // BUCKET)
        periods = [scope_period(s, now) for s in scopes]
        rows = [self._read(s, bucket, p) for s, (p, _) in zip(scopes, periods, strict=True)]
        verdict, at = verdict_of(scopes, rows, tokens, money)
        if verdict != ADMITTED:
            listed = [(s, c, e) for s, c, (_, e) in zip(scopes, rows, periods, strict=True)]
            headers = least_left_headers(listed, now)
            end = periods[at][1]
            return refusal(scopes[at], tokens, rows[at], verdict, now, end, headers, money)
        alerts: list[Alert] = []
        counted: list[Row] = []
        for s, c, (p, e) in zip(scopes, rows, periods, strict=True):
            after, alert = self._add(s, c, bucket, p, e, tokens, money)
            counted.append((s, after, e))
            if alert is not None:
                alerts.append(alert)
        return Grant(
            tenant.name,
            bucket,
            periods[0][0] if periods else None,
            tokens,
            least_left_headers(counted, now) if counted else {},
            local=True,
            counted=tuple((s, p) for s, (p, _) in zip(scopes, periods, strict=True)),
            alerts=tuple(alerts),
            money=money,
        )

    async def settle(
        self, grant: Grant, tokens: int, money: int | None = None
    ) -> tuple[Alert, ...]:
        return self.settle_now(grant, tokens, money)

    def settle_now(self, grant: Grant, tokens: int, money: int | None = None) -> tuple[Alert, ...]:
        if money is not None and clamp_money(money) != grant.money:
            change = clamp_money(money) - grant.money
            for scope, period in grant.counted:
                held = self._money.get(scope.id)
                if period is not None and held is not None and held[0] == period:
                    self._money[scope.id] = (period, max(0, held[1] + change))
        delta = clamp(tokens) - grant.reserved
        if not delta:
            return ()
        alerts: list[Alert] = []
        for scope, period in grant.counted:
            taken = self._tokens.get(scope.id, {})
            if grant.bucket in taken:
                taken[grant.bucket] = max(0, taken[grant.bucket] + delta)
            budget = self._budgets.get(scope.id)
            if period is not None and budget is not None and budget[0] == period:
                spent = max(0, budget[1] + delta)
                self._budgets[scope.id] = (period, spent)
                ends = scope_period(scope, self._clock())[1]
                alert = self._alert(scope, period, ends, budget[1], spent)
                if alert is not None:
                    alerts.append(alert)
        return tuple(alerts)

    async def peek(self, tenant: Tenant) -> Counts:
        return await self.peek_scope(tenant.scopes[0]) if tenant.scopes else Counts()

    async def peek_scope(self, scope: Scope) -> Counts:
        now = self._clock()
        return self._read(scope, int(now // BUCKET), scope_period(scope, now)[0])

    def close(self) -> None:
        return None

    async def aclose(self) -> None:
        return None
