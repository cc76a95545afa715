"""Hostile Anthropic Messages streams and requests: random event sequences (wrong order, missing
members, wrong types, odd indexes) and random JSON through the event translator, and hostile
chat requests through translate_request. Only openai's typed errors come out, a truncated or
inconsistent stream never passes for a whole answer, and nothing allocates by an index's size.
"""

from __future__ import annotations

import itertools
import json
import tracemalloc
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmroute._errors import MalformedStreamError
from llmroute.protocols.anthropic import (
    AnthropicStreamDecoder,
    parse_message,
    prefill_whitespace,
    translate_request,
)

REQUEST = httpx.Request("POST", "https://fuzz.invalid/v1/messages")
TARGET = "fuzz:claude"
SETTINGS = settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_index = st.sampled_from([0, 1, 2, -1, 10**9, 2**64, "0", 1.5, True, None, [0]]) | _json
_text = st.sampled_from(["", " ", "Hi", "é€😀", "\0", "x" * 1000]) | _json


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(strategy, strategy, strategy, _json)


def _event(kind: str, **members: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"type": st.just(kind) | st.just(kind) | st.just(kind) | _json},
        optional={name: _maybe(strategy) for name, strategy in members.items()},
    )


_usage = st.dictionaries(
    st.sampled_from(
        [
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
            "service_tier",
            "server_tool_use",
        ]
    ),
    st.integers(-5, 10**6) | _json,
    max_size=4,
)
_block = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "tool_use", "thinking", "redacted_thinking", "image", "?"])},
    optional={"text": _text, "thinking": _text, "id": _text, "name": _text, "input": _json},
)
_delta = st.fixed_dictionaries(
    {
        "type": st.sampled_from(
            ["text_delta", "input_json_delta", "thinking_delta", "signature_delta", "?"]
        )
    },
    optional={"text": _text, "partial_json": _text, "thinking": _text, "signature": _text},
)
_events = st.one_of(
    _event(
        "message_start",
        message=st.fixed_dictionaries(
            {}, optional={"id": _text, "model": _text, "usage": _usage, "content": _json}
        ),
    ),
    _event("content_block_start", index=_index, content_block=_block),
    _event("content_block_delta", index=_index, delta=_delta),
    _event("content_block_stop", index=_index),
    _event(
        "message_delta",
        delta=st.fixed_dictionaries(
            {},
            optional={
                "stop_reason": st.sampled_from(["end_turn", "max_tokens", "tool_use", "?"]) | _json
            },
        ),
        usage=_usage,
    ),
    _event("message_stop"),
    _event("ping"),
    _event(
        "error",
        error=st.fixed_dictionaries(
            {},
            optional={
                "type": st.sampled_from(["overloaded_error", "api_error", "?"]) | _json,
                "message": _text,
            },
        ),
    ),
    _event("future_event", stuff=_json),
    _json.map(lambda value: {"value": value}),
)


def _sse(event: dict[str, Any], name: str | None) -> bytes:
    head = f"event: {name}\n" if name is not None else ""
    return (head + "data: " + json.dumps(event) + "\n\n").encode()


@st.composite
def _sequences(draw: st.DrawFn) -> tuple[list[dict[str, Any]], bytes]:
    events = draw(st.lists(_events, max_size=12))
    if draw(st.booleans()):
        events.insert(0, {"type": "message_start", "message": {"id": "m", "model": "c"}})
    out = b""
    for event in events:
        kind = event.get("type")
        name = draw(st.sampled_from([kind if isinstance(kind, str) else None, None, "ping"]))
        out += _sse(event, name)
    if draw(st.integers(0, 9)) == 0:
        out += draw(st.binary(max_size=20))
    return events, out


def _same(chunks: list[Any]) -> list[Any]:
    """Chunks as data, without ``created`` (the clock's second at message_start)."""
    return [
        c.model_dump(exclude={"created"}, warnings=False) if hasattr(c, "model_dump") else c
        for c in chunks
    ]


def _decode(
    chunks: list[bytes], **kwargs: Any
) -> tuple[list[Any], type[BaseException] | None, AnthropicStreamDecoder]:
    decoder = AnthropicStreamDecoder(request=REQUEST, target=TARGET, **kwargs)
    out: list[Any] = []
    try:
        for chunk in chunks:
            out += decoder.feed(chunk)
        out += decoder.close()
    except openai.APIError as exc:
        return out, type(exc), decoder
    return out, None, decoder


def _cuts(stream: bytes, points: list[int]) -> list[bytes]:
    bounds = sorted({p % (len(stream) + 1) for p in points} | {0, len(stream)})
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


@SETTINGS
@given(
    _sequences(),
    st.lists(st.integers(0, 10_000), max_size=8),
    st.booleans(),
    st.sampled_from(["", " ", "\n  "]),
)
def test_random_event_sequences(
    case: tuple[list[dict[str, Any]], bytes], points: list[int], usage: bool, pending: str
) -> None:
    events, raw = case
    options = {"include_usage": usage, "prefill_whitespace": pending}
    chunks, error, decoder = _decode([raw], **options)
    again, error_again, _ = _decode(_cuts(raw, points), **options)
    assert (_same(again), error_again) == (_same(chunks), error)  # however the bytes were cut
    if error is not None:
        assert decoder.done
        return
    kinds = [event.get("type") for event in events]
    if "message_stop" not in kinds:
        assert not decoder.done
    if "message_delta" not in kinds:
        assert not decoder.finished
    if decoder.done or decoder.finished:
        assert "message_start" in kinds  # nothing passes for an answer without a message
    assert decoder.usage is None or isinstance(decoder.usage["total_tokens"], int)
    assert isinstance(decoder.text, str)


# -- well-formed streams, truncated anywhere ------------------------------------------------------


@st.composite
def _valid(draw: st.DrawFn) -> tuple[list[bytes], str]:
    out = [
        _sse(
            {
                "type": "message_start",
                "message": {"id": "m", "model": "c", "usage": {"input_tokens": 3}},
            },
            "message_start",
        )
    ]
    text = ""
    for index in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["text", "tool_use", "thinking"]))
        block: dict[str, Any] = {"type": kind}
        if kind == "tool_use":
            block |= {"id": f"t{index}", "name": "f", "input": {}}
        else:
            block[kind] = ""
        out.append(
            _sse(
                {"type": "content_block_start", "index": index, "content_block": block},
                "content_block_start",
            )
        )
        for piece in draw(st.lists(st.text(min_size=1, max_size=5), max_size=4)):
            delta: dict[str, Any]
            if kind == "text":
                delta = {"type": "text_delta", "text": piece}
                text += piece
            elif kind == "thinking":
                delta = {"type": "thinking_delta", "thinking": piece}
            else:
                delta = {"type": "input_json_delta", "partial_json": piece}
            out.append(
                _sse(
                    {"type": "content_block_delta", "index": index, "delta": delta},
                    "content_block_delta",
                )
            )
            if draw(st.booleans()):
                out.append(_sse({"type": "ping"}, "ping"))
        out.append(_sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
    out.append(
        _sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 5},
            },
            "message_delta",
        )
    )
    out.append(_sse({"type": "message_stop"}, "message_stop"))
    return out, text


@SETTINGS
@given(_valid(), st.integers(0, 10**6))
def test_truncated_streams_are_never_whole(case: tuple[list[bytes], str], cut: int) -> None:
    events, text = case
    raw = b"".join(events)
    chunks, error, decoder = _decode([raw])
    assert error is None and decoder.done and decoder.finished and decoder.text == text
    assert chunks[0].choices[0].delta.role == "assistant"
    cut %= len(raw)
    _, error, decoder = _decode([raw[:cut]])
    assert error is None
    delta_end = len(b"".join(events[:-1]))  # message_delta complete: the answer is whole
    assert decoder.finished == (cut >= delta_end)
    assert not decoder.done
    assert text.startswith(decoder.text)


def test_stop_reason_with_a_block_still_open_is_not_whole() -> None:
    raw = (
        _sse({"type": "message_start", "message": {}}, "message_start")
        + _sse(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
            None,
        )
        + _sse(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Hel"},
            },
            None,
        )
        + _sse({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}, None)
    )
    _, error, decoder = _decode([raw])
    assert error is None and not decoder.finished and not decoder.done


@pytest.mark.parametrize(
    "event",
    [
        {"type": "message_stop"},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}},
    ],
)
def test_message_events_before_message_start_are_malformed(event: dict[str, Any]) -> None:
    decoder = AnthropicStreamDecoder(request=REQUEST, target=TARGET)
    with pytest.raises(MalformedStreamError, match="before message_start"):
        decoder.feed(_sse(event, None))
    assert not decoder.finished


@pytest.mark.parametrize(
    ("event", "member"),
    [
        ({"type": "content_block_delta", "index": 0, "delta": "x"}, "delta"),
        (
            {
                "type": "content_block_delta",
                "index": [0],
                "delta": {"type": "input_json_delta", "partial_json": "{"},
            },
            "index",
        ),
        (
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": 5}},
            "text",
        ),
        ({"type": "content_block_start", "index": "0", "content_block": {"type": "text"}}, "index"),
        ({"type": "content_block_start", "index": 0, "content_block": [1]}, "content_block"),
        (
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "tool_use", "name": {"x": 1}},
            },
            "name",
        ),
        ({"type": "message_delta", "delta": 5}, "delta"),
        ({"type": "message_delta", "usage": [1]}, "usage"),
        ({"type": ["message_stop"]}, "type"),
        ({"type": "message_start", "message": {"id": [None]}}, "id"),
        ({"type": "message_start", "message": {"usage": 5}}, "usage"),
    ],
)
def test_members_of_the_wrong_type_are_malformed(event: dict[str, Any], member: str) -> None:
    decoder = AnthropicStreamDecoder(request=REQUEST, target=TARGET, prefill_whitespace=" ")
    decoder.feed(_sse({"type": "message_start", "message": {}}, None))
    with pytest.raises(MalformedStreamError, match=repr(member)):
        decoder.feed(_sse(event, None))


def test_odd_usage_values_count_nothing() -> None:
    decoder = AnthropicStreamDecoder(request=REQUEST, target=TARGET, include_usage=True)
    decoder.feed(
        _sse(
            {
                "type": "message_start",
                "message": {
                    "usage": {
                        "input_tokens": "x",
                        "cache_read_input_tokens": [1],
                        "output_tokens": True,
                        "server_tool_use": {"web_search_requests": 1},
                    }
                },
            },
            None,
        )
    )
    chunks = decoder.feed(_sse({"type": "message_stop"}, None))
    usage = chunks[-1].usage
    assert usage is not None and usage.total_tokens == 0
    assert decoder.usage is not None and decoder.usage["total_tokens"] == 0


def test_huge_and_negative_indexes_allocate_nothing_by_size() -> None:
    decoder = AnthropicStreamDecoder(request=REQUEST, target=TARGET)
    decoder.feed(_sse({"type": "message_start", "message": {}}, None))
    tracemalloc.start()
    try:
        for index in (10**9, 2**63, -(10**9), 10**30, -1):
            block = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
            decoder.feed(
                _sse({"type": "content_block_start", "index": index, "content_block": block}, None)
            )
            delta = {"type": "input_json_delta", "partial_json": "{}"}
            decoder.feed(
                _sse({"type": "content_block_delta", "index": index, "delta": delta}, None)
            )
            decoder.feed(_sse({"type": "content_block_stop", "index": index}, None))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@SETTINGS
@given(_json)
def test_random_json_events(value: Any) -> None:
    raw = _sse({"type": "message_start", "message": {}}, None) + _sse(value, None)
    _decode([raw])  # only openai.APIError subclasses may escape (_decode catches those)


# -- whole responses ------------------------------------------------------------------------------


@SETTINGS
@given(
    _json
    | st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["message", "error"]) | _json,
            "content": st.lists(_block | _json, max_size=4) | _json,
            "stop_reason": st.sampled_from(["end_turn", "tool_use"]) | _json,
            "usage": _usage | _json,
            "error": _json,
            "id": _text,
            "model": _text,
        },
    ),
    st.sampled_from(["", " "]),
)
def test_parse_message_raises_only_typed_errors(value: Any, pending: str) -> None:
    raw = json.dumps(value).encode()
    try:
        parse_message(raw, request=REQUEST, target=TARGET, prefill_whitespace=pending)
    except openai.APIError:
        pass


@pytest.mark.parametrize("raw", [b"", b"\xff", b"[" * 100_000, b"{" * 3000, b"1" * 5000])
def test_parse_message_bad_bytes(raw: bytes) -> None:
    with pytest.raises(openai.APIError):
        parse_message(raw, request=REQUEST, target=TARGET)


# -- hostile requests -----------------------------------------------------------------------------

_part = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "refusal", "input_audio", "file"]) | _json},
    optional={
        "text": _text,
        "refusal": _text,
        "image_url": st.fixed_dictionaries(
            {},
            optional={
                "url": st.sampled_from(
                    ["data:image/png;base64,AAA", "data:x", "https://x/y.png", ""]
                )
                | _json
            },
        )
        | _json,
        "cache_control": _json,
    },
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "?"]) | _json},
    optional={
        "content": _text | st.lists(_maybe(_part), max_size=3),
        "tool_calls": _maybe(
            st.lists(
                _maybe(
                    st.fixed_dictionaries(
                        {},
                        optional={
                            "id": _text,
                            "type": _text,
                            "function": _maybe(
                                st.fixed_dictionaries(
                                    {},
                                    optional={
                                        "name": _text,
                                        "arguments": _maybe(
                                            st.sampled_from(
                                                ["{}", '{"a": 1}', "[]", "{", "", "[" * 3000]
                                            )
                                        ),
                                    },
                                )
                            ),
                        },
                    )
                ),
                max_size=2,
            )
        ),
        "tool_call_id": _text,
        "name": _text,
    },
)
_tool = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["function", "web_search"]) | _json,
        "function": _maybe(
            st.fixed_dictionaries(
                {}, optional={"name": _text, "description": _text, "parameters": _json}
            )
        ),
    },
)
_body = st.fixed_dictionaries(
    {"messages": _maybe(st.lists(_maybe(_message), max_size=5))},
    optional={
        "model": _text,
        "tools": _maybe(st.lists(_maybe(_tool), max_size=3)),
        "tool_choice": st.sampled_from(["auto", "none", "required", "any"]) | _json,
        "parallel_tool_calls": _json,
        "temperature": _maybe(st.floats(0, 2)),
        "top_p": _json,
        "max_tokens": _maybe(st.integers(1, 10**5)),
        "max_completion_tokens": _json,
        "stop": _maybe(st.lists(st.text(max_size=3), max_size=3)),
        "n": _json,
        "logprobs": _json,
        "response_format": _json,
        "modalities": _json,
        "audio": _json,
        "thinking": _maybe(st.fixed_dictionaries({}, optional={"budget_tokens": _json})),
        "user": _json,
        "stream": _json,
        "functions": _json,
        "presence_penalty": _json,
    },
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(_body)
def test_translate_request_raises_only_bad_request(body: dict[str, Any]) -> None:
    prefill_whitespace(body)  # never raises
    try:
        out = translate_request(body, target=TARGET)
    except openai.BadRequestError as exc:
        assert "(parameter '" in exc.message and TARGET in exc.message
        assert isinstance(exc.body, dict) and exc.body.get("param")
        return
    json.dumps(out)  # what is sent can be sent
    assert isinstance(out["messages"], list) and isinstance(out["max_tokens"], int)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": [1]}, "top_p"),
        ({"max_tokens": "100"}, "max_tokens"),
        ({"max_completion_tokens": 1.5}, "max_completion_tokens"),
        ({"stop": 5}, "stop"),
        ({"stop": ["a", 1]}, "stop"),
        ({"tools": {"f": {}}}, "tools"),
        ({"tools": [{"type": "function", "function": "f"}]}, "tools[0].function"),
        ({"tools": [{"type": "function", "function": {"name": 5}}]}, "tools[0].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
            "tools[0].function.parameters",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            "messages[0].content[0].text",
        ),
        (
            {
                "messages": [
                    {"role": "system", "content": [{"type": "text", "text": None}]},
                    {"role": "assistant", "content": [{"type": "text", "text": {"a": 1}}]},
                ]
            },
            "messages[1].content[0].text",
        ),
        ({"messages": [{"role": "assistant", "tool_calls": {"id": 1}}]}, "messages[0].tool_calls"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"function": {"name": "f", "arguments": "[" * 5000}}],
                    }
                ]
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
    ],
)
def test_wrong_types_name_the_parameter(body: dict[str, Any], param: str) -> None:
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError) as info:
        translate_request(body, target=TARGET)
    assert info.value.body == {
        "message": info.value.body["message"],  # type: ignore[index]
        "type": "invalid_request_error",
        "param": param,
        "code": None,
    }
