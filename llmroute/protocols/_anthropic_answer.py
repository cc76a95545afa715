"""Anthropic's Messages protocol, the answer: a whole Messages response as openai's
``ChatCompletion`` (:func:`parse_message`) and a streamed one as ``ChatCompletionChunk`` objects
(:class:`AnthropicStreamDecoder`), with openai's finish reasons and usage (:func:`usage_of`).
:mod:`llmroute.protocols.anthropic` re-exports these.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, cast

import httpx
from openai import APIResponseValidationError
from openai._models import construct_type
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from .._errors import MalformedStreamError, make_status_error
from ..transport import ServerSentEvent
from ._anthropic_request import _skip
from ._construct import build_chunk
from ._decoder import ChatStreamDecoder
from .openai import load_json

__all__ = ["AnthropicStreamDecoder", "finish_reason", "parse_message", "usage_of"]

_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
# Anthropic's error types and the HTTP status each one comes with.
_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
# Events of a message: each needs message_start first (ping, error and new kinds do not).
_MESSAGE_EVENTS = frozenset(
    {
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    }
)


def finish_reason(stop_reason: str | None) -> str | None:
    """openai's ``finish_reason`` for an Anthropic ``stop_reason`` (unknown ones map to stop)."""
    if stop_reason is None:
        return None
    return _FINISH.get(stop_reason, "stop") if isinstance(stop_reason, str) else "stop"


def usage_of(usage: Mapping[str, Any]) -> dict[str, Any]:
    """openai's usage object for Anthropic's: prompt tokens include the cache's.

    A count that is not an integer counts 0.
    """
    cache_read = _count(usage.get("cache_read_input_tokens"))
    prompt = _count(usage.get("input_tokens")) + _count(usage.get("cache_creation_input_tokens"))
    prompt += cache_read
    completion = _count(usage.get("output_tokens"))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cache_read},
    }


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def parse_message(
    raw: bytes,
    *,
    request: httpx.Request,
    target: str,
    response: httpx.Response | None = None,
    prefill_whitespace: str = "",
) -> ChatCompletion:
    """Decode a non-streamed Messages response into a ``ChatCompletion``.

    Text blocks are joined into ``content``, ``tool_use`` blocks become ``tool_calls``, thinking
    becomes the ``reasoning_content`` field; invalid JSON raises ``MalformedResponseError``, and
    content of the wrong shape ``openai.APIResponseValidationError`` naming the target.
    ``prefill_whitespace`` (see :func:`prefill_whitespace`) is dropped from the text's start.
    """
    data = load_json(raw, request=request, target=target, response=response)
    if not isinstance(data, dict):
        return cast(ChatCompletion, construct_type(type_=ChatCompletion, value=data))
    data = cast(dict[str, Any], data)
    if data.get("type") == "error":
        raise _stream_error(data, request)
    text: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    content = data.get("content") or []
    if not isinstance(content, list):
        raise _invalid_response("'content' is not an array", data, request, response, target)
    for i, block in enumerate(cast(list[Any], content)):
        kind = block.get("type") if isinstance(block, dict) else None
        block = cast(dict[str, Any], block)
        if kind in ("text", "thinking"):
            piece = block.get(kind) or ""
            if not isinstance(piece, str):
                what = f"content[{i}].{kind} is not a string"
                raise _invalid_response(what, data, request, response, target)
            (text if kind == "text" else thinking).append(piece)
        elif kind == "tool_use":
            try:
                arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            except (ValueError, RecursionError):
                what = f"content[{i}].input cannot be encoded"
                raise _invalid_response(what, data, request, response, target) from None
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {"name": block.get("name"), "arguments": arguments},
                }
            )
    answer = "".join(text)
    if prefill_whitespace:
        answer = _skip(answer, prefill_whitespace)[0]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": answer if text or not calls else None,
        "refusal": None,
    }
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    value: dict[str, Any] = {
        "id": data.get("id"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": data.get("model"),
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason(data.get("stop_reason")) or "stop",
            }
        ],
    }
    if isinstance(data.get("usage"), dict):
        value["usage"] = usage_of(data["usage"])
    return cast(ChatCompletion, construct_type(type_=ChatCompletion, value=value))


def _invalid_response(
    what: str,
    data: Any,
    request: httpx.Request,
    response: httpx.Response | None,
    target: str,
) -> APIResponseValidationError:
    if response is None:
        response = httpx.Response(200, request=request)
    message = f"Messages response from target {target!r} is not valid: {what}"
    return APIResponseValidationError(response, data, message=message)  # type: ignore[arg-type]


def _stream_error(data: Mapping[str, Any], request: httpx.Request) -> Exception:
    error = data.get("error")
    kind = error.get("type") if isinstance(error, Mapping) else None
    status = _ERROR_STATUS.get(kind, 500) if isinstance(kind, str) else 500
    response = httpx.Response(status, request=request)
    try:
        raw = json.dumps(data).encode()
    except (ValueError, RecursionError):
        raw = b"{}"
    return make_status_error(response, raw)


class AnthropicStreamDecoder(ChatStreamDecoder):
    """Turn the bytes of a streamed Messages response into ``ChatCompletionChunk`` objects.

    The interface of :class:`~llmroute.protocols.openai.ChatStreamDecoder` (``feed``, ``close``,
    ``done``, ``finished``, ``text``, ``tokens``). The chunks are those an OpenAI stream gives:
    a role chunk first (from ``message_start``), a chunk per text, thinking
    (``reasoning_content``) or tool-input delta (a tool call's id and name come first, on
    ``content_block_start``), a finish chunk (from ``message_delta``), and, with
    ``include_usage`` (``stream_options.include_usage``), a last chunk with no choices and the
    usage. ``message_stop`` sets ``done``; ``ping`` is ignored; an ``error`` event raises the
    openai status error of its type (``overloaded_error`` -> ``InternalServerError``, status 529).
    :attr:`usage` has openai's usage whether asked for or not. ``prefill_whitespace`` (see
    :func:`prefill_whitespace`) is dropped from the start of the text.

    A stream that breaks the protocol raises ``MalformedStreamError``: an event that is not a
    JSON object, a member of the wrong type (a ``delta`` that is not an object, an ``index`` that
    is not an integer, text that is not a string), or a message event before ``message_start``.
    ``finished`` (the answer is whole even if ``message_stop`` never comes) needs the
    ``message_delta`` with the stop reason and no content block left open.
    """

    __slots__ = (
        "_base",
        "_begun",
        "_calls",
        "_include_usage",
        "_open",
        "_pending",
        "_raw_usage",
        "_skipped",
        "_tools",
    )

    def __init__(
        self,
        *,
        request: httpx.Request,
        target: str,
        include_usage: bool = False,
        prefill_whitespace: str = "",
        max_event_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        super().__init__(request=request, target=target, max_event_bytes=max_event_bytes)
        self._include_usage = include_usage
        self._pending = prefill_whitespace
        self._skipped = 0  # how much of it the answer has repeated so far
        self._base: dict[str, Any] = {
            "id": "",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "",
        }
        self._raw_usage: dict[str, Any] = {}
        self._tools: dict[int, int] = {}  # content block index -> tool call index
        self._calls = 0
        self._begun = False  # message_start seen
        self._open: set[int] = set()  # content blocks started and not stopped

    @property
    def usage(self) -> dict[str, Any] | None:
        """openai's usage object for what arrived so far (None before ``message_start``)."""
        return usage_of(self._raw_usage) if self._raw_usage else None

    @property
    def vendor_usage(self) -> dict[str, Any] | None:
        """Anthropic's own usage object so far (cache writes by lifetime included)."""
        return dict(self._raw_usage) if self._raw_usage else None

    def _chunks(self, events: list[ServerSentEvent]) -> list[ChatCompletionChunk]:
        chunks: list[ChatCompletionChunk] = []
        for sse in events:
            try:
                chunk = self._event(sse)
            except Exception as exc:
                if not chunks:
                    self.done = True
                    raise
                self._error = exc
                break
            if chunk is not None:
                chunks.append(chunk)
                self._track(chunk)
                if self._open:
                    self.finished = False  # a stop reason while a block is open: not whole
            if self.done:
                break
        return chunks

    def _make(self, delta: dict[str, Any], finish: str | None = None) -> ChatCompletionChunk:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        chunk = {**self._base, "choices": [choice]}
        if self._include_usage:
            chunk["usage"] = None
        return build_chunk(chunk)

    def _malformed(self, what: str, sse: ServerSentEvent) -> MalformedStreamError:
        return MalformedStreamError(what, self.request, target=self.target, line=sse.data)

    def _member(
        self,
        data: Mapping[str, Any],
        name: str,
        kind: type | tuple[type, ...],
        sse: ServerSentEvent,
    ) -> Any:
        """``data[name]``, None if absent or null; MalformedStreamError if not of ``kind``."""
        value = data.get(name)
        if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
            return value
        event = data.get("type")
        where = f"{event} event" if isinstance(event, str) else "Stream event"
        raise self._malformed(f"{where} has a {name!r} of the wrong type", sse)

    def _index(self, data: Mapping[str, Any], sse: ServerSentEvent) -> int:
        index = self._member(data, "index", int, sse)
        return 0 if index is None else index

    def _content_chunk(
        self, holder: Mapping[str, Any], sse: ServerSentEvent
    ) -> ChatCompletionChunk | None:
        """A content chunk of ``holder``'s text (a delta or a block's start), less the prefill
        whitespace the answer repeats (see :func:`_skip`)."""
        text = self._member(holder, "text", str, sse)
        if text and self._skipped < len(self._pending):
            text, self._skipped = _skip(text, self._pending, self._skipped)
        return self._make({"content": text}) if text else None

    def _reasoning_chunk(
        self, holder: Mapping[str, Any], sse: ServerSentEvent
    ) -> ChatCompletionChunk | None:
        thinking = self._member(holder, "thinking", str, sse)
        return self._make({"reasoning_content": thinking}) if thinking else None

    def _event(self, sse: ServerSentEvent) -> ChatCompletionChunk | None:
        try:
            data = json.loads(sse.data)
        except (ValueError, RecursionError) as exc:
            raise self._malformed("Stream event data is not valid JSON", sse) from exc
        if not isinstance(data, dict):
            raise self._malformed("Stream event is not an object", sse)
        data = cast(dict[str, Any], data)
        kind = data.get("type", sse.event)
        if not isinstance(kind, str):
            if kind is None:
                return None
            raise self._malformed("Stream event has a 'type' that is not a string", sse)
        if kind in _MESSAGE_EVENTS and not self._begun:
            raise self._malformed(f"{kind} event before message_start", sse)
        if kind == "content_block_delta":
            return self._block_delta(data, sse)
        if kind == "content_block_start":
            return self._block_start(data, sse)
        if kind == "content_block_stop":
            self._open.discard(self._index(data, sse))
            return None
        if kind == "ping":
            return None
        if kind == "message_start":
            message = self._member(data, "message", dict, sse) or {}
            usage = self._member(message, "usage", dict, sse) or {}
            self._begun = True
            self._base["id"] = self._member(message, "id", str, sse) or ""
            self._base["model"] = self._member(message, "model", str, sse) or ""
            self._base["created"] = int(time.time())
            self._raw_usage.update(usage)
            return self._make({"role": "assistant", "content": ""})
        if kind == "message_delta":
            usage = self._member(data, "usage", dict, sse)
            if usage is not None:
                self._raw_usage.update({k: v for k, v in usage.items() if v is not None})
            delta = self._member(data, "delta", dict, sse) or {}
            return self._make({}, finish_reason(delta.get("stop_reason")) or "stop")
        if kind == "message_stop":
            self.done = True
            if not self._include_usage:
                return None
            chunk = {**self._base, "choices": [], "usage": usage_of(self._raw_usage)}
            return build_chunk(chunk)
        if kind == "error":
            raise _stream_error(data, self.request)
        return None  # event types added later: ignored, as Anthropic's docs ask

    def _block_delta(
        self, data: dict[str, Any], sse: ServerSentEvent
    ) -> ChatCompletionChunk | None:
        """A ``content_block_delta``: text, tool-input JSON or thinking (others: nothing)."""
        delta = self._member(data, "delta", dict, sse) or {}
        dtype = delta.get("type")
        if dtype == "text_delta":
            return self._content_chunk(delta, sse)
        if dtype == "input_json_delta":
            fragment = self._member(delta, "partial_json", str, sse)
            call = self._tools.get(self._index(data, sse))
            if not fragment or call is None:
                return None
            tool = {"index": call, "function": {"arguments": fragment}}
            return self._make({"tool_calls": [tool]})
        if dtype == "thinking_delta":
            return self._reasoning_chunk(delta, sse)
        return None  # signature_delta, citations_delta: nothing openai has

    def _block_start(
        self, data: dict[str, Any], sse: ServerSentEvent
    ) -> ChatCompletionChunk | None:
        """A ``content_block_start``: a tool call's id and name, or a block's first text."""
        block = self._member(data, "content_block", dict, sse) or {}
        index = self._index(data, sse)
        self._open.add(index)
        btype = block.get("type")
        if btype == "tool_use":
            call_id = self._member(block, "id", str, sse)
            name = self._member(block, "name", str, sse)
            call_index = self._tools[index] = self._calls
            self._calls += 1
            call = {
                "index": call_index,
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
            return self._make({"tool_calls": [call]})
        if btype == "text":
            return self._content_chunk(block, sse)
        if btype == "thinking":
            return self._reasoning_chunk(block, sse)
        return None
