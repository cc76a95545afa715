"""Reading one streamed answer: the body's bytes in, its chunks out the moment they are decoded.

Every path that reads a stream feeds its bytes to a :class:`StreamReader`: the routing engine
up to an attempt's first token and the answer after it (:mod:`llmroute.routing.answer`), the
stream of a model name that is not a route (``llmroute.AsyncStream``), the sync client's direct
stream. Each does its own waiting (deadlines, a sync or an async read); the reader decodes with
the protocol's decoder, keeps the stream's timings (first byte, first token, token chunks) and
says whether the answer ended whole. A stream that ended before that raises
:func:`~llmroute._errors.stream_ended` (or, where the caller has the text so far,
:func:`~llmroute._errors.stream_ended_with_text`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .._types import Timings
from .openai import ChatStreamDecoder

__all__ = ["StreamReader"]


class StreamReader:
    """One stream's decoder and timings, fed the body's bytes as they arrive.

    ``counting``: the reader keeps ``timings.tokens`` (and ``first_token``, when the first
    token chunk is decoded) from the decoder's count; off where the caller counts the chunks it
    passes on itself (a routed answer after its first token).
    """

    __slots__ = ("_clock", "counting", "decoder", "ended", "timings")

    def __init__(
        self,
        decoder: ChatStreamDecoder,
        timings: Timings,
        *,
        counting: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.decoder = decoder
        self.timings = timings
        self.counting = counting
        self.ended = False
        """The body ended (the reader was fed ``None``)."""
        self._clock = clock

    def feed(self, data: bytes | None) -> list[Any]:
        """The chunks ``data`` completes, in order (``None``: the body ended); raises what the
        decoder raises (a vendor's error event, data that is not an event stream)."""
        if data is None:
            self.ended = True
            chunks = self.decoder.close()
        else:
            timings = self.timings
            if timings.first_byte is None:
                timings.first_byte = self._clock() - timings.started_at
            chunks = self.decoder.feed(data)
        if self.counting:
            tokens, timings = self.decoder.tokens, self.timings
            if tokens != timings.tokens:
                if timings.first_token is None:
                    timings.first_token = self._clock() - timings.started_at
                timings.tokens = tokens
        return chunks

    @property
    def done(self) -> bool:
        """Nothing more will be decoded: ``[DONE]`` (or an end event) arrived, or the decoder
        raised."""
        return self.decoder.done

    @property
    def answering(self) -> bool:
        """The answer has begun: a token chunk was decoded, or it ended (an empty answer)."""
        decoder = self.decoder
        return bool(decoder.tokens) or decoder.done or decoder.finished

    @property
    def complete(self) -> bool:
        """The answer is whole, if reading raised nothing: ``[DONE]``, or every choice's
        ``finish_reason`` even where the connection broke before ``[DONE]``."""
        return self.decoder.done or self.decoder.finished
