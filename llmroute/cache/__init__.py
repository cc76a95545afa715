"""The response cache: keys, stores (memory, disk, Redis), replay, admission, single-flight.

See docs/cache.md. The client asks :class:`ResponseCache` for a stored answer before routing,
shares identical requests in flight, and stores popular complete answers when they end.
"""

from __future__ import annotations

import os

from ..config import CacheSettings, RedisSettings
from ._cache import CacheRequest, Hit, ResponseCache
from ._entry import CacheEntry, CorruptEntry
from ._flight import Flight
from ._key import NAMESPACE_PATTERN, is_deterministic, request_key, tenant_namespace
from ._stores import CacheStore, CacheUnavailable, DiskStore, MemoryStore, StoreStats

__all__ = [
    "NAMESPACE_PATTERN",
    "CacheEntry",
    "CacheRequest",
    "CacheStore",
    "CacheUnavailable",
    "CorruptEntry",
    "DiskStore",
    "Flight",
    "Hit",
    "MemoryStore",
    "ResponseCache",
    "StoreStats",
    "is_deterministic",
    "open_cache",
    "open_store",
    "request_key",
    "tenant_namespace",
]


def open_store(settings: CacheSettings, redis: RedisSettings) -> CacheStore:
    """The store a ``[cache]`` table names (``backend`` must not be ``"off"``)."""
    if settings.backend == "memory":
        return MemoryStore(max_bytes=settings.max_bytes)
    if settings.backend == "disk":
        return DiskStore(os.path.expanduser(settings.path), max_bytes=settings.max_bytes)
    if settings.backend == "redis":
        from ._redis import RedisStore

        return RedisStore(redis.url.get_secret_value(), prefix=redis.prefix, timeout=redis.timeout)
    raise ValueError(f"no store for cache backend {settings.backend!r}")


def open_cache(settings: CacheSettings, redis: RedisSettings) -> ResponseCache:
    """The response cache a ``[cache]`` table describes."""
    return ResponseCache(
        open_store(settings, redis),
        ttl=settings.ttl,
        min_hits=settings.min_hits,
        window=settings.window,
        max_entry_bytes=settings.max_entry_bytes,
    )
