"""Each key's requests in flight (``max_concurrency_per_key``), in one process or shared by
every gateway replica through Redis.

:class:`LocalSlots` counts in memory. :class:`RedisSlots` keeps one sorted set per key,
``{prefix}:gateway-slots:{key name}``, whose members are the requests in flight, scored by the
time their lease ends: a Lua script drops expired leases, counts, and adds the new request only
below the limit, atomically, so N replicas behind a load balancer hold a key to the same limit.
A replica that dies leaks its leases for at most ``lease`` seconds; a request in flight renews
its lease while it runs. When Redis cannot be reached the replica counts locally, or refuses
(:class:`SlotsUnavailable`) with ``limits_on_redis_error = "refuse"``; either is logged once.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Protocol

import anyio

from .._redis import RedisCaller, RedisConnection

__all__ = ["LocalSlots", "RedisSlots", "Slots", "SlotsUnavailable"]

log = logging.getLogger("llmroute.server")

_ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], tonumber(ARGV[1]) + tonumber(ARGV[2]), ARGV[4])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2])) + 1)
return 1
"""


class SlotsUnavailable(Exception):
    """Redis is unreachable and the operator chose to refuse requests meanwhile."""


class Slots(Protocol):
    async def acquire(self, key: str, limit: int) -> str | None:
        """A token for one more request of ``key``, or ``None`` at the limit."""
        ...

    async def renew(self, key: str, token: str) -> None:
        """Keep a request's slot while it runs (shared slots expire otherwise)."""
        ...

    async def release(self, key: str, token: str) -> None: ...


class LocalSlots:
    """Slots counted in this process."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    async def acquire(self, key: str, limit: int) -> str | None:
        count = self._counts.get(key, 0)
        if count >= limit:
            return None
        self._counts[key] = count + 1
        return "local"

    async def renew(self, key: str, token: str) -> None:
        return None

    async def release(self, key: str, token: str) -> None:
        self._counts[key] -= 1


class RedisSlots:
    """Slots shared through Redis by every replica (see the module's docstring)."""

    def __init__(
        self, url: str, *, prefix: str, timeout: float, lease: float, on_error: str = "local"
    ) -> None:
        self._redis = RedisConnection(url, timeout=timeout, purpose="gateway slots")
        self._calls = RedisCaller(self._redis, {"acquire": _ACQUIRE})
        self._prefix = f"{prefix}:gateway-slots:"
        self._lease = lease
        self._local = LocalSlots()
        self._on_error = on_error
        self._down = False

    async def _run(self, key: str, limit: int, token: str) -> bool:
        keys, args = [self._prefix + key], [time.time(), self._lease, limit, token]
        done = await self._calls.run(
            lambda client, scripts: scripts["acquire"](keys=keys, args=args, client=client)
        )
        return bool(done)

    def _failed(self, exc: BaseException) -> None:
        if not self._down:
            how = "counting locally" if self._on_error == "local" else "refusing requests"
            log.warning("gateway slots: Redis unreachable, %s: %s", how, self._redis.reason(exc))
        self._down = True

    async def acquire(self, key: str, limit: int) -> str | None:
        token = uuid.uuid4().hex
        try:
            granted = await self._run(key, limit, token)
        except self._redis.errors as exc:
            self._failed(exc)
            if self._on_error == "refuse":
                raise SlotsUnavailable() from None
            local = await self._local.acquire(key, limit)
            return None if local is None else "local:" + token
        self._down = False
        return token if granted else None

    async def _renew(self, key: str, token: str) -> None:
        name, lease = self._prefix + key, {token: time.time() + self._lease}
        await self._calls.run(lambda client, _: client.zadd(name, lease, xx=True))

    async def renew(self, key: str, token: str) -> None:
        if token.startswith("local:"):
            return
        try:
            await self._renew(key, token)
        except self._redis.errors as exc:
            self._failed(exc)

    async def _release(self, key: str, token: str) -> None:
        name = self._prefix + key
        await self._calls.run(lambda client, _: client.zrem(name, token))

    async def release(self, key: str, token: str) -> None:
        if token.startswith("local:"):
            await self._local.release(key, token)
            return
        try:
            with anyio.CancelScope(shield=True):
                await self._release(key, token)
        except self._redis.errors as exc:
            self._failed(exc)  # the lease ends by itself

    def close(self) -> None:
        self._redis.close()

    async def aclose(self) -> None:
        await self._calls.aclose()
