"""One streamed answer on the wire, for both of the simulator's wire modes (OpenAI's chat
completions and Responses, Anthropic's Messages): the response's head, the wait for the first
token (a hold, the TTFT, a hang), the answer's pieces paced by the profile, the stream fault (and,
in the OpenAI mode, the tail fault) at its piece, and the closing events. Every frame a ``_Wire``
gives is one ``http.response.body`` message: one HTTP/2 DATA frame.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import llmroute.testing._reply as _reply

from ._answer import _Wire
from ._profile import Profile
from ._wire import STREAM_FAULTS, TAIL_FAULTS, Fault, Send, open_event_stream, pace, pause

__all__ = ["StreamMode", "Tally", "stream_answer"]


class Tally(Protocol):
    """The counters a stream updates (``streams_started``, ``streams_completed``,
    ``tokens_streamed``; ``streams_cancelled`` through ``ended_early``)."""

    def count(self, key: str, step: int = 1) -> None: ...
    def ended_early(self) -> None: ...


@dataclass(frozen=True)
class StreamMode:
    """What a wire mode's streams do that the other's do not."""

    id_header: bytes
    """The response header that carries the request id."""
    tail_faults: bool = False
    """Whether ``truncate``, ``loris`` and ``oversized`` apply (the OpenAI mode's faults)."""
    count_tokens: bool = False
    """Whether the pieces sent are counted in ``tokens_streamed``."""
    frame_per_event: bool = False
    """Whether ``Profile.frame_per_event`` splits the closing frames into one frame an event."""


Hold = Callable[[asyncio.Event], Awaitable[bool]]
"""Wait before the first token (``Profile.hold_first_token``); True when the client left."""


async def stream_answer(
    wire: _Wire,
    pieces: list[str],
    fault: Fault,
    ttft: float,
    gone: asyncio.Event,
    send: Send,
    rid: str,
    *,
    mode: StreamMode,
    tally: Tally,
    profile: Callable[[], Profile],
    hold: Hold | None = None,
) -> None:
    """Stream the answer of ``pieces`` through ``wire`` after ``ttft`` seconds, with ``fault``.
    ``profile()`` is read at each step (a profile changed mid-stream applies at once)."""
    run = _StreamRun(wire, fault, gone, send, mode, tally, profile)
    await open_event_stream(send, rid, mode.id_header)
    tally.count("streams_started")
    if not await run.first_token(ttft, hold):
        return
    if not await run.pieces(pieces):
        return
    await run.close()


@dataclass
class _StreamRun:
    wire: _Wire
    fault: Fault
    gone: asyncio.Event
    send: Send
    mode: StreamMode
    tally: Tally
    profile: Callable[[], Profile]

    async def emit(self, data: bytes) -> None:
        await self.send({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self, data: bytes) -> None:
        await self.send({"type": "http.response.body", "body": data})

    async def first_token(self, ttft: float, hold: Hold | None) -> bool:
        """The opening events, the wait for the first token and the first events; False when
        the stream ends there (the client left, or a hang's bound passed)."""
        for frame in self.wire.opening():
            await self.emit(frame)
        if self.profile().hold_first_token and hold is not None and await hold(self.gone):
            return self.ended_early()
        if await pause(ttft, self.gone):
            return self.ended_early()
        if self.fault.kind == "hang":
            if await pause(self.profile().hang_max, self.gone):
                return self.ended_early()
            return False  # hang bound passed: the stream breaks (h2 reset, h1 close)
        for frame in self.wire.first():
            await self.emit(frame)
        return True

    async def pieces(self, pieces: list[str]) -> bool:
        """The answer's pieces, a fault at its piece; False when the stream ends early."""
        tokens, size = len(pieces), self.profile().tokens_per_chunk
        per, pieces = max(1, size), _reply.group(pieces, size)
        for i in range(len(pieces) + 1):
            if i == min(self.fault.after, len(pieces)):
                go_on = await self.at_fault()
                if go_on is not None:
                    return go_on
            if i == len(pieces):
                break
            if await pace(i, self.fault, self.profile().inter_token, self.gone):
                return self.ended_early()
            await self.emit(self.wire.piece(pieces[i]))
            if self.mode.count_tokens:
                self.tally.count("tokens_streamed", min(per, tokens - i * per))
        return True

    async def at_fault(self) -> bool | None:
        """The fault due at this piece, done; False when the stream ends with it, None when it
        goes on."""
        kind, wire = self.fault.kind, self.wire
        if self.mode.tail_faults and kind in TAIL_FAULTS:
            if kind == "truncate":  # a clean end, without the answer's end events
                await self.end(b"")
                return False
            if kind == "oversized":
                await _oversized(self.emit, int(self.fault.amount))
            elif await self.trickle(wire.piece("slow")):
                return self.ended_early()
            else:
                return False  # the hang bound passed: the stream breaks
        if kind in STREAM_FAULTS:
            if kind == "drop":
                return False  # no end of stream: the server resets it / closes
            if kind == "stream-error":
                await self.end(wire.error())
                return False
            await self.emit(wire.malformed())
        return None

    async def close(self) -> None:
        closing = self.wire.closing()
        if self.mode.frame_per_event and self.profile().frame_per_event:
            # each event in a frame of its own, the last ones too
            closing = [e + b"\n\n" for part in closing for e in part.split(b"\n\n") if e]
        if self.gone.is_set():
            self.ended_early()
            return
        self.tally.count("streams_completed")  # counted first: the client may look at once
        for frame in closing[:-1]:
            await self.emit(frame)
        await self.end(closing[-1])

    def ended_early(self) -> bool:
        self.tally.ended_early()
        return False

    async def trickle(self, event: bytes) -> bool:
        """Send ``event`` one byte every ``Fault.amount`` seconds, never its end (a slow loris),
        until the client goes away (True) or ``Profile.hang_max`` passes (False)."""
        deadline = time.monotonic() + self.profile().hang_max
        for i in itertools.count():
            if time.monotonic() >= deadline:
                return False
            await self.emit(event[i % (len(event) - 2) : i % (len(event) - 2) + 1])
            if await pause(self.fault.amount, self.gone):
                return True
        return False  # pragma: no cover - the loop only ends by returning


async def _oversized(emit: Callable[[bytes], Awaitable[None]], size: int) -> None:
    """One ``data:`` event of ``size`` bytes (valid JSON), sent in 64 KiB pieces."""
    await emit(b'data: {"padding": "')
    piece = b"x" * 65536
    left = max(0, size - 20)
    while left > 0:
        await emit(piece[:left])
        left -= len(piece)
    await emit(b'"}\n\n')
