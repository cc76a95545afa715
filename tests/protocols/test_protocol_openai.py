from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import httpx
import openai
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import _base_client
from openai._models import construct_type
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat.chat_completion_chunk import Choice, ChoiceDelta, ChoiceDeltaToolCall
from openai.types.completion_usage import CompletionUsage

from llmroute._errors import MalformedStreamError
from llmroute.protocols.openai import (
    ChatStreamDecoder,
    MalformedResponseError,
    build_chunk,
    is_preamble_chunk,
    is_token_chunk,
    parse_chat_completion,
)

# The HTTP library the installed openai is built on (httpx2 from openai 3.0, httpx before):
# openai's own stream reader is handed its own request and response types.
openai_http: Any = getattr(_base_client, "httpx2", None) or _base_client.httpx

REQUEST = httpx.Request("POST", "https://api.example.com/v1/chat/completions")
TARGET = "example:gpt-x"

BASE = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1718000000, "model": "m"}


def chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, **top: Any
) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}
    return {**BASE, "system_fingerprint": "fp_1", "choices": [choice], **top}


USAGE = {
    "prompt_tokens": 10,
    "completion_tokens": 20,
    "total_tokens": 30,
    "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 5, "audio_tokens": 0},
}
TOOL_START = {
    "tool_calls": [
        {
            "index": 0,
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": ""},
        }
    ]
}
TOOL_ARGS = {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Par'}}]}

RECORDED: list[Any] = [
    chunk({"role": "assistant", "content": "", "refusal": None}, obfuscation="abc"),
    chunk({"content": "Hello"}),
    chunk({"content": " wörld 😀"}, service_tier="default"),
    chunk({}, "stop"),
    {**BASE, "choices": [], "usage": USAGE},
    chunk({}, usage=None),
    chunk(TOOL_START),
    chunk(TOOL_ARGS),
    chunk({}, "tool_calls"),
    chunk({"content": None, "reasoning_content": "Let me think"}),
    chunk({"reasoning": "hmm", "content": ""}),
    # vendors' extra fields and values outside openai's literals
    chunk(
        {"content": "x", "x_vendor": {"a": [1, 2]}}, x_groq={"id": "req_1"}, prompt_logprobs=None
    ),
    chunk({"role": "model", "content": "x"}, "eos", service_tier="premium"),
    chunk({"content": "x"}, "stop", usage={**USAGE, "extra_usage": 1, "prompt_tokens": "10"}),
    chunk({"content": "x"}, usage={"prompt_tokens": 1}),
    chunk(
        {"content": "x"}, usage={**USAGE, "completion_tokens_details": {"reasoning_tokens": 1.0}}
    ),
    chunk({"tool_calls": [{"index": 0, "type": "custom", "function": {"name": "f"}}]}),
    chunk({"tool_calls": [{"index": "0", "function": {"arguments": "{}"}}]}),
    chunk({"tool_calls": [{"function": {"arguments": "{}"}}]}),
    chunk({"tool_calls": [{"index": True}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}", "x": 1}, "y": None}]}),
    chunk({"tool_calls": []}),
    chunk({"tool_calls": [None]}),
    chunk({"function_call": {"name": "f", "arguments": "{}"}}),
    chunk({"audio": {"id": "a1", "data": "AAAA", "transcript": "hi"}}),
    chunk(
        {"content": "x"},
        choices_extra=1,
        **{
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": "x"},
                    "logprobs": {
                        "content": [
                            {"token": "x", "logprob": -0.5, "bytes": [120], "top_logprobs": []}
                        ]
                    },
                }
            ]
        },
    ),
    chunk({"content": 5}),
    chunk({"content": ["a"]}),
    {**BASE, "choices": [{"index": 0, "delta": "oops"}]},
    {**BASE, "choices": [{"index": 0, "delta": [{"content": "x"}]}]},
    {**BASE, "choices": {"index": 0}},
    {**BASE, "choices": ["x"]},
    {**BASE, "created": "yesterday", "id": 5, "object": "chat.completion"},
    {**BASE, "choices": [{"index": 0, "delta": {"content": "x", "_fields_set": None}}]},
    {"choices": [{"delta": {"content": "partial"}}]},
    {},
    [{"id": "a list"}],
    "a string",
    17,
]


def deep_same(ours: Any, theirs: Any) -> None:
    """Same types all the way down, same fields, extras and fields-set, not just ``==``."""
    assert type(ours) is type(theirs), (ours, theirs)
    if isinstance(ours, pydantic.BaseModel):
        assert ours.__dict__.keys() == theirs.__dict__.keys()
        for key in ours.__dict__:
            deep_same(ours.__dict__[key], theirs.__dict__[key])
        deep_same(ours.__pydantic_extra__, theirs.__pydantic_extra__)
        assert ours.model_fields_set == theirs.model_fields_set
        assert ours.__pydantic_private__ == theirs.__pydantic_private__
        assert ours == theirs
        assert ours.model_dump(warnings=False) == theirs.model_dump(warnings=False)
        assert ours.to_json(warnings=False) == theirs.to_json(warnings=False)
    elif isinstance(ours, dict):
        assert list(ours) == list(theirs)
        for key in ours:
            deep_same(ours[key], theirs[key])
    elif isinstance(ours, list):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            deep_same(a, b)
    elif isinstance(ours, float) and math.isnan(ours):
        assert math.isnan(theirs)
    else:
        assert ours == theirs


def openai_stream(body: bytes) -> list[Any]:
    """What openai's own AsyncStream yields for this body; an exception is the last item."""

    async def run() -> list[Any]:
        client = openai.AsyncOpenAI(api_key="x", base_url="http://t/v1")
        request = openai_http.Request("POST", "http://t/v1/chat/completions")
        response = openai_http.Response(200, content=body, request=request)
        stream = openai.AsyncStream(cast_to=ChatCompletionChunk, response=response, client=client)
        out: list[Any] = []
        try:
            async for item in stream:
                out.append(item)
        except Exception as exc:
            out.append(exc)
        finally:
            await client.close()
        return out

    return asyncio.run(run())


def ours(body: bytes, step: int | None = None) -> list[Any]:
    decoder = ChatStreamDecoder(request=REQUEST, target=TARGET)
    out: list[Any] = []
    step = step or len(body) or 1
    try:
        for i in range(0, len(body), step):
            out += decoder.feed(body[i : i + step])
        out += decoder.close()
    except Exception as exc:
        out.append(exc)
    return out


def sse(*events: Any, done: bool = True) -> bytes:
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return body + (b"data: [DONE]\n\n" if done else b"")


@pytest.mark.parametrize("data", RECORDED, ids=range(len(RECORDED)))
def test_chunk_equals_openai_construction(data: Any) -> None:
    deep_same(
        build_chunk(json.loads(json.dumps(data))),
        construct_type(type_=ChatCompletionChunk, value=data),
    )


def test_recorded_stream_equals_openai_stream() -> None:
    body = sse(*(d for d in RECORDED if isinstance(d, dict)))
    expected = openai_stream(body)
    deep_same(ours(body), expected)
    deep_same(ours(body, step=7), expected)


def test_nested_objects_are_openai_models() -> None:
    first, _, usage = ours(
        sse(chunk(TOOL_START), chunk({"content": "x"}), {**BASE, "choices": [], "usage": USAGE})
    )
    assert isinstance(first.choices[0], Choice)
    assert isinstance(first.choices[0].delta, ChoiceDelta)
    assert isinstance(first.choices[0].delta.tool_calls[0], ChoiceDeltaToolCall)
    assert first.choices[0].delta.tool_calls[0].function.name == "get_weather"
    assert isinstance(usage.usage, CompletionUsage)
    assert usage.usage.completion_tokens_details.reasoning_tokens == 5


def test_content_stream_tracks_text_tokens_and_finish() -> None:
    decoder = ChatStreamDecoder(request=REQUEST, target=TARGET)
    body = sse(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo"}),
        chunk({}, "stop"),
        {**BASE, "choices": [], "usage": USAGE},
    )
    chunks = decoder.feed(body)
    assert [is_token_chunk(c) for c in chunks] == [False, True, True, False, False]
    assert (decoder.text, decoder.tokens, decoder.finished, decoder.done) == (
        "Hello",
        2,
        True,
        True,
    )
    assert chunks[-1].usage.total_tokens == 30
    assert decoder.feed(sse(chunk({"content": "after done"}))) == []
    assert decoder.close() == []


def test_tool_call_and_reasoning_deltas_are_tokens() -> None:
    decoder = ChatStreamDecoder(request=REQUEST, target=TARGET)
    chunks = decoder.feed(
        sse(
            chunk(TOOL_START),
            chunk(TOOL_ARGS),
            chunk({"content": None, "reasoning_content": "think"}),
            chunk({"reasoning": "more"}),
            chunk({"refusal": "no"}),
            chunk({"reasoning_content": ""}),
            chunk({}, "tool_calls"),
        )
    )
    assert [is_token_chunk(c) for c in chunks] == [True, True, True, True, True, False, False]
    assert (decoder.tokens, decoder.text, decoder.finished) == (5, "", True)
    assert chunks[2].choices[0].delta.model_extra == {"reasoning_content": "think"}


def test_unknown_fields_are_kept() -> None:
    (c,) = ours(sse(chunk({"content": "x", "x_vendor": 1}, x_groq={"id": "q"}), done=False))
    assert c.x_groq == {"id": "q"}
    assert c.model_extra == {"x_groq": {"id": "q"}}
    assert c.choices[0].delta.x_vendor == 1
    assert c.model_dump()["x_groq"] == {"id": "q"}


@pytest.mark.parametrize(
    "error",
    [
        {"message": "The server had an error", "type": "server_error", "param": None, "code": 500},
        {"message": "", "type": "x"},
        {"message": 5},
        "a plain string",
        ["list"],
        {"code": "overloaded"},
    ],
)
def test_in_stream_error_raises_like_openai(error: Any) -> None:
    body = sse(chunk({"content": "partial"}), {"error": error}, chunk({"content": "never"}))
    expected = openai_stream(body)
    got = ours(body)
    assert len(got) == len(expected) == 2
    deep_same(got[0], expected[0])
    assert type(got[1]) is openai.APIError
    assert type(expected[1]) is openai.APIError
    for attr in ("message", "body", "code", "param", "type", "args"):
        assert getattr(got[1], attr) == getattr(expected[1], attr), attr
    assert got[1].request is REQUEST


def test_falsy_error_member_is_a_chunk_like_openai() -> None:
    body = sse({**chunk({"content": "x"}), "error": None}, {**chunk({}), "error": {}})
    deep_same(ours(body), openai_stream(body))


def test_error_after_chunks_in_one_feed_is_raised_on_next_call() -> None:
    decoder = ChatStreamDecoder(request=REQUEST, target=TARGET)
    (first,) = decoder.feed(
        sse(chunk({"content": "a"}), {"error": {"message": "late"}}, done=False)
    )
    assert first.choices[0].delta.content == "a"
    with pytest.raises(openai.APIError, match="late"):
        decoder.feed(b"")
    assert decoder.feed(b"data: {}\n\n") == []


def test_events_named_error_and_thread_events_follow_openai() -> None:
    body = (
        b'event: error\ndata: {"message": "not under an error key"}\n\n'
        b'event: thread.run.created\ndata: {"id": "run_1", "error": {"message": "ignored"}}\n\n'
        b'event: error\ndata: {"error": {"message": "named error"}}\n\n'
    )
    expected = openai_stream(body)
    got = ours(body)
    deep_same(got[:2], expected[:2])
    assert got[1].model_extra == {
        "data": {"id": "run_1", "error": {"message": "ignored"}},
        "event": "thread.run.created",
    }
    assert (type(got[2]), got[2].message, got[2].body) == (
        type(expected[2]),
        "named error",
        {"message": "named error"},
    )


def test_done_stops_the_stream() -> None:
    body = sse(chunk({"content": "a"})) + b"data: not json at all\n\n"
    assert len(openai_stream(body)) == 1
    decoder = ChatStreamDecoder(request=REQUEST, target=TARGET)
    assert len(decoder.feed(body)) == 1
    assert decoder.done
    assert decoder.feed(b"data: garbage\n\n") == []
    assert ours(b"data: [DONE] trailing\n\n") == []


def test_null_data_yields_none_like_openai() -> None:
    body = b"data: null\n\n"
    assert ours(body) == openai_stream(body) == [None]


def test_malformed_line_names_target_and_quotes_it() -> None:
    with pytest.raises(MalformedStreamError) as info:
        ChatStreamDecoder(request=REQUEST, target=TARGET).feed(b'data: {"id": tru\n\n')
    err = info.value
    assert isinstance(err, openai.APIError)
    assert err.target == TARGET and err.line == '{"id": tru'
    assert TARGET in err.message and "'{\"id\": tru'" in err.message
    assert err.request is REQUEST


def test_malformed_long_line_is_truncated_in_the_message() -> None:
    line = '{"content": "' + "x" * 5000
    with pytest.raises(MalformedStreamError) as info:
        ChatStreamDecoder(request=REQUEST, target=TARGET).feed(f"data: {line}\n\n".encode())
    assert len(info.value.message) < 400
    assert "5013 characters" in info.value.message
    assert info.value.line == line


def test_malformed_after_good_chunks_is_deferred() -> None:
    got = ours(
        sse(chunk({"content": "ok"}), done=False)
        + b"data: {bad\n\n"
        + sse(chunk({"content": "no"}))
    )
    assert [type(x) for x in got] == [ChatCompletionChunk, MalformedStreamError]


def test_undecodable_bytes_raise_malformed() -> None:
    with pytest.raises(MalformedStreamError, match="UTF-8"):
        ChatStreamDecoder(request=REQUEST, target=TARGET).feed(b"data: \xff\n\n")


def test_lone_surrogate_escape_decodes_like_json() -> None:
    body = b'data: {"id": "\\ud800", "choices": []}\n\n'
    (got,), (expected,) = ours(body), openai_stream(body)
    assert got == expected and got.id == "\ud800"


@pytest.mark.parametrize("step", [1, 2, 3, 5, 64])
def test_events_split_across_byte_boundaries(step: int) -> None:
    body = sse(chunk({"content": "日本語"}), chunk(TOOL_ARGS), chunk({}, "stop")).replace(
        b"\n", b"\r\n"
    )
    expected = openai_stream(body)
    assert len(expected) == 3
    deep_same(ours(body, step=step), expected)


def test_unterminated_last_event_is_discarded_like_openai() -> None:
    body = sse(chunk({"content": "a"}), done=False) + b'data: {"id": "x", "choices": []}\n'
    expected = openai_stream(body)
    assert len(expected) == 1
    deep_same(ours(body), expected)


# The fast construction against openai's, on random chunk-like data.

_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False), st.text(max_size=5)
)
_json = st.recursive(
    _scalar,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(strategy, strategy, strategy, _json)


def _fields(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    extra = st.dictionaries(
        st.sampled_from(["x_vendor", "reasoning_content", "_private"]), _json, max_size=1
    )
    return st.fixed_dictionaries({}, optional={k: _maybe(v) for k, v in fields.items()}).flatmap(
        lambda d: extra.map(lambda e: {**d, **e})
    )


_function = _fields(name=st.text(max_size=3), arguments=st.text(max_size=3))
_tool = _fields(
    index=st.integers(0, 2),
    id=st.text(max_size=3),
    type=st.sampled_from(["function", "custom"]),
    function=_function,
)
_delta = _fields(
    content=st.text(max_size=5),
    role=st.sampled_from(["assistant", "model"]),
    refusal=st.text(max_size=3),
    tool_calls=st.lists(_tool, max_size=2),
)
_choice = _fields(
    index=st.integers(0, 2),
    delta=_delta,
    finish_reason=st.sampled_from(["stop", "length", "eos"]),
    logprobs=_json,
)
_usage = _fields(
    prompt_tokens=st.integers(0, 9),
    completion_tokens=st.integers(0, 9),
    total_tokens=st.integers(0, 9),
    prompt_tokens_details=_fields(cached_tokens=st.integers(0, 9)),
)
_chunk = _fields(
    id=st.text(max_size=3),
    object=st.just("chat.completion.chunk"),
    created=st.integers(0, 9),
    model=st.text(max_size=3),
    choices=st.lists(_choice, max_size=2),
    usage=_usage,
    service_tier=st.sampled_from(["default", "odd"]),
    system_fingerprint=st.text(max_size=3),
)


@settings(max_examples=400, deadline=None)
@given(_chunk)
def test_fast_construction_matches_openai_on_random_chunks(data: dict[str, Any]) -> None:
    expected = construct_type(type_=ChatCompletionChunk, value=json.loads(json.dumps(data)))
    deep_same(build_chunk(json.loads(json.dumps(data))), expected)


# Non-streamed responses.

COMPLETION = {
    "id": "chatcmpl-2",
    "object": "chat.completion",
    "created": 1718000000,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hi", "refusal": None, "x_vendor": 1},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": USAGE,
    "x_extra": True,
}


def test_parse_chat_completion_equals_openai() -> None:
    raw = json.dumps(COMPLETION).encode()
    got = parse_chat_completion(raw, request=REQUEST, target=TARGET)
    assert isinstance(got, ChatCompletion)
    deep_same(got, construct_type(type_=ChatCompletion, value=json.loads(raw)))
    assert got.choices[0].message.content == "Hi"


@pytest.mark.parametrize("raw", [b"<html>Bad gateway</html>", b"", b'{"id": ', b"\xff\xfe{"])
def test_parse_chat_completion_invalid_json(raw: bytes) -> None:
    response = httpx.Response(200, request=REQUEST)
    with pytest.raises(MalformedResponseError) as info:
        parse_chat_completion(raw, request=REQUEST, target=TARGET, response=response)
    err = info.value
    assert isinstance(err, openai.APIResponseValidationError)
    assert isinstance(err, json.JSONDecodeError)  # what openai itself raises here
    assert TARGET in str(err) and TARGET in err.message
    assert err.status_code == 200 and err.response is response and err.request is REQUEST
    assert err.target == TARGET


def test_parse_chat_completion_truncates_long_bodies() -> None:
    with pytest.raises(MalformedResponseError) as info:
        parse_chat_completion(b"x" * 10_000, request=REQUEST, target=TARGET)
    assert len(str(info.value)) < 400
    assert info.value.status_code == 200


def test_with_several_choices_finished_waits_for_every_choice() -> None:
    def choice(index: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**BASE, "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}

    decoder = ChatStreamDecoder(request=REQUEST, target=TARGET)
    decoder.feed(sse(choice(0, {"content": "a"}), choice(1, {"content": "b"}), done=False))
    decoder.feed(sse(choice(0, {}, "stop"), done=False))
    assert not decoder.finished  # choice 1 is still mid-answer
    decoder.feed(sse(choice(1, {}, "stop"), done=False))
    assert decoder.finished


def test_preamble_chunks_are_only_openers() -> None:
    decoder = ChatStreamDecoder(request=REQUEST, target=TARGET)
    role, token, finish, usage = decoder.feed(
        sse(
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Hi"}),
            chunk({}, "stop"),
            {**BASE, "choices": [], "usage": USAGE},
        )
    )
    assert [is_preamble_chunk(c) for c in (role, token, finish, usage)] == [
        True,
        False,
        False,
        False,
    ]


def test_a_model_with_typed_extras_is_left_to_openais_construction() -> None:
    """Typed extras are converted by validation, so such a model (or a subclass of one) is
    not built by llmroute's shapes; openai's models, whose extras are untyped, are, and are
    recognised without building their deferred schema."""
    from openai._models import BaseModel

    from llmroute.protocols.openai import _supported

    class Typed(BaseModel):
        __pydantic_extra__: dict[str, int]  # pyright: ignore[reportIncompatibleVariableOverride]
        a: int | None = None

    class Below(Typed):
        b: str | None = None

    assert not _supported(Typed) and not _supported(Below)
    assert _supported(ChatCompletionChunk) and _supported(Choice) and _supported(ChoiceDelta)
