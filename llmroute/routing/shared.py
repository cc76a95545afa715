"""Stats shared by a fleet: each instance publishes its recorded samples and applies the others'.

Prediction stays local and in process. In the background, :class:`StatsSync` drains the local
:class:`~llmroute.routing.stats.LiveStats` journal, hands the events to a :class:`StatsBackend`
in a worker thread, and records what the other instances published. :class:`RedisStatsBackend`
keeps one Redis Stream, ``{prefix}:ttft-samples``, with one entry per exchange:
``{"i": instance id, "e": JSON list of events}``.

Exceptions::

    StatsBackendUnavailable   the store cannot be reached; the stats keep working locally
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Collection
from typing import Any, Protocol, cast

import anyio
import anyio.to_thread

from .._background import spawn
from .._redis import RedisConnection
from .stats import LiveStats, SampleEvent

__all__ = ["RedisStatsBackend", "StatsBackend", "StatsBackendUnavailable", "StatsSync"]

logger = logging.getLogger("llmroute.routing.shared")


class StatsBackendUnavailable(Exception):
    """Raised when the shared stats store cannot be reached."""


class StatsBackend(Protocol):
    """Where instances exchange samples. Called from a worker thread, one call at a time."""

    def exchange(self, outgoing: list[SampleEvent]) -> list[SampleEvent]:
        """Publish ``outgoing``; return the events other instances published since the last
        call. Raises :class:`StatsBackendUnavailable` when the store cannot be reached."""
        ...

    def close(self) -> None:
        """Release connections; the backend is not used again."""
        ...

    def describe(self) -> str:
        """Where the samples go, for logs: never a password."""
        ...


class RedisStatsBackend:
    """A :class:`StatsBackend` on one Redis Stream, ``{prefix}:ttft-samples``, trimmed to about
    ``maxlen`` entries.

    Each :meth:`exchange` is one round trip: XADD of our events (when there are any), then a
    non-blocking XREAD of at most ``batch`` entries after the last one seen; the first reads the
    last ``history`` seconds, so a new instance warms up from the fleet. Entries this instance
    wrote are skipped, as are malformed ones (counted in :attr:`malformed`).
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "llmroute",
        instance: str | None = None,
        timeout: float = 0.25,
        history: float = 300.0,
        maxlen: int = 20_000,
        batch: int = 1000,
    ) -> None:
        self._redis = RedisConnection(url, timeout=timeout, purpose="shared stats on Redis")
        self._client = self._redis.client
        self.instance = instance if instance is not None else uuid.uuid4().hex[:12]
        self.key = f"{prefix}:ttft-samples"
        self.malformed = 0
        """Stream entries skipped because they could not be read."""
        self._url = self._redis.url
        self._history = history
        self._maxlen = maxlen
        self._batch = batch
        self._expire = math.ceil(max(history, 60.0) * 2)
        self._last_id: bytes | str | None = None

    def describe(self) -> str:
        """The redacted URL, stream key and instance id."""
        return f"redis {self._url} stream {self.key!r} as {self.instance}"

    def exchange(self, outgoing: list[SampleEvent]) -> list[SampleEvent]:
        """Publish ``outgoing`` and read the other instances' events since the last call."""
        last = self._last_id
        if last is None:
            last = f"{max(0, int((time.time() - self._history) * 1000))}-0"
        try:
            with self._client.pipeline(transaction=False) as pipe:
                if outgoing:
                    events = json.dumps(outgoing, separators=(",", ":"))
                    entry: dict[Any, Any] = {"i": self.instance, "e": events}
                    pipe.xadd(self.key, entry, maxlen=self._maxlen, approximate=True)
                    pipe.expire(self.key, self._expire)
                pipe.xread({self.key: last}, count=self._batch)
                replies = pipe.execute()
        except self._redis.errors as exc:
            message = f"{self.describe()}: {self._redis.reason(exc)}"
            raise StatsBackendUnavailable(message) from exc
        self._last_id = last
        return self._incoming(replies[-1])

    def _incoming(self, reply: Any) -> list[SampleEvent]:
        if isinstance(reply, dict):  # RESP3: {key: [entries]}
            batches = [value[0] for value in cast(dict[Any, Any], reply).values()]
        else:  # RESP2: [[key, entries]]
            batches = [entries for _key, entries in cast(list[Any], reply or [])]
        incoming: list[SampleEvent] = []
        me = self.instance.encode()
        for entries in batches:
            for entry_id, fields in entries:
                self._last_id = entry_id
                try:
                    if fields.get(b"i") == me:
                        continue
                    events = json.loads(fields[b"e"])
                    if not isinstance(events, list) or not all(
                        isinstance(event, list) for event in cast(list[Any], events)
                    ):
                        raise ValueError("not a list of events")
                    incoming.extend(cast(list[SampleEvent], events))
                except (AttributeError, KeyError, TypeError, ValueError) as exc:
                    self.malformed += 1
                    logger.log(
                        logging.WARNING if self.malformed == 1 else logging.DEBUG,
                        "skipping a malformed shared-stats entry %s in %s (%s: %s)",
                        entry_id,
                        self.key,
                        type(exc).__name__,
                        exc,
                    )
        return incoming

    def close(self) -> None:
        """Close the connections."""
        self._redis.close()


class StatsSync:
    """Exchanges ``stats``' samples with the fleet through ``backend``, every ``interval``
    seconds at most.

    Call ``if sync.due(): spawn(sync.sync())`` after requests, and ``await sync.refresh(wait)``
    before routing on the stats: an instance that never read the fleet's samples, or not within
    ``interval``, reads them first. While the backend is unavailable the stats keep working
    locally; the drained events are kept (the newest ``max_pending`` of them, the rest dropped
    and counted) for the next exchange, tried after ``interval * 5``. Incoming events for
    targets outside ``targets`` (when given) are skipped.
    """

    def __init__(
        self,
        stats: LiveStats,
        backend: StatsBackend,
        *,
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        max_pending: int = 10_000,
        targets: Collection[str] | None = None,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be positive, got {interval!r}")
        self.stats = stats
        self.backend = backend
        self.interval = interval
        self.sent = 0
        """Events published."""
        self.received = 0
        """Events recorded from other instances."""
        self.dropped = 0
        """Events drained but never published: beyond ``max_pending`` while unavailable."""
        self._clock = clock
        self._max_pending = max_pending
        self._targets = targets
        self._pending: list[SampleEvent] = []
        self._next_at = -math.inf
        self._synced_at: float | None = None
        self._running = False
        self._failing = False
        self._closed = False
        self._idle: anyio.Event | None = None

    @property
    def available(self) -> bool:
        """Whether the last exchange succeeded (or none was tried yet)."""
        return not self._failing

    def due(self) -> bool:
        """Whether a sync should start now: the interval (or the back-off) has passed and none
        is running."""
        return not self._running and not self._closed and self._clock() >= self._next_at

    def stale(self) -> bool:
        """Whether the view of the fleet's samples is older than ``interval`` (or was never
        read) and could be refreshed now: not closed, not backing off after a failure."""
        now = self._clock()
        if self._closed or (self._failing and now < self._next_at):
            return False
        return self._synced_at is None or now - self._synced_at >= self.interval

    async def refresh(self, wait: float | None) -> bool:
        """Bring a :meth:`stale` view up to date before routing on it: start an exchange (or
        join the one running) and wait for it, at most ``wait`` seconds (``None``: until it
        ends; the backend's own timeouts bound it). An exchange that takes longer goes on in
        the background. Returns whether the view is fresh now; never raises an error."""
        if not self.stale():
            return True
        if not self._running:
            self._begin()
            spawn(self._exchange, name="stats sync")
        idle = self._idle
        if idle is not None:
            with anyio.move_on_after(math.inf if wait is None else wait):
                await idle.wait()
        return not self._running and not self._failing

    async def sync(self) -> None:
        """One exchange: publish the local samples, record the fleet's. Never raises an error;
        a second call while one runs returns at once."""
        if self._running or self._closed:
            return
        self._begin()
        await self._exchange()

    def _begin(self) -> None:
        self._running = True
        self._idle = anyio.Event()

    async def _exchange(self) -> None:
        try:
            outgoing = self._pending + self.stats.drain()
            self._pending = []
            try:
                incoming = await anyio.to_thread.run_sync(self.backend.exchange, outgoing)
            except Exception as exc:
                self._failed(exc, outgoing)
                return
            self.sent += len(outgoing)
            try:
                self.received += self.stats.apply(incoming, self._targets)
            except Exception as exc:  # a backend that broke its contract
                logger.warning("could not apply shared stats: %r", exc)
            if self._failing:
                self._failing = False
                logger.info("shared stats are back: %s", self.backend.describe())
            self._synced_at = self._clock()
            self._next_at = self._synced_at + self.interval
        finally:
            self._running = False
            if self._idle is not None:
                self._idle.set()

    def _failed(self, exc: Exception, outgoing: list[SampleEvent]) -> None:
        keep = outgoing[-self._max_pending :] if self._max_pending > 0 else []
        self.dropped += len(outgoing) - len(keep)
        self._pending = keep
        self._next_at = self._clock() + self.interval * 5
        level = logging.DEBUG if self._failing else logging.WARNING
        self._failing = True
        reason = str(exc) if isinstance(exc, StatsBackendUnavailable) else repr(exc)
        logger.log(
            level,
            "shared stats unavailable, working locally (retry in %.3g s): %s",
            self.interval * 5,
            reason,
        )

    async def aclose(self) -> None:
        """Wait for a running exchange, then close the backend. Events not yet published are
        dropped."""
        if self._closed:
            return
        self._closed = True
        if self._running and self._idle is not None:
            await self._idle.wait()
        await anyio.to_thread.run_sync(self.backend.close)
