from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from llmroute._errors import MalformedStreamError
from llmroute.protocols.anthropic import (
    DEFAULT_MAX_TOKENS,
    AnthropicStreamDecoder,
    headers,
    parse_message,
    prefill_whitespace,
    translate_request,
)
from llmroute.protocols.openai import MalformedResponseError
from llmroute.testing import Profile, _reply, _stream, _wire
from llmroute.testing._anthropic import AnthropicSimApp, anthropic_app

REQUEST = httpx.Request("POST", "https://api.anthropic.com/v1/messages")
TARGET = "anthropic:claude-x"


def tr(**body: Any) -> dict[str, Any]:
    body.setdefault("model", "claude-x")
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return translate_request(body, target=TARGET)


# -- translation ------------------------------------------------------------------------------


def test_headers() -> None:
    assert headers("k") == {
        "x-api-key": "k",
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
    }


def test_minimal_request_gets_default_max_tokens() -> None:
    assert tr() == {
        "model": "claude-x",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": DEFAULT_MAX_TOKENS,
    }


def test_system_and_developer_are_hoisted() -> None:
    out = tr(
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "developer", "content": [{"type": "text", "text": "No emoji."}]},
        ]
    )
    assert out["system"] == "Be brief.\n\nNo emoji."
    assert out["messages"] == [{"role": "user", "content": "hi"}]


def test_system_with_cache_control_stays_blocks() -> None:
    cc = {"type": "ephemeral"}
    out = tr(
        messages=[
            {"role": "system", "content": [{"type": "text", "text": "S", "cache_control": cc}]},
            {"role": "user", "content": "hi"},
        ]
    )
    assert out["system"] == [{"type": "text", "text": "S", "cache_control": cc}]


def test_consecutive_same_role_messages_merge() -> None:
    out = tr(
        messages=[
            {"role": "user", "content": "a"},
            {"role": "user", "content": [{"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "c"},
            {"role": "user", "content": "d"},
        ]
    )
    assert out["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "c"},
        {"role": "user", "content": "d"},
    ]


def test_images_data_url_and_http_url() -> None:
    parts = [
        {"type": "text", "text": "what?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
    ]
    out = tr(messages=[{"role": "user", "content": parts}])
    assert out["messages"][0]["content"] == [
        {"type": "text", "text": "what?"},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
        },
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
    ]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ("required", {"type": "any"}),
        (
            {"type": "function", "function": {"name": "get_weather"}},
            {"type": "tool", "name": "get_weather"},
        ),
    ],
)
def test_tools_and_tool_choice(choice: Any, expected: dict[str, Any]) -> None:
    out = tr(tools=[WEATHER], tool_choice=choice)
    assert out["tools"] == [
        {
            "name": "get_weather",
            "description": "Weather of a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    assert out["tool_choice"] == expected


def test_parallel_tool_calls_false() -> None:
    out = tr(tools=[WEATHER], parallel_tool_calls=False)
    assert out["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}


def test_tool_round_trip_messages() -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    out = tr(
        messages=[
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "user", "content": "thanks"},
        ]
    )
    assert out["messages"] == [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "call_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"},
                {"type": "text", "text": "thanks"},
            ],
        },
    ]


def test_sampling_stop_stream_and_limits() -> None:
    out = tr(
        stop="END",
        max_completion_tokens=50,
        max_tokens=10,
        temperature=1.5,
        top_p=0.9,
        stream=True,
        stream_options={"include_usage": True},
        user="u1",
        seed=3,
        top_k=5,
    )
    assert out["stop_sequences"] == ["END"]
    assert out["max_tokens"] == 50
    assert out["temperature"] == 1.0
    assert out["top_p"] == 0.9
    assert out["stream"] is True
    assert out["metadata"] == {"user_id": "u1"}
    assert out["top_k"] == 5
    assert "seed" not in out and "stream_options" not in out
    assert tr(stop=["a", "b"], max_tokens=7)["stop_sequences"] == ["a", "b"]
    assert tr(max_tokens=7)["max_tokens"] == 7


def test_trailing_assistant_is_prefill() -> None:
    out = tr(
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello "}]
    )
    assert out["messages"][-1] == {"role": "assistant", "content": "Hello"}
    blank = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  "}]
    assert tr(messages=blank)["messages"] == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("n", 2),
        ("logprobs", True),
        ("top_logprobs", 3),
        ("presence_penalty", 0.5),
        ("frequency_penalty", 0.1),
        ("logit_bias", {"50256": -100}),
        ("response_format", {"type": "json_object"}),
    ],
)
def test_unsupported_parameters_raise_bad_request(param: str, value: Any) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        tr(**{param: value})
    assert info.value.status_code == 400
    assert repr(param) in info.value.message and TARGET in info.value.message


def test_harmless_values_of_unsupported_parameters_pass() -> None:
    out = tr(n=1, logprobs=False, presence_penalty=0, response_format={"type": "text"})
    assert set(out) == {"model", "messages", "max_tokens"}


def test_unsupported_content_part_names_it() -> None:
    audio = {"type": "input_audio", "input_audio": {"data": "x", "format": "wav"}}
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.content\[0\]"):
        tr(messages=[{"role": "user", "content": [audio]}])


# -- stream decoding --------------------------------------------------------------------------


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def message_start(usage: dict[str, Any] | None = None) -> bytes:
    message = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "claude-sonnet-5-5",
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage or {"input_tokens": 25, "output_tokens": 1},
    }
    return sse("message_start", {"type": "message_start", "message": message})


def block_start(index: int, block: dict[str, Any]) -> bytes:
    return sse(
        "content_block_start",
        {"type": "content_block_start", "index": index, "content_block": block},
    )


def block_delta(index: int, delta: dict[str, Any]) -> bytes:
    return sse(
        "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
    )


def block_stop(index: int) -> bytes:
    return sse("content_block_stop", {"type": "content_block_stop", "index": index})


def message_end(stop: str, output: int) -> bytes:
    delta = {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}}
    delta["usage"] = {"output_tokens": output}
    return sse("message_delta", delta) + sse("message_stop", {"type": "message_stop"})


PING = sse("ping", {"type": "ping"})

TEXT_STREAM = (
    message_start(
        {
            "input_tokens": 10,
            "cache_creation_input_tokens": 5,
            "cache_read_input_tokens": 100,
            "output_tokens": 1,
        }
    )
    + block_start(0, {"type": "text", "text": ""})
    + PING
    + block_delta(0, {"type": "text_delta", "text": "Hello"})
    + block_delta(0, {"type": "text_delta", "text": "!"})
    + block_stop(0)
    + message_end("end_turn", 15)
)

TOOL_STREAM = (
    message_start()
    + block_start(0, {"type": "text", "text": ""})
    + block_delta(0, {"type": "text_delta", "text": "Let me check."})
    + block_stop(0)
    + block_start(1, {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {}})
    + block_delta(1, {"type": "input_json_delta", "partial_json": ""})
    + block_delta(1, {"type": "input_json_delta", "partial_json": '{"city": "Pa'})
    + block_delta(1, {"type": "input_json_delta", "partial_json": 'ris"}'})
    + block_stop(1)
    + message_end("tool_use", 40)
)

THINKING_STREAM = (
    message_start()
    + block_start(0, {"type": "thinking", "thinking": ""})
    + block_delta(0, {"type": "thinking_delta", "thinking": "Let me think"})
    + block_delta(0, {"type": "signature_delta", "signature": "EqQBCgIYAh=="})
    + block_stop(0)
    + block_start(1, {"type": "text", "text": ""})
    + block_delta(1, {"type": "text_delta", "text": "42"})
    + block_stop(1)
    + message_end("max_tokens", 3)
)


def decode(raw: bytes, *, step: int = 0, include_usage: bool = False) -> list[ChatCompletionChunk]:
    dec = AnthropicStreamDecoder(request=REQUEST, target=TARGET, include_usage=include_usage)
    out: list[ChatCompletionChunk] = []
    if step:
        for i in range(0, len(raw), step):
            out += dec.feed(raw[i : i + step])
    else:
        out += dec.feed(raw)
    out += dec.close()
    assert dec.done and dec.finished
    return out


def deltas(chunks: list[ChatCompletionChunk]) -> list[dict[str, Any]]:
    return [c.choices[0].delta.model_dump(exclude_none=True) for c in chunks if c.choices]


def test_text_stream_like_openai() -> None:
    chunks = decode(TEXT_STREAM, include_usage=True)
    assert all(type(c) is ChatCompletionChunk for c in chunks)
    assert deltas(chunks) == [
        {"role": "assistant", "content": ""},
        {"content": "Hello"},
        {"content": "!"},
        {},
    ]
    assert [c.choices[0].finish_reason for c in chunks if c.choices] == [None, None, None, "stop"]
    assert chunks[0].id == "msg_01" and chunks[0].model == "claude-sonnet-5-5"
    assert chunks[0].object == "chat.completion.chunk"
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.prompt_tokens == 115
    assert last.usage.completion_tokens == 15
    assert last.usage.total_tokens == 130
    assert last.usage.prompt_tokens_details is not None
    assert last.usage.prompt_tokens_details.cached_tokens == 100


def test_byte_by_byte_gives_the_same_chunks() -> None:
    whole = decode(TOOL_STREAM)
    split = decode(TOOL_STREAM, step=1)
    assert [c.model_dump(exclude={"created"}) for c in whole] == [
        c.model_dump(exclude={"created"}) for c in split
    ]


def test_no_usage_chunk_unless_asked() -> None:
    dec = AnthropicStreamDecoder(request=REQUEST, target=TARGET)
    chunks = dec.feed(TEXT_STREAM)
    assert all(c.choices for c in chunks)
    assert dec.text == "Hello!" and dec.tokens == 2
    assert dec.usage is not None and dec.usage["prompt_tokens"] == 115


def test_tool_use_stream() -> None:
    chunks = decode(TOOL_STREAM)
    assert deltas(chunks) == [
        {"role": "assistant", "content": ""},
        {"content": "Let me check."},
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "toolu_01",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Pa'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": 'ris"}'}}]},
        {},
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_thinking_stream_and_max_tokens() -> None:
    dec = AnthropicStreamDecoder(request=REQUEST, target=TARGET)
    chunks = dec.feed(THINKING_STREAM)
    reasoning = [c.choices[0].delta.model_extra for c in chunks]
    assert {"reasoning_content": "Let me think"} in reasoning
    assert dec.tokens == 2  # the thinking delta and the text
    assert dec.text == "42"
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("kind", "cls", "status"),
    [
        ("overloaded_error", openai.InternalServerError, 529),
        ("api_error", openai.InternalServerError, 500),
        ("rate_limit_error", openai.RateLimitError, 429),
        ("invalid_request_error", openai.BadRequestError, 400),
    ],
)
def test_error_event_raises_after_earlier_chunks(
    kind: str, cls: type[openai.APIStatusError], status: int
) -> None:
    error = {"type": "error", "error": {"type": kind, "message": "Overloaded"}}
    raw = message_start() + block_delta(0, {"type": "text_delta", "text": "Hi"})
    raw += sse("error", error)
    dec = AnthropicStreamDecoder(request=REQUEST, target=TARGET)
    chunks = dec.feed(raw)
    assert len(chunks) == 2  # nothing lost: the error comes on the next call
    with pytest.raises(cls) as info:
        dec.close()
    assert info.value.status_code == status
    assert "Overloaded" in info.value.message
    assert dec.done


def test_malformed_event() -> None:
    dec = AnthropicStreamDecoder(request=REQUEST, target=TARGET)
    with pytest.raises(MalformedStreamError):
        dec.feed(b"event: content_block_delta\ndata: {not json\n\n")


def test_unknown_events_are_ignored() -> None:
    raw = (
        message_start() + sse("future_event", {"type": "future_event"}) + message_end("end_turn", 1)
    )
    assert len(decode(raw)) == 2


# -- non-streamed -----------------------------------------------------------------------------


def test_parse_message_text_tools_thinking_usage() -> None:
    body = {
        "id": "msg_02",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5-5",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "x"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 7,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 30,
            "output_tokens": 9,
        },
    }
    done = parse_message(json.dumps(body).encode(), request=REQUEST, target=TARGET)
    assert type(done) is ChatCompletion
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking."
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.id == "toolu_1" and call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Oslo"}  # type: ignore[union-attr]
    assert (choice.message.model_extra or {})["reasoning_content"] == "hmm"
    assert done.usage is not None
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (37, 9)
    assert done.usage.prompt_tokens_details is not None
    assert done.usage.prompt_tokens_details.cached_tokens == 30


def test_parse_message_bad_json() -> None:
    with pytest.raises(MalformedResponseError, match="claude-x"):
        parse_message(b"{oops", request=REQUEST, target=TARGET)


# -- end to end through the simulator's Anthropic mode ----------------------------------------


async def _post(
    app: AnthropicSimApp, body: dict[str, Any], **extra: str
) -> tuple[httpx.Response, bytes]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
        hdrs = {**headers("test-key"), **extra}
        response = await client.post("/v1/messages", json=body, headers=hdrs)
        return response, response.content


def post(app: AnthropicSimApp, body: dict[str, Any], **extra: str) -> tuple[httpx.Response, bytes]:
    return asyncio.run(_post(app, body, **extra))


def chat(**kw: Any) -> dict[str, Any]:
    kw.setdefault("model", "claude-x")
    kw.setdefault("messages", [{"role": "user", "content": "Say something"}])
    return kw


def expected_text(body: dict[str, Any], n: int = 32) -> str:
    sent = translate_request(body, target=TARGET)
    prompt = [{"role": "user", "content": m["content"]} for m in sent["messages"]]
    return "".join(_reply.full_reply(_reply.reply_seed(sent["model"], prompt), n))


def test_end_to_end_stream_text_and_usage() -> None:
    body = chat(stream=True, stream_options={"include_usage": True})
    response, raw = post(anthropic_app(), translate_request(body, target=TARGET))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line[7:] for line in raw.decode().splitlines() if line.startswith("event: ")]
    assert events[:3] == ["message_start", "content_block_start", "ping"]
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    dec = AnthropicStreamDecoder(request=REQUEST, target=TARGET, include_usage=True)
    chunks = dec.feed(raw) + dec.close()
    assert dec.done and dec.finished
    assert dec.text == expected_text(body)
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 32
    assert chunks[-1].usage.prompt_tokens == 2 + 3


def test_end_to_end_non_stream_matches_stream() -> None:
    app = anthropic_app()
    sent = translate_request(chat(), target=TARGET)
    response, raw = post(app, sent)
    assert response.status_code == 200
    done = parse_message(raw, request=REQUEST, target=TARGET)
    assert done.choices[0].message.content == expected_text(chat())
    assert done.choices[0].finish_reason == "stop"


def test_end_to_end_prefill_continues() -> None:
    full = expected_text(chat())
    prefix = full[:20]
    body = chat(
        stream=True,
        messages=[
            {"role": "user", "content": "Say something"},
            {"role": "assistant", "content": prefix},
        ],
    )
    assert prefix.endswith(" ")  # Anthropic rejects it: stripped, then skipped in the answer
    assert prefill_whitespace(body) == " "
    app = anthropic_app()
    _, raw = post(app, translate_request(body, target=TARGET))
    assert app.requests[-1]["json"]["messages"][-1]["content"] == prefix.rstrip()
    dec = AnthropicStreamDecoder(request=REQUEST, target=TARGET, prefill_whitespace=" ")
    dec.feed(raw)
    assert dec.text and prefix + dec.text == full
    _, raw = post(app, translate_request({**body, "stream": False}, target=TARGET))
    done = parse_message(raw, request=REQUEST, target=TARGET, prefill_whitespace=" ")
    assert prefix + (done.choices[0].message.content or "") == full


def test_prefill_whitespace_skip_is_partial_safe() -> None:
    raw = message_start() + block_delta(0, {"type": "text_delta", "text": " "})
    raw += block_delta(0, {"type": "text_delta", "text": "\nnext"}) + message_end("end_turn", 2)
    dec = AnthropicStreamDecoder(request=REQUEST, target=TARGET, prefill_whitespace=" \n")
    dec.feed(raw)
    assert dec.text == "next"
    assert prefill_whitespace({"messages": [{"role": "assistant", "content": "a"}]}) == ""
    assert prefill_whitespace({"messages": [{"role": "user", "content": "a "}]}) == ""


def test_end_to_end_tool_use() -> None:
    body = chat(stream=True, tools=[WEATHER], tool_choice="required")
    _, raw = post(anthropic_app(), translate_request(body, target=TARGET))
    chunks = decode(raw)
    calls = [c.choices[0].delta.tool_calls for c in chunks if c.choices[0].delta.tool_calls]
    assert calls[0][0].function is not None and calls[0][0].function.name == "get_weather"
    args = "".join((c[0].function.arguments or "") for c in calls if c[0].function)
    assert set(json.loads(args)) == {"city"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    _, whole = post(anthropic_app(), translate_request(chat(tools=[WEATHER]), target=TARGET))
    done = parse_message(whole, request=REQUEST, target=TARGET)
    assert done.choices[0].message.tool_calls is not None
    assert done.choices[0].message.tool_calls[0].function.arguments == args  # type: ignore[union-attr]


def test_end_to_end_stop_sequence_and_max_tokens() -> None:
    full = expected_text(chat())
    stop = full.split(" ")[3]
    body = chat(stream=True, stop=[" " + stop])
    _, raw = post(anthropic_app(), translate_request(body, target=TARGET))
    dec = AnthropicStreamDecoder(request=REQUEST, target=TARGET)
    chunks = dec.feed(raw)
    assert dec.text == full[: full.index(" " + stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"
    _, raw = post(
        anthropic_app(), translate_request(chat(stream=True, max_tokens=4), target=TARGET)
    )
    chunks = decode(raw)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_end_to_end_prompt_cache_tokens() -> None:
    app = anthropic_app()
    system = [{"type": "text", "text": "long rules " * 20, "cache_control": {"type": "ephemeral"}}]
    body = chat(
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "system", "content": system}, {"role": "user", "content": "hi"}],
    )
    usages = []
    for _ in range(2):
        _, raw = post(app, translate_request(body, target=TARGET))
        usages.append(decode(raw, include_usage=True)[-1].usage)
    first, second = usages
    assert first is not None and second is not None
    assert first.prompt_tokens == second.prompt_tokens
    assert first.prompt_tokens_details is not None and second.prompt_tokens_details is not None
    assert first.prompt_tokens_details.cached_tokens == 0
    assert second.prompt_tokens_details.cached_tokens == 40


def test_sim_errors_in_anthropic_format() -> None:
    app = anthropic_app()
    sent = translate_request(chat(), target=TARGET)
    response, raw = post(app, sent, **{"x-api-key": ""})
    assert response.status_code == 401
    assert json.loads(raw)["error"]["type"] == "authentication_error"
    response, raw = post(app, {"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 400
    assert json.loads(raw) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }
    for fault, status, kind in [
        ("429", 429, "rate_limit_error"),
        ("500", 500, "api_error"),
        ("503", 529, "overloaded_error"),
    ]:
        response, raw = post(app, sent, **{"x-sim-fault": fault})
        assert response.status_code == status
        assert json.loads(raw)["error"]["type"] == kind
        assert response.headers["request-id"].startswith("req_")


def test_sim_in_stream_error_event() -> None:
    sent = translate_request(chat(stream=True), target=TARGET)
    _, raw = post(anthropic_app(), sent, **{"x-sim-fault": "stream-error:3"})
    assert b"event: error\n" in raw
    dec = AnthropicStreamDecoder(request=REQUEST, target=TARGET)
    chunks = dec.feed(raw)
    assert len(chunks) == 4  # role chunk and three tokens
    with pytest.raises(openai.InternalServerError) as info:
        dec.close()
    assert info.value.status_code == 529


async def _raw_call(app: AnthropicSimApp, body: dict[str, Any], **extra: str) -> bytes:
    """Drive the ASGI app by hand: a dropped stream never completes its response."""
    hdrs = {**headers("k"), **extra}
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/messages",
        "headers": [(k.encode(), v.encode()) for k, v in hdrs.items()],
    }
    sent = [json.dumps(body).encode()]
    parts: list[bytes] = []

    async def receive() -> dict[str, Any]:
        if sent:
            return {"type": "http.request", "body": sent.pop(), "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    await app(scope, receive, send)
    return b"".join(parts)


def test_sim_fault_times_and_drop() -> None:
    app = anthropic_app(Profile(reply_tokens=8))
    sent = translate_request(chat(stream=True), target=TARGET)
    hdrs = {"x-sim-fault": "drop:2", "x-sim-fault-times": "1"}
    raw = asyncio.run(_raw_call(app, sent, **hdrs))
    dec = AnthropicStreamDecoder(request=REQUEST, target=TARGET)
    dec.feed(raw)
    dec.close()
    assert not dec.done and dec.tokens == 2
    _, raw = post(app, sent, **hdrs)
    assert len(decode(raw)) == 1 + 8 + 1


async def _served_stream(
    profile: Profile, body: dict[str, Any], arrivals: list[str]
) -> tuple[str, Any]:
    """Serve the app with hypercorn on 127.0.0.1 and decode a stream as its bytes arrive, each
    token's text appended to ``arrivals`` as it is decoded."""
    from llmroute.testing._server import _listen, _serve

    app = anthropic_app(profile)
    sock = _listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    shutdown = asyncio.Event()
    server = asyncio.create_task(_serve(app, sock, tls=False, http2=False, shutdown=shutdown))  # type: ignore[arg-type]
    try:
        dec = AnthropicStreamDecoder(request=REQUEST, target=TARGET, include_usage=True)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            for _ in range(100):
                try:
                    await client.get("/")
                    break
                except httpx.ConnectError:
                    await asyncio.sleep(0.01)
            sent = translate_request(body, target=TARGET)
            hdrs = headers("k")
            async with client.stream("POST", "/v1/messages", json=sent, headers=hdrs) as response:
                async for data in response.aiter_raw():
                    for chunk in dec.feed(data):
                        if chunk.choices and chunk.choices[0].delta.content:
                            arrivals.append(chunk.choices[0].delta.content)
                dec.close()
        assert dec.done and dec.finished
        return dec.text, dec.usage
    finally:
        shutdown.set()
        await server


def test_served_by_hypercorn_streams_without_buffering(monkeypatch: pytest.MonkeyPatch) -> None:
    body = chat(stream=True)
    profile = Profile(reply_tokens=6, inter_token=0.03)
    arrivals: list[str] = []
    decoded_before: list[int] = []  # tokens the client had decoded at each pause between tokens
    real = _stream.pause
    pauses = 0  # the first is the TTFT; before pause k (k >= 1), k tokens were sent

    async def lockstep(seconds: float, gone: asyncio.Event) -> bool:
        nonlocal pauses
        if pauses:  # every token sent so far must reach the client before the next is sent
            for _ in range(1000):  # a hang guard only (10 s): buffered tokens never arrive
                if len(arrivals) >= pauses:
                    break
                await asyncio.sleep(0.01)
            decoded_before.append(len(arrivals))
        pauses += 1
        return await real(seconds, gone)

    monkeypatch.setattr(_stream, "pause", lockstep)  # the TTFT (the streamed answer)
    monkeypatch.setattr(_wire, "pause", lockstep)  # between tokens
    text, usage = asyncio.run(_served_stream(profile, body, arrivals))
    assert text == expected_text(body, 6)
    assert len(arrivals) == 6
    # Tokens arrived one by one, each before the next was sent, not all at the end.
    assert decoded_before == [1, 2, 3, 4, 5]
    assert usage["completion_tokens"] == 6


def test_handle_mounts_in_another_app() -> None:
    sim = anthropic_app()

    async def outer(scope: dict[str, Any], receive: Any, send: Any) -> None:
        message = await receive()
        await sim.handle(scope, message.get("body", b""), receive, send)

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=outer)
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
            sent = translate_request(chat(), target=TARGET)
            return await client.post("/v1/messages", json=sent, headers=headers("k"))

    response = asyncio.run(run())
    assert response.status_code == 200 and response.json()["type"] == "message"


async def _cancel_hang(hangs: list[bool]) -> bool:
    """Start a hanging stream and leave it; whether the hang ended (``hangs`` gets how each
    one did) before the server was told to stop."""
    from llmroute.testing._server import _listen, _serve

    app = anthropic_app(Profile(hang_max=600.0))
    sock = _listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    shutdown = asyncio.Event()
    server = asyncio.create_task(_serve(app, sock, tls=False, http2=False, shutdown=shutdown))  # type: ignore[arg-type]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            for _ in range(100):
                try:
                    await client.get("/")
                    break
                except httpx.ConnectError:
                    await asyncio.sleep(0.01)
            sent = translate_request(chat(stream=True), target=TARGET)
            hdrs = {**headers("k"), "x-sim-fault": "hang"}
            async with client.stream("POST", "/v1/messages", json=sent, headers=hdrs) as response:
                assert response.status_code == 200
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.2):
                        await response.aread()
        for _ in range(1000):  # a hang guard only (10 s): the hang itself lasts 600 s
            if hangs:
                break
            await asyncio.sleep(0.01)
        return bool(hangs)
    finally:
        shutdown.set()
        await server


def test_client_going_away_ends_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    hangs: list[bool] = []
    real = _stream.pause

    async def recording(seconds: float, gone: asyncio.Event) -> bool:
        ended_early = await real(seconds, gone)
        if seconds == 600.0:
            hangs.append(ended_early)
        return ended_early

    monkeypatch.setattr(_stream, "pause", recording)
    assert asyncio.run(_cancel_hang(hangs))
    assert hangs == [True]  # cut short by the client leaving, not the 600 s hang_max


def test_thinking_budget_and_max_tokens_agree() -> None:
    from llmroute.protocols.anthropic import DEFAULT_MAX_TOKENS, translate_request

    base = {"model": "c", "messages": [{"role": "user", "content": "hi"}]}
    thinking = {"type": "enabled", "budget_tokens": 8000}
    out = translate_request({**base, "thinking": thinking}, target="claude:c")
    assert out["max_tokens"] == 8000 + DEFAULT_MAX_TOKENS
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        translate_request({**base, "thinking": thinking, "max_tokens": 100}, target="claude:c")
    assert translate_request({**base, "max_tokens": 100}, target="claude:c")["max_tokens"] == 100
