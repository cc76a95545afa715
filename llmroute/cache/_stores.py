"""Where cached answers live: one async contract, kept in memory, on disk or in Redis.

A store keeps opaque ``bytes`` under string keys (``"<namespace>/<sha256 hex>"``) with a TTL,
counts how often each key was asked (for the admission rule) and accumulates lookup counters.
It never looks inside a value: entry format, corruption and policy belong to the layer above.
The Redis store is in :mod:`llmroute.cache._redis`, so ``redis`` stays an optional import.
"""

from __future__ import annotations

import contextlib
import math
import os
import sqlite3
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol, TypeVar, cast

import anyio.to_thread
import diskcache

from .._sizes import format_size
from ._admission import PopularityCounter

__all__ = [
    "CacheStore",
    "CacheUnavailable",
    "DiskStore",
    "MemoryStore",
    "StoreStats",
    "check_ttl",
]

_T = TypeVar("_T")


class CacheUnavailable(Exception):
    """Raised when a cache store's backend cannot be reached or used."""


@dataclass(frozen=True, slots=True)
class StoreStats:
    """A store's contents and lookup counters at one moment."""

    entries: int
    bytes: int
    """Total size of the stored values."""
    hits: int
    misses: int

    @property
    def hit_rate(self) -> float | None:
        """Hits per lookup, or ``None`` before the first lookup."""
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else None


class CacheStore(Protocol):
    """The contract every store keeps (one test suite runs against all of them)."""

    kind: str
    """``"memory"``, ``"disk"`` or ``"redis"``."""

    def describe(self) -> str:
        """Where the store is, for people (secrets redacted)."""
        ...

    async def get(self, key: str) -> bytes | None:
        """The value stored under ``key``, or ``None`` if it is absent or expired."""
        ...

    async def set(self, key: str, value: bytes, *, ttl: float) -> None:
        """Store ``value`` under ``key`` for ``ttl`` seconds, replacing any older value."""
        ...

    async def delete(self, key: str) -> None:
        """Remove ``key``'s value, if any."""
        ...

    async def hit(self, key: str, *, window: float) -> int:
        """Count one ask of ``key``; return the asks in its current window (see
        :class:`~llmroute.cache._admission.PopularityCounter`)."""
        ...

    async def add_stats(self, *, hits: int, misses: int) -> None:
        """Add to the lookup counters kept with the store."""
        ...

    async def stats(self) -> StoreStats:
        """Count entries and bytes, and read the lookup counters."""
        ...

    async def clear(self) -> int:
        """Remove every entry, popularity count and counter of this store; return the entries
        removed."""
        ...

    async def aclose(self) -> None:
        """Release the store's connections and files."""
        ...


def check_ttl(ttl: float) -> None:
    """Refuse a TTL that no store can keep."""
    if not (0 < ttl < math.inf):
        raise ValueError(f"ttl must be a positive number of seconds, not {ttl!r}")


class MemoryStore:
    """A per-process store: least recently used entries go first once values pass ``max_bytes``.

    A get refreshes an entry's recency; a value larger than ``max_bytes`` is not stored. Expiry
    is checked on get, with ``clock`` (``time.monotonic`` unless a test passes its own).
    """

    kind = "memory"

    def __init__(self, max_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self._clock = clock
        self._entries: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self._bytes = 0
        self._hits = self._misses = 0
        self._popularity = PopularityCounter(clock=clock)

    def describe(self) -> str:
        return f"memory (this process, up to {format_size(self.max_bytes)})"

    async def get(self, key: str) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[1] <= self._clock():
            self._remove(key)
            return None
        self._entries.move_to_end(key)
        return entry[0]

    async def set(self, key: str, value: bytes, *, ttl: float) -> None:
        check_ttl(ttl)
        self._remove(key)
        if len(value) > self.max_bytes:
            return
        self._entries[key] = (value, self._clock() + ttl)
        self._bytes += len(value)
        while self._bytes > self.max_bytes:
            self._remove(next(iter(self._entries)))

    async def delete(self, key: str) -> None:
        self._remove(key)

    async def hit(self, key: str, *, window: float) -> int:
        return self._popularity.hit(key, window)

    async def add_stats(self, *, hits: int, misses: int) -> None:
        self._hits += hits
        self._misses += misses

    async def stats(self) -> StoreStats:
        self._purge_expired()
        return StoreStats(len(self._entries), self._bytes, self._hits, self._misses)

    async def clear(self) -> int:
        self._purge_expired()
        removed = len(self._entries)
        self._entries.clear()
        self._bytes = self._hits = self._misses = 0
        self._popularity.clear()
        return removed

    async def aclose(self) -> None:
        pass

    def _remove(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= len(entry[0])

    def _purge_expired(self) -> None:
        now = self._clock()
        for key in [key for key, (_, expires) in self._entries.items() if expires <= now]:
            self._remove(key)


_DB_NAME = "cache.db"  # diskcache's file name
_POPULARITY = ("llmroute", "p")  # + the entry's key: its asks in the current window
_STATS_KEYS = {"hits": ("llmroute", "stats", "hits"), "misses": ("llmroute", "stats", "misses")}
_PRAGMAS = "SELECT key, value FROM Settings WHERE substr(key, 1, 7) = 'sqlite_'"
_RAW_ENTRIES = "SELECT COUNT(*) FROM Cache WHERE raw = 1"
_READ_ENTRY = (
    "SELECT mode, filename, value FROM Cache"
    " WHERE key = ? AND raw = 1 AND (expire_time IS NULL OR expire_time > ?)"
)
_TOUCH_ENTRY = "UPDATE Cache SET access_time = ? WHERE key = ? AND raw = 1"
_MODE_RAW = 1  # diskcache's mode of a value kept as bytes in the database
_UNREAD: Any = object()
_ENTRY_TOTALS = (
    "SELECT COUNT(*), COALESCE(SUM(COALESCE(LENGTH(value), size)), 0) FROM Cache"
    " WHERE raw = 1 AND (expire_time IS NULL OR expire_time > ?)"
)


class DiskStore:
    """A persistent store in a directory, shared safely by every process that opens it.

    Built on :class:`diskcache.Cache` (SQLite in WAL mode): least recently used entries are
    evicted once the database passes ``max_bytes``. Every value is kept inside the database, so
    the directory holds only ``cache.db`` and its ``-wal``/``-shm`` files, all mode 0600 in a
    0700 directory. Entries, popularity counts and lookup counters are shared by every process
    that opens the directory: an ask is counted in one SQLite transaction, so four processes
    asking a prompt once each count to four (as the Redis store does). Popularity counts are
    stored under tuple keys, apart from the entries (which have string keys), and expire with
    their window. Disk work runs in a worker thread, one call at a time on one SQLite connection
    per store; only a lookup's read (one SELECT, no write) runs on the event loop, and only
    while no worker holds the connection (the entry's place in the LRU order is written by the
    worker before its next call). The connection is opened by the constructor (and again by a
    worker after ``aclose`` or in a forked child).
    """

    kind = "disk"

    def __init__(self, path: str | os.PathLike[str], max_bytes: int) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._pid: int | None = None  # the process whose connection diskcache holds
        self._touched: dict[str, float] = {}  # entries read on the event loop, and when
        with self._errors():
            _make_private_dir(self.path)
            self._cache = diskcache.Cache(
                str(self.path),
                timeout=1,
                size_limit=max_bytes,
                eviction_policy="least-recently-used",
                disk_min_file_size=2**62,
            )
            self._cache.close()
            # Connected now, not on the first lookup: the connection's first statement reads
            # the schema (most of a fresh process's first hit otherwise), and a lookup on a
            # connected store reads on the calling thread, with no worker and no write.
            with self._lock:
                self._connect()

    def describe(self) -> str:
        return f"disk at {self.path} (up to {format_size(self.max_bytes)})"

    async def get(self, key: str) -> bytes | None:
        value = self._read_now(key)
        if value is _UNREAD:
            value = await self._run(self._cache.get, key)
        return value if isinstance(value, bytes) else None

    def _read_now(self, key: str) -> Any:
        """``key``'s value (``None``: absent or expired) read on the calling thread: one SELECT,
        no write and no thread hop (a WAL reader does not wait for writers). The LRU order is
        kept: the read is noted and written by the worker before its next call.

        :data:`_UNREAD` when it must be read in the worker with diskcache's ``get`` instead: a
        worker holds the connection (it is never waited for), it is not open in this process
        yet, the value is not stored as bytes in the database, or the read failed."""
        if self._pid != os.getpid() or not self._lock.acquire(blocking=False):
            return _UNREAD
        try:
            now = time.time()
            row = self._cache._sql(_READ_ENTRY, (key, now)).fetchone()
            if row is None:
                return None
            mode, filename, value = row
            if mode != _MODE_RAW or filename is not None or not isinstance(value, bytes):
                return _UNREAD
            self._touched[key] = now
            return value
        except (OSError, sqlite3.Error, diskcache.Timeout):
            return _UNREAD
        finally:
            self._lock.release()

    def _touch(self) -> None:
        """Write the access times of the entries read on the event loop (under the lock)."""
        touched, self._touched = self._touched, {}
        if touched:
            with self._cache.transact():
                for key, at in touched.items():
                    self._cache._sql(_TOUCH_ENTRY, (at, key))

    async def set(self, key: str, value: bytes, *, ttl: float) -> None:
        check_ttl(ttl)
        if len(value) > self.max_bytes:
            await self.delete(key)
        else:
            await self._run(self._cache.set, key, value, expire=ttl)

    async def delete(self, key: str) -> None:
        await self._run(self._cache.delete, key)

    async def hit(self, key: str, *, window: float) -> int:
        check_ttl(window)
        name = (*_POPULARITY, key)

        def hit() -> int:
            # One write transaction (BEGIN IMMEDIATE): no other process counts in between. The
            # window starts with the first ask: its count expires then, and incr keeps that.
            with self._cache.transact():
                count = self._cache.get(name)
                if not isinstance(count, int):
                    self._cache.set(name, 1, expire=window)
                    return 1
                return int(self._cache.incr(name))

        return await self._run(hit)

    async def add_stats(self, *, hits: int, misses: int) -> None:
        def add() -> None:
            with self._cache.transact():
                for name, delta in (("hits", hits), ("misses", misses)):
                    if delta:
                        self._cache.incr(_STATS_KEYS[name], delta)

        await self._run(add)

    async def stats(self) -> StoreStats:
        def read() -> StoreStats:
            # diskcache has no public query of value sizes; its schema is stable since 2016.
            entries, size = self._cache._sql(_ENTRY_TOTALS, (time.time(),)).fetchone()
            hits, misses = (self._cache.get(key, 0) for key in _STATS_KEYS.values())
            return StoreStats(entries, size, _count(hits), _count(misses))

        return await self._run(read)

    async def clear(self) -> int:
        def clear() -> int:
            # Entries have string keys (raw); counters and popularity counts are tuples.
            self._cache.expire()
            (entries,) = self._cache._sql(_RAW_ENTRIES).fetchone()
            self._cache.clear()
            return int(entries)

        return await self._run(clear)

    async def aclose(self) -> None:
        def close() -> None:
            with self._lock:
                with contextlib.suppress(OSError, sqlite3.Error, diskcache.Timeout):
                    if self._pid == os.getpid():
                        self._touch()
                self._cache.close()
                self._pid = None

        await anyio.to_thread.run_sync(close)

    async def _run(self, func: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await anyio.to_thread.run_sync(lambda: self._call(func, *args, **kwargs))

    def _call(self, func: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        with self._lock, self._errors():
            if self._pid != os.getpid():
                self._connect()
            self._touch()
            return func(*args, **kwargs)

    def _connect(self) -> None:
        """Give diskcache one connection for all worker threads, used under ``self._lock``.

        By itself diskcache opens a connection per thread, which a thread pool would keep open
        until each thread ends; this one is closed by :meth:`aclose`.
        """
        con = sqlite3.connect(
            self.path / _DB_NAME, timeout=1, isolation_level=None, check_same_thread=False
        )
        cast(Any, self._cache)._local = SimpleNamespace(pid=os.getpid(), con=con)
        for name, value in con.execute(_PRAGMAS).fetchall():
            self._cache.reset(name, value, update=False)
        self._pid = os.getpid()

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
            raise CacheUnavailable(f"{self.describe()} is unavailable: {exc}") from exc


def _count(value: object) -> int:
    return value if isinstance(value, int) else 0


def _make_private_dir(path: Path) -> None:
    """Create ``path`` (mode 0700) and its database file (mode 0600) before SQLite opens it."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.close(os.open(path / _DB_NAME, os.O_CREAT | os.O_RDWR, 0o600))
    if os.name != "posix":
        return
    for item, mode in [(path, 0o700), *((file, 0o600) for file in path.glob(_DB_NAME + "*"))]:
        try:
            info = item.stat()
        except FileNotFoundError:
            continue  # another process's SQLite removed its -wal/-shm file since the listing
        if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077:
            item.chmod(mode)
