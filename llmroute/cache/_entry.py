"""A cached answer: its stored form, and the chunks or completion a replay gives back.

An entry keeps an answer as it arrived: a streamed answer as its chunks (openai's JSON, unknown
fields included) with the time each arrived, a non-streamed one as its completion. Either form
replays as the other: chunks fold into a ``ChatCompletion`` the way openai's stream helpers
accumulate them, and a completion unfolds into the chunk sequence a live stream would send (role
chunk, reasoning, content and tool-call deltas, finish_reason, and the usage chunk when asked).
Entries are JSON (never pickle: a shared store must not be able to run code) and carry their own
key, so a damaged or misplaced entry is detected and treated as a miss.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

from openai._models import construct_type
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent

from ..protocols.openai import build_chunk

__all__ = ["CacheEntry", "CorruptEntry"]

VERSION = 1
# Delta fields with their own folding rules; any other string field (reasoning_content,
# reasoning, ...) is concatenated, any other list extended, anything else kept as last seen.
_DELTA_KNOWN = frozenset({"role", "content", "refusal", "tool_calls", "function_call"})
_PIECE = re.compile(r"\s*\S+\s*|\s+")
_ARGUMENT_PIECE = 24


class CorruptEntry(ValueError):
    """Raised when stored bytes are not a valid entry for the key they were found under."""


@dataclass(slots=True)
class CacheEntry:
    """One stored answer; exactly one of ``chunks`` and ``completion`` is set."""

    key: str
    created: float
    """Unix time it was stored."""
    chunks: list[dict[str, Any]] | None = None
    """A streamed answer: each chunk's JSON, in order."""
    offsets: list[float] | None = None
    """Seconds from the request to each chunk (the recorded rhythm of a streamed answer)."""
    completion: dict[str, Any] | None = None
    """A non-streamed answer's JSON."""
    origin: str | None = None
    """The target that produced it."""
    kind: str = "chat"
    """The API: ``"chat"`` (chunks and a ``ChatCompletion``) or ``"responses"`` (the Responses
    API's stream events and its ``Response``)."""

    @classmethod
    def from_chunks(
        cls,
        key: str,
        chunks: list[Any],
        offsets: list[float],
        origin: str | None,
        kind: str = "chat",
    ) -> CacheEntry:
        return cls(
            key=key,
            created=time.time(),
            chunks=[chunk.to_dict() for chunk in chunks],
            offsets=[round(t, 4) for t in offsets],
            origin=origin,
            kind=kind,
        )

    @classmethod
    def from_completion(
        cls, key: str, completion: Any, origin: str | None, kind: str = "chat"
    ) -> CacheEntry:
        return cls(
            key=key, created=time.time(), completion=completion.to_dict(), origin=origin, kind=kind
        )

    # -- stored form -----------------------------------------------------------------------

    def encode(self) -> bytes:
        data: dict[str, Any] = {"v": VERSION, "key": self.key, "created": self.created}
        if self.chunks is not None:
            data["chunks"] = self.chunks
            data["offsets"] = self.offsets
        else:
            data["completion"] = self.completion
        if self.origin is not None:
            data["origin"] = self.origin
        if self.kind != "chat":
            data["kind"] = self.kind
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()

    @classmethod
    def decode(cls, raw: bytes, key: str) -> CacheEntry:
        """The entry stored as ``raw`` under ``key``; :class:`CorruptEntry` if it is not one."""
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptEntry(f"not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise CorruptEntry("not a JSON object")
        data = cast(dict[str, Any], data)
        if data.get("v") != VERSION:
            raise CorruptEntry(f"unknown format version {data.get('v')!r}")
        if data.get("key") != key:
            raise CorruptEntry("stored under another key")
        created, origin = data.get("created"), data.get("origin")
        if not isinstance(created, int | float) or not isinstance(origin, str | None):
            raise CorruptEntry("bad created or origin")
        chunks, offsets, completion = (
            data.get("chunks"),
            data.get("offsets"),
            data.get("completion"),
        )
        kind = data.get("kind", "chat")
        if kind not in ("chat", "responses"):
            raise CorruptEntry(f"unknown kind {kind!r}")
        valid_chunk = _valid_chunk if kind == "chat" else _valid_event
        if chunks is not None:
            if not (isinstance(chunks, list) and chunks and all(map(valid_chunk, chunks))):
                raise CorruptEntry("bad chunks")
            if not (
                isinstance(offsets, list)
                and len(offsets) == len(chunks)
                and all(isinstance(t, int | float) and t >= 0 for t in offsets)
            ):
                raise CorruptEntry("bad chunk offsets")
            return cls(
                key, float(created), chunks=chunks, offsets=offsets, origin=origin, kind=kind
            )
        if kind == "responses":
            if not (isinstance(completion, dict) and isinstance(completion.get("output"), list)):
                raise CorruptEntry("neither events nor a response")
            return cls(key, float(created), completion=completion, origin=origin, kind=kind)
        if not (
            isinstance(completion, dict)
            and isinstance(completion.get("choices"), list)
            and all(_valid_choice(c, "message") for c in completion["choices"])
        ):
            raise CorruptEntry("neither chunks nor a completion")
        return cls(key, float(created), completion=completion, origin=origin)

    # -- replay ----------------------------------------------------------------------------

    @property
    def has_usage(self) -> bool:
        """Whether the answer's token usage was recorded (a stream asked for it; a Responses
        API answer always has it)."""
        if self.kind == "responses":
            return True
        if self.chunks is not None:
            return any(chunk.get("usage") for chunk in self.chunks)
        return bool(self.completion and self.completion.get("usage"))

    def replay_chunks(self, *, include_usage: bool) -> Iterator[tuple[float, ChatCompletionChunk]]:
        """The chunks a live stream would give, each with its recorded offset in seconds.

        Without ``include_usage``, the usage-only chunk (no choices) is left out.
        """
        if self.kind == "responses":
            yield from self._replay_events()
            return
        if self.chunks is not None:
            offsets = self.offsets or [0.0] * len(self.chunks)
            for offset, data in zip(offsets, self.chunks, strict=True):
                if not include_usage:
                    if not data["choices"] and data.get("usage") is not None:
                        continue
                    if "usage" in data and data["usage"] is None:
                        data = {k: v for k, v in data.items() if k != "usage"}
                yield offset, build_chunk(data)
            return
        assert self.completion is not None
        for data in _unfold(self.completion, include_usage=include_usage):
            yield 0.0, build_chunk(data)

    def replay_completion(self) -> Any:
        """The ``ChatCompletion`` (or Responses API ``Response``) a live non-streamed call
        would give."""
        if self.kind == "responses":
            data = self.completion if self.completion is not None else _final(self.chunks or [])
            return construct_type(type_=Response, value=data)
        data = self.completion if self.completion is not None else _fold(self.chunks or [])
        return cast(ChatCompletion, construct_type(type_=ChatCompletion, value=data))

    @property
    def streams(self) -> bool:
        """Whether a streamed request can be answered from it (a Responses API answer stored
        from a call that was not streamed has no events to replay)."""
        return self.kind == "chat" or self.chunks is not None

    def _replay_events(self) -> Iterator[tuple[float, Any]]:
        chunks = self.chunks
        if chunks is None:
            raise CorruptEntry("a Responses API answer without its events cannot be streamed")
        offsets = self.offsets or [0.0] * len(chunks)
        for offset, data in zip(offsets, chunks, strict=True):
            yield offset, construct_type(type_=ResponseStreamEvent, value=data)


def _valid_event(event: object) -> bool:
    return isinstance(event, dict) and isinstance(event.get("type"), str)


def _final(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The response a Responses API stream ended with (its ``response.completed`` event's)."""
    for event in reversed(events):
        if event.get("type") == "response.completed" and isinstance(event.get("response"), dict):
            return event["response"]
    raise CorruptEntry("a Responses API stream without its response.completed event")


def _valid_choice(choice: object, body: str) -> bool:
    return (
        isinstance(choice, dict)
        and isinstance(choice.get("index", 0), int)
        and isinstance(choice.get(body) or {}, dict)
    )


def _valid_chunk(chunk: object) -> bool:
    return (
        isinstance(chunk, dict)
        and isinstance(chunk.get("choices"), list)
        and all(_valid_choice(c, "delta") for c in chunk["choices"])
    )


def _fold(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The completion JSON the chunks of a stream add up to."""
    first = chunks[0]
    top = {k: v for k, v in first.items() if k not in ("choices", "object", "usage")}
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    for chunk in chunks:
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk["choices"]:
            index = choice.get("index", 0)
            into = choices.setdefault(
                index,
                {"index": index, "message": {"role": "assistant", "content": None}, "tools": {}},
            )
            _fold_delta(into, choice.get("delta") or {})
            if choice.get("finish_reason") is not None:
                into["finish_reason"] = choice["finish_reason"]
            logprobs = choice.get("logprobs")
            if logprobs:
                into_lp = into.setdefault("logprobs", {})
                for part, entries in logprobs.items():
                    if isinstance(entries, list):
                        into_lp.setdefault(part, []).extend(entries)
    folded = []
    for index in sorted(choices):
        choice = choices[index]
        tools = choice.pop("tools")
        if tools:
            choice["message"]["tool_calls"] = [tools[i] for i in sorted(tools)]
            if not choice["message"]["content"]:
                choice["message"]["content"] = None  # as a live tool-call answer has it
        choice.setdefault("finish_reason", None)
        choice.setdefault("logprobs", None)
        folded.append(choice)
    return {**top, "object": "chat.completion", "choices": folded, "usage": usage}


def _fold_delta(into: dict[str, Any], delta: Mapping[str, Any]) -> None:
    message = into["message"]
    for field, value in delta.items():
        if value is None:
            continue
        if field == "role":
            message["role"] = value
        elif field == "tool_calls":
            for call in value:
                slot = into["tools"].setdefault(
                    call.get("index", 0),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                for name in ("id", "type"):
                    if call.get(name):
                        slot[name] = call[name]
                function = call.get("function") or {}
                slot["function"]["name"] += function.get("name") or ""
                slot["function"]["arguments"] += function.get("arguments") or ""
        elif field == "function_call":
            slot = message.setdefault("function_call", {"name": "", "arguments": ""})
            slot["name"] += value.get("name") or ""
            slot["arguments"] += value.get("arguments") or ""
        elif isinstance(value, str):
            message[field] = (message.get(field) or "") + value
        elif isinstance(value, list):
            message.setdefault(field, []).extend(value)
        else:
            message[field] = value


def _pieces(text: str) -> list[str]:
    """Word-sized pieces of ``text`` (a stream's deltas are about a token each)."""
    return _PIECE.findall(text) or [text]


def _unfold(completion: Mapping[str, Any], *, include_usage: bool) -> Iterator[dict[str, Any]]:
    """The chunk JSON a live stream of ``completion`` would send."""
    top = {
        k: v
        for k, v in completion.items()
        if k not in ("choices", "object", "usage", "_request_id")
    }
    top["object"] = "chat.completion.chunk"
    if include_usage:
        top["usage"] = None

    def chunk(index: int, delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        return {**top, "choices": [{**choice, **extra}]}

    for choice in completion.get("choices") or []:
        index = choice.get("index", 0)
        message = choice.get("message") or {}
        yield chunk(index, {"role": message.get("role") or "assistant", "content": ""})
        for field, value in message.items():
            if field not in _DELTA_KNOWN and field != "audio":
                if isinstance(value, str) and value:
                    for piece in _pieces(value):
                        yield chunk(index, {field: piece})
                elif value and not isinstance(value, str):
                    yield chunk(index, {field: value})
        yield from _unfold_content(chunk, index, message, choice.get("logprobs"))
        if message.get("refusal"):
            for piece in _pieces(message["refusal"]):
                yield chunk(index, {"refusal": piece})
        for position, call in enumerate(message.get("tool_calls") or []):
            function = call.get("function") or {}
            head = {"index": position, "id": call.get("id"), "type": call.get("type", "function")}
            yield chunk(
                index,
                {
                    "tool_calls": [
                        {**head, "function": {"name": function.get("name"), "arguments": ""}}
                    ]
                },
            )
            arguments = function.get("arguments") or ""
            for start in range(0, len(arguments), _ARGUMENT_PIECE):
                piece = arguments[start : start + _ARGUMENT_PIECE]
                yield chunk(
                    index, {"tool_calls": [{"index": position, "function": {"arguments": piece}}]}
                )
        if message.get("function_call"):
            yield chunk(index, {"function_call": message["function_call"]})
        yield chunk(index, {}, finish_reason=choice.get("finish_reason") or "stop")
    if include_usage and completion.get("usage"):
        yield {**top, "choices": [], "usage": completion["usage"]}


def _unfold_content(
    chunk: Any, index: int, message: Mapping[str, Any], logprobs: Mapping[str, Any] | None
) -> Iterator[dict[str, Any]]:
    content = message.get("content")
    if not content:
        return
    tokens = (logprobs or {}).get("content")
    if tokens and "".join(t.get("token", "") for t in tokens) == content:
        # One chunk per token, each with its own log probability, as a live stream sends.
        for token in tokens:
            yield chunk(index, {"content": token["token"]}, logprobs={"content": [token]})
        return
    for position, piece in enumerate(_pieces(content)):
        extra = {"logprobs": logprobs} if logprobs and position == 0 else {}
        yield chunk(index, {"content": piece}, **extra)
