"""Cache keys and entries: pure functions, no I/O."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmroute.cache import CacheEntry, CorruptEntry, is_deterministic, request_key, tenant_namespace
from llmroute.protocols.openai import build_chunk

from ..conftest import KEY

BODY: dict[str, Any] = {
    "model": "gpt-x",
    "messages": [{"role": "user", "content": "hi"}],
    "temperature": 0,
}


def key(body: dict[str, Any], namespace: str = "ns") -> str:
    return request_key(body, model=body["model"], namespace=namespace)


@pytest.mark.parametrize(
    "change",
    [
        {"stream": True},
        {"stream_options": {"include_usage": True}},
        {"user": "someone"},
        {"metadata": {"trace": "1"}},
        {"store": True},
        {"service_tier": "flex"},
        {"prompt_cache_key": "abc"},
        {"temperature": 0.0},
    ],
)
def test_key_ignores_what_does_not_change_the_answer(change: dict[str, Any]) -> None:
    assert key({**BODY, **change}) == key(BODY)


@pytest.mark.parametrize(
    "change",
    [
        {"messages": [{"role": "user", "content": "hi!"}]},
        {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]},
        {"temperature": 0.5},
        {"top_p": 0.9},
        {"seed": 7},
        {"max_tokens": 10},
        {"n": 2},
        {"stop": ["\n"]},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
        {"tool_choice": "none"},
        {"response_format": {"type": "json_object"}},
        {"logprobs": True},
        {"some_vendor_parameter": 1},
        {"model": "gpt-y"},
    ],
)
def test_key_covers_what_changes_the_answer(change: dict[str, Any]) -> None:
    assert key({**BODY, **change}) != key(BODY)


def test_key_is_independent_of_field_order_and_namespaced() -> None:
    reordered = dict(reversed(list(BODY.items())))
    assert key(reordered) == key(BODY)
    assert key(BODY, "tenant-a") != key(BODY, "tenant-b")
    assert key(BODY).startswith("ns/")


def test_tenant_namespace_is_a_one_way_hash_of_the_keys() -> None:
    namespace = tenant_namespace(KEY)
    assert KEY not in namespace and KEY[:8] not in namespace
    assert namespace == tenant_namespace(KEY)
    assert namespace != tenant_namespace(KEY + "x")
    assert tenant_namespace("a", "b") != tenant_namespace("ab")


def test_deterministic_means_temperature_zero_or_a_seed() -> None:
    assert is_deterministic({"temperature": 0})
    assert is_deterministic({"temperature": 0.0})
    assert is_deterministic({"temperature": 1, "seed": 3})
    assert not is_deterministic({})
    assert not is_deterministic({"temperature": 0.2})


# -- entries ---------------------------------------------------------------------------------


def chunk(delta: dict[str, Any], finish: str | None = None, **top: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "m",
        "system_fingerprint": "fp",
        "choices": [choice],
        **top,
    }


USAGE = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
STREAM = [
    chunk({"role": "assistant", "content": ""}, usage=None),
    chunk({"reasoning_content": "Think"}, usage=None),
    chunk({"reasoning_content": "ing."}, usage=None),
    chunk({"content": "Hello"}, usage=None),
    chunk({"content": " world"}, usage=None),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "f", "arguments": ""},
                }
            ]
        },
        usage=None,
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}, usage=None),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}, usage=None),
    chunk({}, "tool_calls", usage=None),
    {**chunk({}), "choices": [], "usage": USAGE},
]


def stream_entry(chunks: list[dict[str, Any]] = STREAM) -> CacheEntry:
    built = [build_chunk(json.loads(json.dumps(c))) for c in chunks]
    return CacheEntry.from_chunks("ns/k", built, [0.01 * i for i in range(len(built))], "p:m")


def test_a_stream_entry_replays_its_chunks_exactly() -> None:
    entry = CacheEntry.decode(stream_entry().encode(), "ns/k")
    replayed = [c.to_dict() for _, c in entry.replay_chunks(include_usage=True)]
    assert replayed == STREAM
    offsets = [t for t, _ in entry.replay_chunks(include_usage=True)]
    assert offsets == pytest.approx([0.01 * i for i in range(len(STREAM))])


def test_without_usage_the_usage_chunk_and_fields_are_left_out() -> None:
    replayed = [c.to_dict() for _, c in stream_entry().replay_chunks(include_usage=False)]
    assert len(replayed) == len(STREAM) - 1
    assert all("usage" not in c for c in replayed)


def test_a_stream_entry_folds_into_the_completion() -> None:
    completion = stream_entry().replay_completion()
    assert completion.object == "chat.completion"
    assert completion.id == "chatcmpl-1" and completion.system_fingerprint == "fp"
    message = completion.choices[0].message
    assert message.content == "Hello world"
    assert message.model_extra == {"reasoning_content": "Thinking."}
    assert message.tool_calls is not None
    call = message.tool_calls[0]
    assert (call.id, call.function.name, call.function.arguments) == ("call_1", "f", '{"a": 1}')  # type: ignore[union-attr]
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.usage is not None and completion.usage.total_tokens == 9


def test_a_completion_entry_unfolds_into_a_stream_that_folds_back() -> None:
    folded = stream_entry().replay_completion()
    entry = CacheEntry.from_completion("ns/k", folded, None)
    chunks = [c for _, c in entry.replay_chunks(include_usage=True)]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 2  # not one burst
    refolded = CacheEntry.from_chunks("ns/k", chunks, [0.0] * len(chunks), None)
    assert refolded.replay_completion().to_dict() == folded.to_dict()
    without = [c for _, c in entry.replay_chunks(include_usage=False)]
    assert all(c.choices for c in without) and all(c.usage is None for c in without)


def test_logprobs_unfold_one_token_per_chunk() -> None:
    tokens = [
        {"token": t, "logprob": -0.1, "bytes": None, "top_logprobs": []} for t in ("Hi", " there")
    ]
    completion = {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hi there"},
                "finish_reason": "stop",
                "logprobs": {"content": tokens, "refusal": None},
            }
        ],
        "usage": USAGE,
    }
    entry = CacheEntry.decode(
        json.dumps({"v": 1, "key": "k", "created": 1, "completion": completion}).encode(), "k"
    )
    chunks = [c for _, c in entry.replay_chunks(include_usage=False)]
    content = [c for c in chunks if c.choices[0].delta.content]
    assert [c.choices[0].delta.content for c in content] == ["Hi", " there"]
    assert [c.choices[0].logprobs.content[0].token for c in content] == ["Hi", " there"]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xff\xfe",
        b"[]",
        b'{"v": 2, "key": "ns/k", "created": 1, "completion": {"choices": []}}',
        b'{"v": 1, "key": "ns/other", "created": 1, "completion": {"choices": []}}',
        b'{"v": 1, "key": "ns/k", "created": 1}',
        b'{"v": 1, "key": "ns/k", "created": 1, "chunks": [], "offsets": []}',
        b'{"v": 1, "key": "ns/k", "created": 1, "chunks": [{"choices": []}], "offsets": []}',
        b'{"v": 1, "key": "ns/k", "created": 1, "chunks": [{"x": 1}], "offsets": [0]}',
        b'{"v": 1, "key": "ns/k", "created": "x", "completion": {"choices": []}}',
    ],
)
def test_a_damaged_entry_is_refused(raw: bytes) -> None:
    with pytest.raises(CorruptEntry):
        CacheEntry.decode(raw, "ns/k")


def test_has_usage() -> None:
    assert stream_entry().has_usage
    assert not stream_entry(STREAM[:-1]).has_usage


@pytest.mark.parametrize(
    "raw",
    [
        b'{"v": 1, "key": "ns/k", "created": 1, "completion": {"choices": ["x"]}}',
        b'{"v": 1, "key": "ns/k", "created": 1, "completion": {"choices": [{"message": 3}]}}',
        b'{"v": 1, "key": "ns/k", "created": 1, "chunks": [{"choices": [7]}], "offsets": [0]}',
        b'{"v": 1, "key": "ns/k", "created": 1, "chunks": [{"choices": [{"index": "0"}]}], '
        b'"offsets": [0]}',
    ],
)
def test_valid_json_of_the_wrong_shape_is_refused(raw: bytes) -> None:
    with pytest.raises(CorruptEntry):
        CacheEntry.decode(raw, "ns/k")


def test_a_tool_call_only_answer_folds_with_no_content() -> None:
    calls_only = [STREAM[0], *STREAM[5:]]
    message = stream_entry(calls_only).replay_completion().choices[0].message
    assert message.content is None and message.tool_calls
