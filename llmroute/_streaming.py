"""The async stream of chunks a streaming call returns, with its timings."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Generic, TypeVar

import httpx
from openai.types.chat import ChatCompletionChunk

from ._errors import APIConnectionError, APIError, StreamInterrupted, map_transport_errors
from ._types import Timings
from .protocols.openai import ChatStreamDecoder, is_token_chunk

__all__ = ["AsyncStream"]

_T = TypeVar("_T")


class AsyncStream(Generic[_T]):
    """Chunks of one streamed answer, yielded the moment each SSE event is decoded.

    Iterate it with ``async for``; leave early with ``break``, ``close()`` or an ``async with``
    block: the underlying HTTP/2 stream is reset at once and the connection stays open.

    A stream never ends quietly with a truncated answer: if the connection breaks, or the server
    ends the stream before ``[DONE]`` or a ``finish_reason``, iteration raises
    :class:`~llmroute.StreamInterrupted` (content already yielded) or an
    :class:`openai.APIConnectionError` (nothing yielded yet).
    """

    response: httpx.Response
    timings: Timings

    def __init__(
        self, *, response: httpx.Response, decoder: ChatStreamDecoder, timings: Timings
    ) -> None:
        self.response = response
        self.timings = timings
        self._decoder = decoder
        self._iterator = self._iter_chunks()

    def __aiter__(self) -> AsyncIterator[_T]:
        return self._iterator  # type: ignore[return-value]

    async def __anext__(self) -> _T:
        return await self._iterator.__anext__()  # type: ignore[return-value]

    async def _iter_chunks(self) -> AsyncIterator[ChatCompletionChunk]:
        response, decoder, timings = self.response, self._decoder, self.timings
        started = timings.started_at
        request = response.request
        clock = time.monotonic
        try:
            with map_transport_errors(request):
                receive = _receiver(response)
                while (data := await receive()) is not None:
                    if timings.first_byte is None:
                        timings.first_byte = clock() - started
                    for chunk in decoder.feed(data):
                        if is_token_chunk(chunk):
                            if timings.first_token is None:
                                timings.first_token = clock() - started
                            timings.tokens += 1
                        yield chunk
                    if decoder.done:
                        break
                if not decoder.done:
                    for chunk in decoder.close():
                        yield chunk
            if not decoder.done and not decoder.finished:
                raise StreamInterrupted(
                    "The stream ended before the answer was complete (no [DONE] and no "
                    "finish_reason); the text so far is in .partial_text.",
                    request,
                    partial_text=decoder.text,
                    cause=None,
                )
        except APIConnectionError as exc:
            if timings.tokens:
                raise StreamInterrupted(
                    f"The stream broke after {timings.tokens} tokens: {exc.message}",
                    request,
                    partial_text=decoder.text,
                    cause=exc.__cause__ or exc,
                ) from exc
            raise
        except APIError:
            raise
        finally:
            timings.total = clock() - started
            await response.aclose()

    async def close(self) -> None:
        """Stop reading and release the stream (resets the HTTP/2 stream if unfinished)."""
        await self._iterator.aclose()  # type: ignore[attr-defined]
        await self.response.aclose()

    async def __aenter__(self) -> AsyncStream[_T]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _receiver(response: httpx.Response) -> Callable[[], Awaitable[bytes | None]]:
    """The fastest way to read ``response``'s body chunk by chunk.

    llmroute's own transport offers ``receive()``; any other transport is read through httpx.
    """
    body = response.extensions.get("llmroute.body")
    if body is not None:
        return body.receive  # type: ignore[no-any-return]
    iterator = response.aiter_raw()

    async def receive() -> bytes | None:
        try:
            return await iterator.__anext__()
        except StopAsyncIteration:
            return None

    return receive
