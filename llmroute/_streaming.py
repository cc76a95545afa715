"""The streams a streaming chat call returns: subclasses of openai's ``AsyncStream`` and
``Stream`` with llmroute's own decoding, their timings and route report."""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar

import httpx
import openai
from openai.types.chat import ChatCompletionChunk

from ._errors import (
    APIConnectionError,
    APIError,
    StreamInterrupted,
    map_transport_errors,
    stream_ended_with_text,
)
from ._types import RouteReport, Timings
from .protocols.openai import ChatStreamDecoder, is_output, is_preamble_chunk
from .protocols.reader import StreamReader
from .routing.engine import RoutedStream
from .transport import body_receiver, response_timings

__all__ = ["CALL_STARTED", "AsyncStream", "broke"]

_T = TypeVar("_T")
RetryHook = Callable[[int, Exception], Awaitable["tuple[httpx.Response, Timings] | None"]]
EndHook = Callable[["AsyncStream[Any]", "BaseException | None", bool], None]
"""Called once when a stream ends: with the exception it ended with (``None`` when it was read
to its end or closed) and whether the answer was complete."""

CALL_STARTED: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "llmroute_call_started", default=None
)
"""When the call being made in this context began (the monotonic clock): a stream that openai's
machinery builds measures its timings from there."""


def broke(
    exc: APIConnectionError, request: httpx.Request, timings: Timings, decoder: ChatStreamDecoder
) -> StreamInterrupted:
    """The error of a stream whose connection failed after tokens were yielded."""
    return StreamInterrupted(
        f"The stream broke after {timings.tokens} tokens: {exc.message}",
        request,
        partial_text=decoder.text,
        cause=exc.__cause__ or exc,
    )


class AsyncStream(openai.AsyncStream[_T]):
    """Chunks of one streamed answer, yielded the moment each SSE event is decoded.

    An ``openai.AsyncStream`` (``isinstance`` holds), decoded by llmroute's own fast path.

    Iterate it with ``async for``; leave early with ``close()`` or an ``async with`` block: the
    underlying HTTP/2 stream is reset at once and the connection stays open. After a bare
    ``break`` the reset happens when the stream object is garbage-collected (at once in CPython
    when the last reference goes, through the event loop's async-generator finalizer); a stream
    dropped without ever being read is reset with its connection's next request or read.

    A failure before the first token (a dropped connection, a read timeout, a stream that ends
    empty) is retried like openai retries a request, within ``max_retries``; the caller sees one
    seamless stream. A stream never ends quietly with a truncated answer: if it breaks after
    tokens were yielded, or the server ends it before ``[DONE]`` or a ``finish_reason``,
    iteration raises :class:`~llmroute.StreamInterrupted` with the partial text.
    """

    response: httpx.Response  # pyright: ignore[reportIncompatibleVariableOverride]
    timings: Timings
    route: RouteReport | None
    """How a routed request was served (winner, attempts, hedges, continuations); ``None``
    for a model name that is not a route."""

    def __init__(
        self,
        *,
        cast_to: Any = ChatCompletionChunk,
        response: httpx.Response,
        client: Any = None,
        options: Any = None,
        timings: Timings | None = None,
    ) -> None:
        # As openai's machinery builds it, for a chat call that is not routed.
        self.response = response
        self._cast_to = cast_to
        self._client = client
        self._options = options
        self.timings = timings or response_timings(response, CALL_STARTED.get())
        request = response.request
        target = request.url.host
        self._new_decoder = lambda: ChatStreamDecoder(request=request, target=target)
        self._retry: RetryHook | None = None
        self.route = None
        self._routed: RoutedStream | None = None
        self._on_close: Callable[[], object] | None = None
        self._chat_decoder: ChatStreamDecoder | None = None
        self._complete = False
        self._closed = False
        self._on_end: EndHook | None = None
        self._iterator = self._iter_chunks()

    @classmethod
    def _from_route(cls, routed: RoutedStream) -> AsyncStream[_T]:
        """A stream over a routed request (the engine has its first token already)."""
        self = cls.__new__(cls)
        self._cast_to, self._client, self._options = ChatCompletionChunk, None, None
        self.response = routed.response
        self.timings = routed.timings
        self.route = routed.report
        self._routed = routed
        self._on_close = None
        self._retry = None
        self._chat_decoder = None
        self._complete = False
        self._closed = False
        self._on_end = None

        def switch(response: httpx.Response) -> None:
            self.response = response

        self._iterator = routed.chunks(switch)
        return self

    @classmethod
    def _from_chunks(
        cls,
        chunks: AsyncIterator[ChatCompletionChunk],
        *,
        response: httpx.Response,
        timings: Timings,
        route: RouteReport | None,
        on_close: Callable[[], object] | None = None,
        measure: bool = True,
        complete: Callable[[], bool] = lambda: True,
    ) -> AsyncStream[_T]:
        """A stream over chunks that come from elsewhere: a cache replay or a shared call.

        When ``chunks`` ends, ``complete()`` says whether the answer was whole (if not, the
        reader gets :class:`StreamInterrupted`); with ``measure`` this stream's timings are
        filled in as the chunks are read.
        """
        self = cls.__new__(cls)
        self._cast_to, self._client, self._options = ChatCompletionChunk, None, None
        self.response, self.timings, self.route = response, timings, route
        self._routed = None
        self._retry = None
        self._chat_decoder = None
        self._complete = False
        self._closed = False
        self._on_close = on_close
        self._on_end = None
        self._iterator = self._iter_given(chunks, measure, complete)
        return self

    async def _iter_given(
        self,
        chunks: AsyncIterator[ChatCompletionChunk],
        measure: bool,
        complete: Callable[[], bool],
    ) -> AsyncIterator[ChatCompletionChunk]:
        clock, timings = time.monotonic, self.timings
        try:
            async for chunk in chunks:
                if measure:
                    if timings.first_byte is None:
                        timings.first_byte = clock() - timings.started_at
                    if is_output(chunk):
                        timings.tokens += 1
                        if timings.first_token is None:
                            timings.first_token = clock() - timings.started_at
                            route = self.route
                            if route is not None and route.cache_hit and route.ttft is None:
                                route.ttft = timings.first_token  # the replay's, as served
                yield chunk
            self._complete = complete()
        finally:
            if measure and timings.total is None:
                timings.total = clock() - timings.started_at
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()

    def __aiter__(self) -> AsyncStream[_T]:  # type: ignore[override]
        return self

    async def __anext__(self) -> _T:
        try:
            return await self._iterator.__anext__()  # type: ignore[return-value]
        except StopAsyncIteration:
            if self._whole() or self._closed:
                self._ended(None)
                raise
            # A cancelled read ends the underlying generator; what follows must not look like
            # the end of a complete answer.
            routed, decoder = self._routed, self._chat_decoder
            if routed is not None:
                partial = routed.text
            else:
                partial = decoder.text if decoder is not None else ""
            abandoned = StreamInterrupted(
                "The stream was abandoned before the answer was complete (a read of it was "
                "cancelled); the text so far is in .partial_text.",
                self.response.request,
                partial_text=partial,
                cause=None,
            )
            self._ended(abandoned)
            raise abandoned from None
        except BaseException as exc:
            self._ended(exc)
            raise

    def _whole(self) -> bool:
        """Whether the answer was read to its end and is complete."""
        routed = self._routed
        return self._complete or (routed is not None and routed.complete)

    def __del__(self) -> None:
        # A stream left with a bare ``break`` and dropped still ends, for its telemetry.
        if getattr(self, "_on_end", None) is not None:
            with contextlib.suppress(Exception):
                self._ended(None)

    def _ended(self, exc: BaseException | None) -> None:
        """Tell the end hook (telemetry), once, how the stream ended."""
        hook, self._on_end = self._on_end, None
        if hook is not None:
            hook(self, exc, self._whole())

    async def _iter_chunks(self) -> AsyncIterator[ChatCompletionChunk]:
        clock = time.monotonic
        # After a retry, chunks before the new attempt's first token repeat what was yielded.
        skip_preamble = False
        try:
            while True:
                response, timings = self.response, self.timings
                decoder = self._chat_decoder = self._new_decoder()
                reader = StreamReader(decoder, timings)
                request = response.request
                skipping = skip_preamble
                failure: APIError | None = None
                try:
                    with map_transport_errors(request):
                        receive = body_receiver(response)
                        data: bytes | None = b""
                        while data is not None:
                            data = await receive()
                            for chunk in reader.feed(data):
                                if skipping:
                                    if is_preamble_chunk(chunk):
                                        continue
                                    skipping = False
                                skip_preamble = True
                                yield chunk
                            if reader.done:
                                break
                except APIConnectionError as exc:
                    if timings.tokens:
                        raise broke(exc, request, timings, decoder) from exc
                    failure = exc
                if failure is None and reader.complete:
                    self._complete = True
                    return
                if failure is None:
                    failure = stream_ended_with_text(request, decoder.text)
                if timings.tokens or not await self._retry_before_first_token(failure):
                    raise failure
        finally:
            if self.timings.total is None:
                self.timings.total = clock() - self.timings.started_at
            await self.response.aclose()

    async def _retry_before_first_token(self, failure: APIError) -> bool:
        """Send the request again (openai's backoff, within ``max_retries``); False if none left."""
        if self._retry is None:
            return False
        timings = self.timings
        timings.total = time.monotonic() - timings.started_at
        await self.response.aclose()
        sent = await self._retry(timings.retries, failure)
        if sent is None:
            return False
        self.response, self.timings = sent  # pyright: ignore[reportIncompatibleVariableOverride]
        return True

    async def close(self) -> None:
        """Stop reading and release the stream (resets the HTTP/2 stream if unfinished)."""
        self._closed = True
        try:
            await self._iterator.aclose()  # type: ignore[attr-defined]
        finally:
            self._ended(None)
        if self._on_close is not None:
            self._on_close()  # the response is not this stream's to close
            return
        await self.response.aclose()
        if self._routed is not None:
            self._routed.finish()

    async def __aenter__(self) -> AsyncStream[_T]:  # type: ignore[override]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
