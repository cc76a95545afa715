"""What a gateway request takes before its call and gives back after it: its key's concurrency
slot, its place in every limit of its scopes (the key's, its team's, a model's), and, when it
ends, the tokens it used and its usage.

In memory (``limits_backend = "memory"``) that is :class:`~._slots.LocalSlots` and
:class:`~._limits.LocalLimits`. With Redis it is one script before the call
(:meth:`~._limits.RedisLimits.count`: the slot and every scope at once) and one after it
(:meth:`~._limits.RedisLimits.finish`: the slot freed, the tokens corrected, the key's usage
counted for the fleet), so a request pays one round trip before its first token whatever its
limits, and a key without limits pays what it paid for its slot alone.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from ..config import GatewaySettings, RedisSettings
from ._limits import (
    USAGE_FIELDS,
    Alert,
    Counts,
    Grant,
    LocalLimits,
    RedisLimits,
    Refusal,
    SlotClaim,
)
from ._slots import LocalSlots, RedisSlots
from ._spend import PriceUnknown
from ._tenants import Scope, Tenant

__all__ = ["Admission", "Ticket"]


@dataclass(slots=True)
class Ticket:
    """An admitted request: its slot, and where its tokens were counted."""

    key: str
    slot: str
    grant: Grant | None = None
    local: bool = False
    """Its slot was taken in this process (no Redis, or Redis was down)."""

    @property
    def headers(self) -> dict[str, str]:
        """OpenAI's ``x-ratelimit-*`` headers for the answer."""
        return self.grant.headers if self.grant is not None else {}

    @property
    def alerts(self) -> tuple[Alert, ...]:
        return self.grant.alerts if self.grant is not None else ()


class Admission:
    """Slots and limits in this process, or in the ``[redis]`` server (see the module's
    docstring); ``clock`` tells the limits' buckets and budget periods."""

    def __init__(
        self,
        settings: GatewaySettings,
        redis: RedisSettings,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._slots = LocalSlots()
        self._limits = LocalLimits(clock=clock)
        self._shared: RedisLimits | None = None
        self._leases: RedisSlots | None = None
        self._calls: dict[str, list[int]] = {}  # key -> [requests, errors] not yet in Redis
        if settings.limits_backend == "redis":
            url = redis.url.get_secret_value()
            self._shared = RedisLimits(
                url,
                prefix=redis.prefix,
                timeout=redis.timeout,
                on_error=settings.limits_on_redis_error,
                clock=clock,
            )
            self._leases = RedisSlots(
                url,
                prefix=redis.prefix,
                timeout=redis.timeout,
                lease=settings.slot_lease,
                on_error=settings.limits_on_redis_error,
            )

    @property
    def shared(self) -> bool:
        """Counted in Redis, for every replica."""
        return self._shared is not None

    async def enter(
        self,
        tenant: Tenant,
        model: str | None,
        estimate: Callable[[], int],
        money: Callable[[], int] | None = None,
    ) -> Ticket | Refusal:
        """Take a slot of ``tenant`` and count a request to ``model`` in its scopes, or refuse
        it (429 on a limit, 503 when Redis is down and the operator said ``refuse``, 400 when
        a money budget counts it and it cannot be priced). ``estimate`` gives its tokens and
        ``money`` the most it may cost (nano-dollars); each is called only when a scope counts
        it."""
        limit = tenant.concurrency
        scopes = tenant.scopes_for(model)
        tokens = estimate() if scopes else 0
        nanos = 0
        purse = next((s for s in scopes if s.budget_nanos is not None), None)
        if purse is not None and money is not None:
            try:
                nanos = money()
            except PriceUnknown as exc:
                return _unpriced(purse, model, exc)
        if self._shared is not None:
            claim = SlotClaim(limit, self._settings.slot_lease, uuid.uuid4().hex)
            try:
                decided = await self._shared.count(
                    tenant, tokens, model=model, slot=claim, money=nanos
                )
            except self._shared.unreachable as exc:
                self._shared.failed(exc)
                if self._settings.limits_on_redis_error == "refuse":
                    return self._shared.unavailable()
            except self._shared.errors as exc:  # an error Redis answered: not an outage
                self._shared.broken(exc, "admission")
                return self._shared.limits_error()
            else:
                self._shared.answered()
                if isinstance(decided, Refusal):
                    return self._concurrency(limit) if decided.reason == "concurrency" else decided
                return Ticket(tenant.name, claim.token, decided)
        return await self._enter_here(tenant, model, tokens, nanos)

    async def _enter_here(
        self, tenant: Tenant, model: str | None, tokens: int, money: int = 0
    ) -> Ticket | Refusal:
        token = await self._slots.acquire(tenant.name, tenant.concurrency)
        if token is None:
            return self._concurrency(tenant.concurrency)
        grant: Grant | None = None
        if tenant.scopes_for(model):
            decided = self._limits.admit_now(tenant, tokens, model=model, money=money)
            if isinstance(decided, Refusal):
                await self._slots.release(tenant.name, token)
                return decided
            grant = decided
        return Ticket(tenant.name, token, grant, local=True)

    def _concurrency(self, limit: int) -> Refusal:
        wait = self._settings.retry_after
        return Refusal(
            429,
            "concurrency",
            "rate_limit_exceeded",
            "requests",
            f"Too many requests in flight for this key (at most {limit}); retry shortly.",
            {"retry-after": str(max(1, math.ceil(wait))), "retry-after-ms": str(int(wait * 1000))},
        )

    async def renew(self, ticket: Ticket) -> None:
        """Keep a request's shared slot while it runs."""
        if self._leases is not None and not ticket.local:
            await self._leases.renew(ticket.key, ticket.slot)

    async def leave(
        self,
        ticket: Ticket,
        tokens: int,
        usage: Sequence[int],
        money: int | None = None,
        by_target: Mapping[str, int] | None = None,
    ) -> tuple[Alert, ...]:
        """The request ended having used ``tokens`` and cost ``money`` (nano-dollars): its
        slot freed, its scopes corrected, ``usage`` (:data:`~._limits.USAGE_FIELDS`'
        increments) counted for the fleet, its spend under each target that billed it
        (``by_target``). Returns the soft limits the correction reached."""
        grant = ticket.grant
        if ticket.local:
            await self._slots.release(ticket.key, ticket.slot)
            return self._limits.settle_now(grant, tokens, money) if grant is not None else ()
        assert self._shared is not None and grant is not None
        alerts: tuple[Alert, ...] = ()
        try:
            with anyio.CancelScope(shield=True):
                alerts = await self._shared.finish(grant, tokens, usage, money, by_target)
        except self._shared.unreachable as exc:
            self._shared.failed(exc)  # the slot's lease ends by itself; the estimate stands
        except self._shared.errors as exc:
            self._shared.broken(exc, "correction")  # the same: the slot's lease ends by itself
        return alerts

    async def peek(self, scope: Scope) -> Counts:
        """A scope's counters now (the fleet's with Redis)."""
        limits = self._shared if self._shared is not None else self._limits
        return await limits.peek_scope(scope)

    def count_call(self, key: str, error: bool) -> None:
        """An API call of ``key`` that no request's end counted (refused before its call, a
        model list): added to the fleet's usage at the next :meth:`flush`."""
        if self._shared is not None:
            pending = self._calls.setdefault(key, [0, 0])
            pending[0] += 1
            pending[1] += int(error)

    async def flush(self) -> None:
        """Add the calls counted since the last flush to the fleet's usage (one round trip;
        kept for the next flush while Redis cannot be reached)."""
        if self._shared is None or not self._calls:
            return
        taken, self._calls = self._calls, {}
        try:
            with anyio.CancelScope(shield=True):
                await self._shared.add_calls(taken)
        except self._shared.errors as exc:
            for key, (requests, errors) in taken.items():
                pending = self._calls.setdefault(key, [0, 0])
                pending[0] += requests
                pending[1] += errors
            if isinstance(exc, self._shared.unreachable):
                self._shared.failed(exc)

    async def run(self, interval: float = 1.0) -> None:
        """Flush every ``interval`` seconds while the gateway serves."""
        if self._shared is None:
            return
        while True:
            await anyio.sleep(interval)
            await self.flush()

    async def fleet_usage(self) -> dict[str, dict[str, int]] | None:
        """Every key's usage summed over the fleet (key name -> :data:`USAGE_FIELDS`), this
        replica's calls not yet flushed included; ``None`` without Redis or while it cannot be
        read."""
        if self._shared is None:
            return None
        await self.flush()
        try:
            return await self._shared.usage()
        except self._shared.errors as exc:
            if isinstance(exc, self._shared.unreachable):
                self._shared.failed(exc)
            return None

    async def aclose(self) -> None:
        if self._shared is not None:
            await self.flush()
            await self._shared.aclose()
        if self._leases is not None:
            await self._leases.aclose()


def _unpriced(scope: Scope, model: str | None, exc: PriceUnknown) -> Refusal:
    """The 400 of a request a money budget counts that cannot be priced (never free)."""
    label = scope.label[:1].upper() + scope.label[1:]
    return Refusal(
        400,
        "price_unknown",
        "model_not_priced",
        "invalid_request_error",
        f"{label} has a budget in USD, and this request to model {model!r} cannot be priced: "
        f"{exc}. Ask the gateway's operator for a price, or use another model.",
    )


def usage_increments(values: dict[str, Any]) -> tuple[int, ...]:
    """One request's usage as :data:`USAGE_FIELDS`' increments."""
    return tuple(int(values.get(name, 0)) for name in USAGE_FIELDS)
