"""The stream decoder of a chat completion (:class:`ChatStreamDecoder`): bytes of a response
body in, openai's ``ChatCompletionChunk`` objects out, as ``openai.AsyncStream`` reads them.

Every protocol's decoder is one or a subclass of it (the adapter interface names it as the
return type of ``stream_decoder``), so it sits below the protocols. It knows nothing of routing
or sockets.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Mapping
from typing import Any, cast

import httpx
from openai import APIError
from openai.types.chat import ChatCompletionChunk

from .._errors import MalformedStreamError
from ..transport import ServerSentEvent, SSEDecodeError, SSEDecoder
from ._construct import build_chunk

try:
    from jiter import from_json as _jiter_loads
except ImportError:  # pragma: no cover - jiter is a dependency of openai
    _jiter_loads = None

__all__ = ["ChatStreamDecoder", "is_token_chunk"]

_STREAM_ERROR = "An error occurred during streaming"


def is_token_chunk(chunk: ChatCompletionChunk) -> bool:
    """Whether a chunk carries generated output: content, refusal, tool or function call, reasoning.

    Reasoning is the ``reasoning_content`` or ``reasoning`` delta field some vendors send.
    A role-only, finish or usage chunk is not a token chunk.
    """
    try:
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content or delta.tool_calls or delta.refusal or delta.function_call:
                return True
            extra = delta.__pydantic_extra__
            if extra and (extra.get("reasoning_content") or extra.get("reasoning")):
                return True
    except (AttributeError, TypeError):
        return False
    return False


class ChatStreamDecoder:
    """Turn the bytes of a streamed chat completion into ``ChatCompletionChunk`` objects.

    Follows ``openai.AsyncStream``: an event whose data starts with ``[DONE]`` ends the stream
    (later bytes are ignored); a JSON object with a truthy ``error`` member raises
    ``openai.APIError`` with openai's message and ``body``; events named ``thread.*`` are wrapped
    as ``{"data": ..., "event": ...}``. Data that is not JSON raises ``MalformedStreamError``.
    When an event fails, the chunks decoded before it in the same :meth:`feed` are returned and the
    error is raised by the next :meth:`feed` or :meth:`close`, so no chunk is lost; after an error
    the decoder is done.

    Unlike openai, an event without a ``data`` line (``event: ping``) is ignored, as the SSE spec
    says, rather than failing to parse as JSON.
    """

    __slots__ = (
        "_error",
        "_sse",
        "_text",
        "_unfinished",
        "done",
        "finished",
        "request",
        "target",
        "tokens",
    )

    def __init__(
        self, *, request: httpx.Request, target: str, max_event_bytes: int = 8 * 1024 * 1024
    ) -> None:
        self.request = request
        self.target = target
        self._sse = SSEDecoder(max_event_bytes=max_event_bytes)
        self._error: BaseException | None = None
        self._text: list[str] = []
        self.done = False
        """True once ``data: [DONE]`` arrived."""
        self.finished = False
        """True once every choice seen so far carried a ``finish_reason``."""
        self._unfinished: set[int] = set()
        self.tokens = 0
        """How many token chunks (see :func:`is_token_chunk`) were decoded."""

    @property
    def vendor_usage(self) -> Any:
        """The vendor's own usage object so far, where the protocol's chunks do not carry it
        as the vendor sent it (Anthropic's); ``None`` here: a chunk's ``usage`` is the vendor's."""
        return None

    @property
    def text(self) -> str:
        """The content of choice 0 decoded so far."""
        if len(self._text) > 1:
            self._text[:] = ["".join(self._text)]
        return self._text[0] if self._text else ""

    def feed(self, data: bytes) -> list[ChatCompletionChunk]:
        """Decode bytes from the response body; return the chunks they complete, in order."""
        if self._error is not None:
            self._raise()
        if self.done:
            return []
        try:
            events = self._sse.feed(data)
        except SSEDecodeError as exc:
            self.done = True
            raise MalformedStreamError(
                str(exc), self.request, target=self.target, line=data.decode("utf-8", "replace")
            ) from exc
        return self._chunks(events) if events else []

    def close(self) -> list[ChatCompletionChunk]:
        """End of the response body: raise a pending error, else return any last chunks."""
        if self._error is not None:
            self._raise()
        if self.done:
            return []
        try:
            events = self._sse.close()
        except SSEDecodeError as exc:  # deferred by the last feed, after the events before it
            self.done = True
            raise MalformedStreamError(str(exc), self.request, target=self.target, line="") from exc
        return self._chunks(events)

    def _raise(self) -> typing.NoReturn:
        error, self._error = self._error, None
        self.done = True
        raise cast(BaseException, error)

    def _chunks(self, events: list[ServerSentEvent]) -> list[ChatCompletionChunk]:
        chunks: list[ChatCompletionChunk] = []
        for sse in events:
            if self.done:
                break  # the stream ended (a subclass's end event): later bytes are ignored
            payload = sse.data
            if payload.startswith("[DONE]"):
                self.done = True
                break
            try:
                chunk = self._chunk(sse, payload)
            except Exception as exc:
                if not chunks:
                    self.done = True
                    raise
                self._error = exc
                break
            chunks.append(chunk)
            self._track(chunk)
        return chunks

    def _load(self, payload: str) -> Any:
        try:
            return _loads(payload)
        except (ValueError, RecursionError) as exc:
            message = "Stream event data is not valid JSON"
            target = self.target
            raise MalformedStreamError(message, self.request, target=target, line=payload) from exc

    def _chunk(self, sse: ServerSentEvent, payload: str) -> ChatCompletionChunk:
        data = self._load(payload)
        event = sse.event
        if event is not None and event.startswith("thread."):
            value: object = {"data": data, "event": event}
        else:
            if type(data) is dict and data.get("error"):  # JSON objects are dicts
                raise _stream_error(data["error"], self.request)
            if data is None:
                return cast(ChatCompletionChunk, None)
            value = data
        return build_chunk(value)

    def _track(self, chunk: ChatCompletionChunk) -> None:
        if type(chunk) is not ChatCompletionChunk:
            return
        try:
            token = False
            for choice in chunk.choices:
                delta = choice.delta
                if choice.finish_reason is not None:
                    self._unfinished.discard(choice.index)
                    self.finished = not self._unfinished
                elif choice.index not in self._unfinished:
                    self._unfinished.add(choice.index)  # with n > 1, each choice ends apart
                    self.finished = False
                content = delta.content
                if content:
                    token = True
                    if choice.index == 0 and type(content) is str:
                        self._text.append(content)
        except (AttributeError, TypeError):
            return
        if not token:
            token = is_token_chunk(chunk)
        if token:
            self.tokens += 1


def _stream_error(error: object, request: httpx.Request) -> APIError:
    """The ``openai.APIError`` for an error object a vendor sent in a stream, as openai makes it:
    the object's ``message`` when it is a non-empty string, else openai's generic one; the object
    as ``body``."""
    message = error.get("message") if isinstance(error, Mapping) else None
    if not isinstance(message, str) or not message:
        message = _STREAM_ERROR
    return APIError(message=message, request=request, body=error)  # type: ignore[arg-type]


def _loads(payload: str) -> Any:
    if _jiter_loads is not None:
        try:
            return _jiter_loads(payload.encode())
        except ValueError:
            pass  # jiter is stricter in corners (lone surrogates): json decides
    return json.loads(payload)
