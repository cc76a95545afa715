"""A cache store in Redis, shared by every app instance that names the same server and prefix."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable
from typing import TypeVar, cast

import anyio.to_thread

from .._redis import RedisConnection
from ._stores import CacheUnavailable, StoreStats, check_ttl

__all__ = ["RedisStore"]

_T = TypeVar("_T")
_PREFIX = re.compile(r"[A-Za-z0-9._-]{1,64}")
_BATCH = 1000


class RedisStore:
    """A store in Redis: entries, popularity counts and lookup counters are shared by every
    process that uses the same server and ``prefix``.

    Keys: ``{prefix}:e:{key}`` for entries (native TTL), ``{prefix}:p:{key}`` for popularity
    counts, ``{prefix}:cache-stats`` a hash of lookup counters. There is no client-side size limit:
    bound the memory with the server's ``maxmemory`` and an eviction policy such as
    ``allkeys-lru`` (with ``noeviction``, writes past the limit raise :class:`CacheUnavailable`).

    The synchronous ``redis`` client and its connection pool are used from worker threads, so
    the store runs under asyncio and trio alike; every command gives up after ``timeout``
    seconds. Values are stored as the bytes given, never pickled.
    """

    kind = "redis"

    def __init__(self, url: str, *, prefix: str = "llmroute", timeout: float = 0.25) -> None:
        if not _PREFIX.fullmatch(prefix):
            raise ValueError(f"prefix must match [A-Za-z0-9._-]{{1,64}}, not {prefix!r}")
        self._redis = RedisConnection(url, timeout=timeout, purpose="RedisStore")
        self._client = self._redis.client
        self.url = self._redis.url
        self.prefix = prefix

    def describe(self) -> str:
        return f"redis at {self.url} (prefix {self.prefix!r})"

    async def get(self, key: str) -> bytes | None:
        return await self._run(lambda: cast("bytes | None", self._client.get(self._entry(key))))

    async def set(self, key: str, value: bytes, *, ttl: float) -> None:
        check_ttl(ttl)
        await self._run(lambda: self._client.set(self._entry(key), value, px=_ms(ttl)))

    async def delete(self, key: str) -> None:
        await self._run(lambda: self._client.unlink(self._entry(key)))

    async def hit(self, key: str, *, window: float) -> int:
        def hit() -> int:
            pipe = self._client.pipeline(transaction=True)
            name = f"{self.prefix}:p:{key}"
            pipe.set(name, 0, px=_ms(window), nx=True)
            pipe.incr(name)
            return pipe.execute()[1]

        return await self._run(hit)

    async def add_stats(self, *, hits: int, misses: int) -> None:
        def add() -> None:
            pipe = self._client.pipeline(transaction=False)
            for field, delta in (("hits", hits), ("misses", misses)):
                if delta:
                    pipe.hincrby(self._stats, field, delta)
            pipe.execute()

        await self._run(add)

    async def stats(self) -> StoreStats:
        """Scan every entry of the prefix (for the command line, not for request paths)."""

        def read() -> StoreStats:
            keys = list(set(self._client.scan_iter(f"{self.prefix}:e:*", count=_BATCH)))
            size = 0
            for start in range(0, len(keys), _BATCH):
                pipe = self._client.pipeline(transaction=False)
                for name in keys[start : start + _BATCH]:
                    pipe.strlen(name)
                size += sum(pipe.execute())
            counters = self._client.hmget(self._stats, ["hits", "misses"])
            hits, misses = (int(value or 0) for value in counters)
            return StoreStats(len(keys), size, hits, misses)

        return await self._run(read)

    async def clear(self) -> int:
        def clear() -> int:
            removed = 0
            for kind in ("e", "p"):
                names = self._client.scan_iter(f"{self.prefix}:{kind}:*", count=_BATCH)
                while batch := list(itertools.islice(names, _BATCH)):
                    unlinked = self._client.unlink(*batch)
                    removed += unlinked if kind == "e" else 0
            self._client.unlink(self._stats)
            return removed

        return await self._run(clear)

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._redis.close)

    @property
    def _stats(self) -> str:
        return f"{self.prefix}:cache-stats"

    def _entry(self, key: str) -> str:
        return f"{self.prefix}:e:{key}"

    async def _run(self, func: Callable[[], _T]) -> _T:
        try:
            return await anyio.to_thread.run_sync(func)
        except self._redis.errors as exc:
            reason = self._redis.reason(exc)
            raise CacheUnavailable(f"{self.describe()} is unavailable: {reason}") from exc


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))
