"""Limits shared by every gateway replica through Redis: one Lua script per admission
(``admit.lua``: the key's slot and every scope's limits, read, checked and counted at once) and
one when the request ends (``settle.lua``: the estimates corrected, the slot freed, the key's
usage counted); this replica's memory while Redis cannot be reached, if the operator says so
(the package's docstring tells how they count)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any

import anyio

from ..._redis import RedisCaller, RedisConnection
from .._tenants import Scope, Tenant
from ._counts import (
    BUCKET,
    BUCKETS,
    WINDOW,
    Alert,
    Counts,
    Grant,
    Refusal,
    SlotClaim,
    clamp,
    clamp_money,
    scope_period,
)
from ._local import LocalLimits
from ._verdicts import ADMITTED, CONCURRENCY, least_left_headers, refusal, retry_headers

__all__ = ["TARGET_SPEND", "USAGE_FIELDS", "RedisLimits"]

log = logging.getLogger("llmroute.server")

_SCRIPTS = resources.files("llmroute.server._limits")
_ADMIT = (_SCRIPTS / "admit.lua").read_text(encoding="utf-8")
_SETTLE = (_SCRIPTS / "settle.lua").read_text(encoding="utf-8")

USAGE_FIELDS = (
    "requests",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "cache_hits",
    "spend_nanos",
    "hedge_nanos",
    "estimated_nanos",
)
"""A key's usage counters, in Redis and in ``GET /admin/usage`` (``spend_nanos``: what its
requests cost, in nano-dollars, where its model names' targets have prices; ``hedge_nanos``:
the part of it their hedges, retries and continuations cost; ``estimated_nanos``: the part of
it that is the gateway's estimate, answers whose vendor sent no usage before they ended)."""
MONEY_FIELDS = frozenset(name for name in USAGE_FIELDS if name.endswith("_nanos"))
"""The usage counters that are money (nano-dollars, clamped as money), the rest counts."""
TARGET_SPEND = "spend_nanos@"
"""A key's usage counter of its spend at one target: this and the target's name."""


class RedisLimits:
    """Limits shared through Redis by every replica (see the module's docstring)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        timeout: float,
        on_error: str = "local",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._redis = RedisConnection(url, timeout=timeout, purpose="gateway limits")
        self._calls = RedisCaller(self._redis, {"admit": _ADMIT, "settle": _SETTLE})
        self._root = prefix
        self._prefix = f"{prefix}:gateway-limits:"
        self._on_error = on_error
        self._clock = clock
        self._local = LocalLimits(clock=clock)
        self._down = False

    @property
    def errors(self) -> tuple[type[BaseException], ...]:
        """What a call raises: an outage (:attr:`unreachable`) or an error Redis answered."""
        return self._redis.errors

    @property
    def unreachable(self) -> tuple[type[BaseException], ...]:
        """What a call raises when Redis cannot be used now (an outage)."""
        return self._redis.unreachable

    def _scope_keys(self, scope_id: str, period: int | None) -> list[str]:
        # {id} is a Redis Cluster hash tag: a scope's counters are in one slot.
        base = f"{self._prefix}{{{scope_id}}}:"
        suffix = str(period) if period is not None else "none"
        return [
            base + "requests",
            base + "tokens",
            base + "budget:" + suffix,
            base + "soft:" + suffix,
            base + "budget-usd:" + suffix,
        ]

    def _keys(self, name: str, period: int | None) -> list[str]:
        """A key's own counters (requests, tokens, budget), as they have always been named."""
        return self._scope_keys(name, period)[:3]

    def slot_key(self, name: str) -> str:
        """The sorted set of the key's requests in flight (as :class:`~._slots.RedisSlots`)."""
        return f"{self._root}:gateway-slots:{name}"

    def usage_key(self, name: str) -> str:
        """The hash of the key's usage counters, summed over every replica."""
        return f"{self._root}:gateway-usage:{{{name}}}"

    @property
    def usage_index(self) -> str:
        """The set of key names with usage counters."""
        return f"{self._root}:gateway-usage-keys"

    async def _script(
        self,
        name: str,
        scopes: tuple[Scope, ...],
        tokens: int,
        slot: SlotClaim | None,
        dry: bool,
        money: int = 0,
    ) -> tuple[
        int, int, list[Counts], list[bool], list[tuple[int | None, float | None]], float, int
    ]:
        """Run the admission script: its verdict, the scope refused (-1: none), each scope's
        counts and whether it reached its soft limit, the periods, now, and the bucket."""
        now = self._clock()
        bucket = int(now // BUCKET)
        periods = [scope_period(s, now) for s in scopes]
        keys = [self.slot_key(name)]
        args: list[Any] = [bucket, BUCKETS + 1, tokens, int(WINDOW + 2 * BUCKET), 1 if dry else 0]
        args += [time.time(), slot.lease if slot else 0, slot.limit if slot else 0]
        args += [slot.token if slot else "", len(scopes), money]
        for s, (period, end) in zip(scopes, periods, strict=True):
            keys += self._scope_keys(s.id, period)
            budget_ttl = max(1, math.ceil((end or now) - now) + 60)
            args += [s.rpm or 0, s.tpm or 0, s.budget_tokens or 0, budget_ttl, s.soft_at or 0]
            args += [s.budget_nanos or 0]
        reply: list[Any] = await self._calls.run(
            lambda client, scripts: scripts["admit"](keys=keys, args=args, client=client)
        )
        verdict, at = int(reply[0]), int(reply[1])
        rows: list[Counts] = []
        reached: list[bool] = []
        if verdict != CONCURRENCY:
            for i in range(len(scopes)):
                used, oldest, taken, taken_oldest, spent, soft, paid = (
                    int(v) for v in reply[2 + 7 * i : 9 + 7 * i]
                )
                rows.append(
                    Counts(
                        used,
                        oldest if oldest >= 0 else None,
                        taken,
                        taken_oldest if taken_oldest >= 0 else None,
                        spent,
                        paid,
                    )
                )
                reached.append(soft == 1)
        return verdict, at, rows, reached, periods, now, bucket

    async def count(
        self,
        tenant: Tenant,
        tokens: int,
        *,
        model: str | None = None,
        slot: SlotClaim | None = None,
        money: int = 0,
    ) -> Grant | Refusal:
        """One admission script: the slot (if claimed) and every scope's limits, ``money``
        (nano-dollars) in their money budgets; raises :attr:`errors` when Redis cannot be
        reached. Refused for the slot: reason ``concurrency`` (the caller words it)."""
        tokens, money = clamp(tokens), clamp_money(money)
        scopes = tenant.scopes_for(model)
        verdict, at, rows, reached, periods, now, bucket = await self._script(
            tenant.name, scopes, tokens, slot, False, money
        )
        if verdict == CONCURRENCY:
            return Refusal(429, "concurrency", "rate_limit_exceeded", "requests", "")
        listed = [(s, c, e) for s, c, (_, e) in zip(scopes, rows, periods, strict=True)]
        headers = least_left_headers(listed, now) if listed else {}
        if verdict != ADMITTED:
            end = periods[at][1]
            return refusal(scopes[at], tokens, rows[at], verdict, now, end, headers, money)
        alerts = tuple(
            Alert(s, c.spent, e)
            for s, c, (_, e), hit in zip(scopes, rows, periods, reached, strict=True)
            if hit
        )
        return Grant(
            tenant.name,
            bucket,
            periods[0][0] if periods else None,
            tokens,
            headers,
            counted=tuple((s, p) for s, (p, _) in zip(scopes, periods, strict=True)),
            slot=slot.token if slot else None,
            alerts=alerts,
            money=money,
        )

    async def finish(
        self,
        grant: Grant,
        tokens: int,
        usage: Sequence[int] | None = None,
        money: int | None = None,
        by_target: Mapping[str, int] | None = None,
    ) -> tuple[Alert, ...]:
        """One script when a request ends: its tokens (and its ``money``, nano-dollars)
        corrected in each scope, its slot freed, ``usage`` (:data:`USAGE_FIELDS`' increments)
        added to the key's (its spend under each target of ``by_target`` too); raises
        :attr:`errors` when Redis cannot be reached."""
        delta = clamp(tokens) - grant.reserved
        change = clamp_money(money) - grant.money if money is not None else 0
        keys = [self.slot_key(grant.key), self.usage_key(grant.key), self.usage_index]
        counts = ["0"] * len(USAGE_FIELDS)
        if usage is not None:
            counts = [
                str(clamp_money(n) if name in MONEY_FIELDS else clamp(n))
                for name, n in zip(USAGE_FIELDS, usage, strict=True)
            ]
        args: list[Any] = [grant.slot or "", grant.bucket, delta, len(grant.counted)]
        args += ["1" if usage is not None else "0", *counts, change, grant.key]
        spend = [(t, clamp_money(n)) for t, n in (by_target or {}).items() if n > 0]
        args += [len(spend), *(part for pair in spend for part in pair)]
        now = self._clock()
        for scope, period in grant.counted:
            own = self._scope_keys(scope.id, period)
            budget = own[2] if period is not None and scope.budget_tokens is not None else ""
            money_key = own[4] if period is not None and scope.budget_nanos is not None else ""
            keys += [own[1], budget, own[3], money_key]
            end = scope_period(scope, now)[1]
            args += [scope.soft_at or 0, max(1, math.ceil((end or now) - now) + 60)]
        reply: list[Any] = await self._calls.run(
            lambda client, scripts: scripts["settle"](keys=keys, args=args, client=client)
        )
        alerts: list[Alert] = []
        for i, (scope, _) in enumerate(grant.counted):
            if int(reply[2 * i]) == 1:
                alerts.append(Alert(scope, int(reply[2 * i + 1]), scope_period(scope, now)[1]))
        return tuple(alerts)

    async def usage(self) -> dict[str, dict[str, int]]:
        """Every key's usage counters (summed by every replica's :meth:`finish`): key name ->
        :data:`USAGE_FIELDS`; raises :attr:`errors` when Redis cannot be reached."""
        index = self.usage_index
        members = await self._calls.run(lambda client, _: client.smembers(index))
        names = sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)
        keys = [self.usage_key(name) for name in names]

        def read(client: Any, _: Any) -> Any:
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.hgetall(key)
            return pipe.execute()

        hashes: list[dict[bytes, bytes]] = await self._calls.run(read) if keys else []
        return {
            name: {f: int(counters.get(f.encode(), 0)) for f in USAGE_FIELDS}
            | {
                f.decode(): int(v)
                for f, v in counters.items()
                if f.startswith(TARGET_SPEND.encode())
            }
            for name, counters in zip(names, hashes, strict=True)
        }

    async def add_calls(self, calls: dict[str, list[int]]) -> None:
        """Add API calls no request's end counted (key -> [requests, errors]) to the keys'
        usage counters, in one round trip; raises :attr:`errors`."""
        usage = {self.usage_key(key): counts for key, counts in calls.items()}
        index = self.usage_index

        def add(client: Any, _: Any) -> Any:
            pipe = client.pipeline(transaction=False)
            for (key, (requests, errors)), name in zip(usage.items(), calls, strict=True):
                pipe.hincrby(key, "requests", clamp(requests))
                if errors:
                    pipe.hincrby(key, "errors", clamp(errors))
                pipe.sadd(index, name)
            return pipe.execute()

        await self._calls.run(add)

    def broken(self, exc: BaseException, what: str) -> None:
        """Redis answered ``exc`` (a script's error, not an outage): logged, the mode kept."""
        log.error(
            "gateway limits: Redis refused the %s script (not an outage; %s): %s",
            what,
            "this request is refused" if what == "admission" else "the estimate stands",
            self._redis.reason(exc),
        )

    def limits_error(self) -> Refusal:
        """The answer to a request whose admission script Redis refused: the gateway's 500."""
        return Refusal(
            500,
            "limits_error",
            "limits_error",
            "server_error",
            "The gateway could not count this key's limits: its Redis refused the limits "
            "script. This is the gateway's error, not the request's; it is logged.",
        )

    def failed(self, exc: BaseException) -> None:
        """Say once per outage that Redis cannot be reached."""
        if not self._down:
            how = "counting in this replica" if self._on_error == "local" else "refusing requests"
            log.warning(
                "gateway limits: Redis unreachable, %s until it answers: %s",
                how,
                self._redis.reason(exc),
            )
        self._down = True

    def answered(self) -> None:
        """Redis answered: say so once after an outage."""
        if self._down:
            log.info("gateway limits: Redis answers again; counting there")
        self._down = False

    @property
    def local(self) -> LocalLimits:
        """Where this replica counts while Redis cannot be reached."""
        return self._local

    def unavailable(self) -> Refusal:
        return Refusal(
            503,
            "limits_unavailable",
            "limits_unavailable",
            "server_error",
            "The gateway cannot count this key's limits right now (its Redis is unreachable); "
            "retry shortly.",
            retry_headers(1.0),
        )

    async def admit(
        self, tenant: Tenant, tokens: int, *, model: str | None = None, money: int = 0
    ) -> Grant | Refusal:
        try:
            decided = await self.count(tenant, tokens, model=model, money=money)
        except self._redis.unreachable as exc:
            self.failed(exc)
            if self._on_error == "refuse":
                return self.unavailable()
            return self._local.admit_now(tenant, tokens, model=model, money=money)
        except self._redis.errors as exc:
            self.broken(exc, "admission")
            return self.limits_error()
        self.answered()
        return decided

    async def settle(
        self, grant: Grant, tokens: int, money: int | None = None
    ) -> tuple[Alert, ...]:
        if grant.local:
            return self._local.settle_now(grant, tokens, money)
        same_money = money is None or clamp_money(money) == grant.money
        if clamp(tokens) == grant.reserved and same_money:
            return ()
        alerts: tuple[Alert, ...] = ()
        try:
            with anyio.CancelScope(shield=True):
                alerts = await self.finish(grant, tokens, None, money)
        except self._redis.unreachable as exc:
            self.failed(exc)  # the estimate stands
        except self._redis.errors as exc:
            self.broken(exc, "correction")
        return alerts

    async def peek(self, tenant: Tenant) -> Counts:
        return await self.peek_scope(tenant.scopes[0]) if tenant.scopes else Counts()

    async def peek_scope(self, scope: Scope) -> Counts:
        """Raises what Redis answered other than an outage (the caller's 500)."""
        try:
            _, _, rows, _, _, _, _ = await self._script(scope.owner, (scope,), 0, None, True)
        except self._redis.unreachable as exc:
            self.failed(exc)
            return await self._local.peek_scope(scope)
        return rows[0]

    def close(self) -> None:
        self._redis.close()

    async def aclose(self) -> None:
        await self._calls.aclose()
