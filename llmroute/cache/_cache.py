"""The response cache: look answers up, replay them, share identical calls, store popular ones.

:class:`ResponseCache` sits between the client and a store (memory, disk or Redis). It never
lets the cache break a request: a store that cannot be reached is skipped for a while (one
warning), a damaged entry is a miss (logged once, and removed), and only complete answers are
stored: an error, an interrupted stream or an answer without its finish_reason never is.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response

from .._background import spawn
from .._sizes import format_size
from ._entry import CacheEntry, CorruptEntry
from ._flight import Flight, Seat
from ._stores import CacheStore, CacheUnavailable, StoreStats

__all__ = ["CacheRequest", "Hit", "ResponseCache"]

log = logging.getLogger("llmroute")

_RETRY_STORE_AFTER = 5.0
_STATS_FLUSH_EVERY = 1.0
_MAX_REPORTED = 1024
_DRAIN_AT_CLOSE = 5.0  # seconds aclose waits for answers being stored
_DECODED_BYTES = 8 * 1024 * 1024  # stored bytes whose decoded entries are kept for the next hit
_SETTLE_ROUNDS = 4  # identical calls ending one after another that a missed lookup waits for


@dataclass(frozen=True, slots=True)
class CacheRequest:
    """What the cache may do for one request."""

    key: str
    stream: bool
    include_usage: bool
    read: bool
    """Answer from a stored entry when there is one."""
    write: bool
    """Store the answer once it is popular."""
    share: bool
    """Join an identical request in flight (single-flight)."""
    paced: bool = False
    """Replay at the recorded rhythm instead of at once."""
    kind: str = "chat"
    """The API: ``"chat"`` or ``"responses"`` (its events and ``Response``)."""


class ResponseCache:
    """Answers by request key over a :class:`~llmroute.cache.CacheStore`."""

    def __init__(
        self,
        store: CacheStore,
        *,
        ttl: float,
        min_hits: int,
        window: float,
        max_entry_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.ttl = ttl
        self.min_hits = min_hits
        self.window = window
        self.max_entry_bytes = max_entry_bytes
        self._clock = clock
        self._flights: dict[tuple[str, bool, bool], Flight] = {}
        self._down_until: float | None = None
        self._hits = self._misses = 0
        self._flushed_at = clock()
        # One flush at a time: stats() waits for a background flush that holds the counters
        # taken from _hits/_misses but has not added them to the store yet.
        self._flushing = anyio.Lock()
        self._reported: set[str] = set()
        self._storing = 0  # answers whose store call is under way
        self._stored: anyio.Event | None = None  # set when _storing drops to 0 (for aclose)
        # The last entries decoded, with the bytes they came from: a hit on popular bytes that
        # have not changed skips parsing and checking the whole answer before its first chunk.
        self._decoded: OrderedDict[str, tuple[bytes, CacheEntry]] = OrderedDict()
        self._decoded_bytes = 0

    # -- store access that never fails a request -------------------------------------------

    def _usable(self) -> bool:
        """Whether to use the store now. While it is down, one caller every few seconds
        probes it and the others go without (so a dead server slows one request, not all)."""
        if self._down_until is None:
            return True
        now = self._clock()
        if now < self._down_until:
            return False
        self._down_until = now + _RETRY_STORE_AFTER
        return True

    def _unavailable(self, exc: BaseException) -> None:
        level = logging.DEBUG if self._down_until is not None else logging.WARNING
        self._down_until = self._clock() + _RETRY_STORE_AFTER
        log.log(
            level,
            "cache: %s; requests go upstream without the cache (retrying in %.0f s)",
            exc,
            _RETRY_STORE_AFTER,
        )

    def _recovered(self) -> None:
        if self._down_until is not None:
            log.info("cache: the %s store answers again", self.store.kind)
            self._down_until = None

    async def lookup(self, request: CacheRequest) -> Hit | None:
        """The stored answer for ``request``, ready to replay, if a valid one can serve it."""
        if not self._usable():
            return None
        try:
            raw = await self.store.get(request.key)
        except CacheUnavailable as exc:
            self._unavailable(exc)
            return None
        self._recovered()
        hit = None
        if raw is not None:
            try:
                hit = _prepare(self._decode(raw, request.key), request)
            except CorruptEntry as exc:
                self._report_corrupt(request.key, exc)
                await self._delete(request.key)
        if hit is not None:
            self._hits += 1
        else:
            self._misses += 1
        self._maybe_flush()
        return hit

    def _decode(self, raw: bytes, key: str) -> CacheEntry:
        decoded = self._decoded
        memo = decoded.get(key)
        if memo is not None:
            if memo[0] is raw or memo[0] == raw:
                decoded.move_to_end(key)
                return memo[1]
            del decoded[key]
            self._decoded_bytes -= len(memo[0])
        entry = CacheEntry.decode(raw, key)
        if len(raw) <= _DECODED_BYTES // 8:
            decoded[key] = (raw, entry)
            self._decoded_bytes += len(raw)
            while self._decoded_bytes > _DECODED_BYTES:
                _, (old, _) = decoded.popitem(last=False)
                self._decoded_bytes -= len(old)
        return entry

    def _report_corrupt(self, key: str, exc: CorruptEntry) -> None:
        if key in self._reported:
            return
        if len(self._reported) < _MAX_REPORTED:
            self._reported.add(key)
        log.warning(
            "cache: ignoring a damaged entry (%s) in the %s store: %s",
            key[-12:],
            self.store.kind,
            exc,
        )

    async def _delete(self, key: str) -> None:
        try:
            await self.store.delete(key)
        except CacheUnavailable as exc:
            self._unavailable(exc)

    def _maybe_flush(self) -> None:
        if self._clock() - self._flushed_at >= _STATS_FLUSH_EVERY:
            self._flushed_at = self._clock()
            spawn(self.flush_stats, name="cache stats")

    async def flush_stats(self) -> None:
        """Add the lookups counted since the last flush to the store's hit and miss counters
        (after any flush under way has added its own)."""
        async with self._flushing:
            hits, misses = self._hits, self._misses
            if not (hits or misses) or not self._usable():
                return
            self._hits = self._misses = 0
            try:
                await self.store.add_stats(hits=hits, misses=misses)
            except CacheUnavailable as exc:
                self._unavailable(exc)

    # -- single-flight ---------------------------------------------------------------------

    def pending(self, request: CacheRequest) -> Flight | None:
        """The identical call the cache knows of now: under way (a request joins it), or ended
        and being stored (a request waits for it: :meth:`after_miss`)."""
        if not request.share:
            return None
        return self._flights.get((request.key, request.stream, request.include_usage))

    async def after_miss(self, request: CacheRequest, seen: Flight | None) -> Hit | None:
        """Look ``request`` up again where its lookup may have missed too soon.

        ``seen`` is the identical call that was pending before that lookup. An identical call
        that has ended is waited for until the cache is done with it (its answer stored, or
        not: a few store calls), then the store is asked again; so is the store when ``seen``
        was stored in the meantime. A request after an ended call is then a cache hit (the
        answer was popular) or a new ask (it was not), counted as every ask is; it never
        reads the ended call itself.
        """
        for _ in range(_SETTLE_ROUNDS):
            flight = self.pending(request)
            if flight is not None and flight.ended:
                await flight.settled()
            elif seen is None or not seen.finished:
                return None
            seen = None
            hit = await self.lookup(request)
            if hit is not None:
                return hit
        return None

    def join(
        self, request: CacheRequest, call: Callable[[], Awaitable[object]]
    ) -> tuple[Seat, bool]:
        """A seat on the flight for ``request``: an identical one in flight, or a new one.

        Returns the seat and whether this request started the flight (``call`` makes the
        upstream call; only the first request's is used). Only requests that agree on stream
        and usage share a flight: each gets exactly the answer a live call would give it.
        """
        ident = (request.key, request.stream, request.include_usage)
        flight = self._flights.get(ident) if request.share else None
        if flight is not None and flight.joinable:
            return flight.seat(), False

        async def ended(done: Flight) -> None:
            # Counted before the first await: a caller who got the answer and closes the
            # cache at once still finds this store under way, and aclose waits for it.
            self._storing += 1
            try:
                await self._store(request, done)
            finally:
                self._storing -= 1
                if not self._storing and self._stored is not None:
                    self._stored.set()
                if self._flights.get(ident) is done:
                    del self._flights[ident]
                done.finish()

        flight = Flight(request.key, stream=request.stream, on_end=ended, clock=self._clock)
        if request.share:
            self._flights[ident] = flight
        seat = flight.seat()
        flight.start(call)
        return seat, True

    async def _store(self, request: CacheRequest, flight: Flight) -> None:
        if not (request.write and flight.complete and self._usable()):
            return
        entry = _entry_of(request.key, flight, request.kind)
        if entry is None:
            return
        data = entry.encode()
        if len(data) > self.max_entry_bytes:
            log.debug("cache: an answer of %s is over max_entry_bytes", format_size(len(data)))
            return
        try:
            asks = await self.store.hit(request.key, window=self.window)
            if max(asks, flight.asks) >= self.min_hits:
                await self.store.set(request.key, data, ttl=self.ttl)
        except CacheUnavailable as exc:
            self._unavailable(exc)

    # -- replay ----------------------------------------------------------------------------

    async def replay(self, hit: Hit, request: CacheRequest) -> AsyncIterator[ChatCompletionChunk]:
        """A hit's chunks, at once or at their recorded rhythm."""
        started = self._clock()
        first: float | None = None
        for offset, chunk in hit.chunks or ():
            if request.paced:
                first = offset if first is None else first
                delay = (offset - first) - (self._clock() - started)
                if delay > 0:
                    await anyio.sleep(delay)
            yield chunk

    # -- the CLI's view --------------------------------------------------------------------

    async def stats(self) -> StoreStats:
        """Entries, bytes, hits and misses of the store (this process's lookups flushed first)."""
        await self.flush_stats()
        return await self.store.stats()

    async def clear(self) -> int:
        """Remove every entry; returns how many there were."""
        return await self.store.clear()

    async def aclose(self) -> None:
        """Wait (a few seconds at most) for answers being stored, flush the counters, close.

        A short-lived process (a CLI, a cron job) that asks, gets its answer and exits still
        counts its ask and stores a popular answer for the next process.
        """
        with anyio.move_on_after(_DRAIN_AT_CLOSE):
            while self._storing:
                self._stored = anyio.Event()
                await self._stored.wait()
        await self.flush_stats()
        await self.store.aclose()


@dataclass(frozen=True, slots=True)
class Hit:
    """A stored answer, rebuilt as the objects the request gets."""

    entry: CacheEntry
    chunks: Iterator[tuple[float, ChatCompletionChunk]] | None = None
    """For a streamed request: each chunk with its recorded offset in seconds."""
    completion: Any = None
    """A ``ChatCompletion`` or a Responses API ``Response``."""


def _prepare(entry: CacheEntry, request: CacheRequest) -> Hit | None:
    """The replay of ``entry`` for ``request``; ``None`` if it lacks the usage the request
    needs. Anything that cannot be rebuilt raises :class:`CorruptEntry`."""
    if entry.kind != request.kind:
        raise CorruptEntry(f"a {entry.kind} answer stored under a {request.kind} request's key")
    needs_usage = request.include_usage if request.stream else entry.chunks is not None
    if needs_usage and not entry.has_usage:
        return None  # asked with usage, stored without: the live answer will replace it
    if request.stream and not entry.streams:
        return None  # no events to replay: the live stream's will replace it
    try:
        if request.stream:
            # The first chunk now (a damaged entry fails here, as a miss); the rest as they are
            # read, so a long answer's first chunk does not wait for all of them.
            chunks = entry.replay_chunks(include_usage=request.include_usage)
            first = next(chunks)
            return Hit(entry, chunks=itertools.chain([first], chunks))
        return Hit(entry, completion=entry.replay_completion())
    except CorruptEntry:
        raise
    except Exception as exc:
        raise CorruptEntry(f"cannot be replayed ({type(exc).__name__}: {exc})") from None


def _entry_of(key: str, flight: Flight, kind: str = "chat") -> CacheEntry | None:
    """The entry for a complete flight, or ``None`` if its answer is not a finished one."""
    origin = _origin(flight.result)
    if kind == "responses":
        if flight.stream:
            if not any(getattr(e, "type", None) == "response.completed" for e in flight.chunks):
                return None  # incomplete, failed or cut short: never stored
            return CacheEntry.from_chunks(key, flight.chunks, flight.offsets, origin, kind)
        result = flight.result
        if not isinstance(result, Response) or result.status != "completed":
            return None
        return CacheEntry.from_completion(key, result, origin, kind)
    if flight.stream:
        if not flight.chunks or not _finished(flight.chunks):
            return None
        if not _counted_by_vendors(flight.result):
            return None  # continued on llmroute's own count: its length may be off
        return CacheEntry.from_chunks(key, flight.chunks, flight.offsets, origin)
    completion = flight.result
    if not isinstance(completion, ChatCompletion) or not completion.choices:
        return None
    if any(choice.finish_reason is None for choice in completion.choices):
        return None
    return CacheEntry.from_completion(key, completion, origin)


def _finished(chunks: list[ChatCompletionChunk]) -> bool:
    """Whether every choice of a stream got its finish_reason."""
    open_choices: set[int] = set()
    done: set[int] = set()
    for chunk in chunks:
        for choice in chunk.choices:
            open_choices.add(choice.index)
            if choice.finish_reason is not None:
                done.add(choice.index)
    return bool(open_choices) and open_choices == done


def _counted_by_vendors(result: object) -> bool:
    """Whether every attempt that broke mid-answer was counted by its vendor's usage: an
    answer continued (or ended at the caller's limit) on llmroute's own count, one token per
    delta, may be longer than ``max_tokens`` asked, and is not stored to be replayed."""
    route = getattr(result, "route", None)
    attempts = getattr(route, "attempts", None) or ()
    return all(
        getattr(a, "tokens_counted", "usage") == "usage"
        for a in attempts
        if getattr(a, "outcome", None) == "interrupted"
    )


def _origin(result: object) -> str | None:
    route = getattr(result, "route", None)
    return getattr(route, "winner", None)
