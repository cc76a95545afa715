"""Single-flight: identical requests in flight at once share one upstream call.

The first request of a kind starts a :class:`Flight`: a background task that makes the upstream
call and reads it to the end, keeping every chunk. Each request, the first included, takes a
:class:`Seat` and reads the chunks from the start at its own pace, so a request that arrives late
still gets the whole answer, and one that leaves early does not disturb the others. When the last
seat is left before the answer is complete, the upstream call is cancelled (its stream reset).
Errors reach every seat as they happened: before the first chunk from :meth:`Seat.opened`, after
it from the chunk iterator, after the chunks that came before it. A flight takes seats only while
its call runs: an identical request that comes after the call ended waits until the cache is done
with it (:meth:`Flight.settled`) and looks the answer up in the store, so it is a cache hit or a
new ask, as the admission rule counts it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any, NoReturn

import anyio
from openai.types.chat import ChatCompletionChunk

from .._background import spawn

__all__ = ["Flight", "FlightCancelled", "Seat"]


class FlightCancelled(Exception):
    """Raised to a reader when the shared call was cancelled from outside (its event loop
    shutting down) before it had an answer."""


class Flight:
    """One upstream call and everything it has produced so far."""

    def __init__(
        self,
        key: str,
        *,
        stream: bool,
        on_end: Callable[[Flight], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.key = key
        self.stream = stream
        self.result: Any = None
        """What the upstream call returned: a chunk stream, or a completion."""
        self.error: BaseException | None = None
        self._error_tb: TracebackType | None = None
        self.chunks: list[ChatCompletionChunk] = []
        self.offsets: list[float] = []
        """Seconds from the start of the call to each chunk."""
        self.complete = False
        """The answer ended normally (a stream read to its end, a completion returned)."""
        self.ended = False
        self.joinable = True
        """Another identical request may take a seat: while the call runs, never after."""
        self.asks = 0
        """Requests that took a seat."""
        self.seats = 0
        self.finished = False
        """The cache is done with the flight: its answer is in the store now, or never will be
        (set by :meth:`finish` as the cache forgets the flight)."""
        self._finished = anyio.Event()
        self._opened = anyio.Event()
        self._changed = anyio.Event()
        self._scope = anyio.CancelScope()
        self._on_end = on_end
        self._clock = clock

    def start(self, call: Callable[[], Awaitable[Any]]) -> None:
        """Make the upstream call in a background task."""
        spawn(lambda: self._run(call), name=f"single-flight {self.key[-8:]}")

    def finish(self) -> None:
        """The cache is done with the flight (its answer stored, or never to be)."""
        self.finished = True
        self._finished.set()

    async def settled(self) -> None:
        """Wait until the cache is done with the flight (:meth:`finish`)."""
        await self._finished.wait()

    def seat(self) -> Seat:
        """A place for one more request."""
        return Seat(self)

    def _notify(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def _run(self, call: Callable[[], Awaitable[Any]]) -> None:
        started = self._clock()
        try:
            with self._scope:
                upstream = None
                try:
                    upstream = self.result = await call()
                    self._opened.set()
                    if self.stream:
                        async for chunk in upstream:
                            self.chunks.append(chunk)
                            self.offsets.append(self._clock() - started)
                            self._notify()
                    self.complete = True
                except Exception as exc:
                    self.error, self._error_tb = exc, exc.__traceback__
                finally:
                    if self.stream and upstream is not None:
                        with anyio.CancelScope(shield=True):
                            await upstream.close()
        finally:
            self.ended = True
            # An ask that comes after the answer's end waits for the cache to store it (or
            # not) and looks it up: reading the ended call instead would answer it from a
            # cache the admission rule never counted it for.
            self.joinable = False
            self._opened.set()
            self._notify()
        await self._on_end(self)

    def _raise(self) -> NoReturn:
        # Every reader raises the one error; each raise starts from the original traceback,
        # so the readers' frames do not pile up on it.
        assert self.error is not None
        raise self.error.with_traceback(self._error_tb)

    def _left(self) -> None:
        self.seats -= 1
        if self.seats == 0 and not self.ended:
            self.joinable = False
            self._scope.cancel()


class Seat:
    """One request's place in a flight."""

    def __init__(self, flight: Flight) -> None:
        self.flight = flight
        self._left = False
        flight.seats += 1
        flight.asks += 1

    async def opened(self) -> Any:
        """What the upstream call returned, once it has; its error if it failed first."""
        flight = self.flight
        await flight._opened.wait()
        if flight.result is None:
            self.leave()
            if flight.error is not None:
                flight._raise()
            raise FlightCancelled("the shared upstream call was cancelled before it answered")
        return flight.result

    async def chunks(self) -> AsyncIterator[ChatCompletionChunk]:
        """Every chunk of the answer from the first, as they arrive; then its end or error."""
        flight = self.flight
        index = 0
        try:
            while True:
                if index < len(flight.chunks):
                    index += 1
                    yield flight.chunks[index - 1]
                elif flight.ended:
                    if flight.error is not None:
                        flight._raise()
                    return
                else:
                    await flight._changed.wait()
        finally:
            self.leave()

    def leave(self) -> None:
        """This request no longer reads; the last one to leave an unfinished call cancels it."""
        if not self._left:
            self._left = True
            self.flight._left()
