"""One adapter per wire protocol: every protocol the catalog names has one, and each holds its
protocol's rules (the routing, the gateway's upstream and the command line ask it, never the
protocol's name). And the one stream reader every stream is read with."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from llmroute._catalog import load_catalog
from llmroute._types import Timings
from llmroute.protocols import PROTOCOLS, adapter_for
from llmroute.protocols.anthropic import AnthropicStreamDecoder
from llmroute.protocols.openai import ChatStreamDecoder, ResponsesStreamDecoder
from llmroute.protocols.reader import StreamReader

from ..clock import FakeClock

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
REQUEST = httpx.Request("POST", "https://example.invalid/v1/chat/completions")


def test_every_protocol_of_the_catalog_has_an_adapter() -> None:
    named = {spec.protocol for spec in load_catalog().values()}
    assert named == set(PROTOCOLS)  # none missing, none unused
    for name in named:
        assert adapter_for(name).name == name


def test_an_unknown_protocol_is_named_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown wire protocol 'grpc'.*openai, anthropic"):
        adapter_for("grpc")


def test_the_openai_adapter_sends_bodies_as_written() -> None:
    adapter = adapter_for("openai")
    assert adapter.speaks_openai and adapter.stream_usage and not adapter.translates
    assert adapter.serves("responses") and adapter.serves("embeddings")
    assert adapter.wire_request("chat/completions", BODY, target="t") == ("chat/completions", BODY)
    headers = adapter.headers("sk-1", user_agent="ua", configured={"X-Team": "a"})
    assert headers["Authorization"] == "Bearer sk-1" and headers["X-Team"] == "a"
    assert "Authorization" not in adapter.headers(None, user_agent="ua", configured={})
    body = dict(BODY, max_completion_tokens=3)
    adapter.send_limit_as(body, "max_tokens")
    assert body["max_tokens"] == 3 and "max_completion_tokens" not in body
    decoder = adapter.stream_decoder(
        "responses", request=REQUEST, target="t", body=BODY, include_usage=False
    )
    assert type(decoder) is ResponsesStreamDecoder
    decoder = adapter.stream_decoder(
        "chat", request=REQUEST, target="t", body=BODY, include_usage=False
    )
    assert type(decoder) is ChatStreamDecoder
    assert adapter.request_id({"x-request-id": "r1", "request-id": "r2"}) == "r1"
    assert (
        adapter.usage_fields.prompt == "prompt_tokens"
        and adapter.usage_fields.prompt_includes_cache
    )


def test_the_anthropic_adapter_translates_chat_and_refuses_what_it_cannot_express() -> None:
    adapter = adapter_for("anthropic")
    assert adapter.translates and not adapter.speaks_openai and not adapter.stream_usage
    assert adapter.serves("chat") and not adapter.serves("responses")
    path, sent = adapter.wire_request("chat/completions", BODY, target="t")
    assert path == "messages" and sent["messages"] == BODY["messages"] and sent["max_tokens"] == 5
    with pytest.raises(openai.BadRequestError, match="'n'"):
        adapter.wire_request("chat/completions", dict(BODY, n=2), target="t")
    headers = adapter.headers("sk-a", user_agent="ua", configured={})
    assert headers["x-api-key"] == "sk-a" and "Authorization" not in headers
    body = dict(BODY)
    adapter.send_limit_as(body, "max_completion_tokens")  # the translation sends max_tokens
    assert body == BODY
    prefilled = dict(BODY, messages=[*BODY["messages"], {"role": "assistant", "content": "Hi "}])
    decoder = adapter.stream_decoder(
        "chat", request=REQUEST, target="t", body=prefilled, include_usage=True
    )
    assert type(decoder) is AnthropicStreamDecoder
    assert adapter.request_id({"x-request-id": "r1", "request-id": "r2"}) == "r2"
    assert adapter.request_id({"x-request-id": "r1"}) == "r1"
    assert adapter.models_request("sk-a") == ({"x-api-key": "sk-a"}, {"limit": 1000})
    assert adapter.usage_fields.prompt == "input_tokens"  # the cache's tokens reported apart
    assert not adapter.usage_fields.prompt_includes_cache


def _event(delta: dict[str, object], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    return f"data: {json.dumps({**chunk, 'choices': [choice]})}\n\n".encode()


def test_the_stream_reader_keeps_the_timings_and_says_whether_the_answer_is_whole() -> None:
    clock = FakeClock(100.0)
    timings = Timings(started_at=100.0)
    reader = StreamReader(ChatStreamDecoder(request=REQUEST, target="t"), timings, clock=clock)
    clock.advance(0.5)
    assert len(reader.feed(_event({"role": "assistant", "content": ""}))) == 1
    assert (timings.first_byte, timings.first_token, timings.tokens) == (0.5, None, 0)
    assert not reader.answering
    clock.advance(0.25)
    reader.feed(_event({"content": "Hel"}) + _event({"content": "lo"}))
    assert (timings.first_byte, timings.first_token, timings.tokens) == (0.5, 0.75, 2)
    assert reader.answering and not reader.complete
    reader.counting = False  # the caller counts from here: the timings are its to keep
    reader.feed(_event({"content": "!"}))
    assert timings.tokens == 2
    reader.feed(_event({}, "stop"))
    assert reader.complete and not reader.done and not reader.ended  # whole, [DONE] or not
    assert reader.feed(None) == [] and reader.ended


def test_a_stream_that_ends_early_is_not_complete() -> None:
    reader = StreamReader(ChatStreamDecoder(request=REQUEST, target="t"), Timings(started_at=0.0))
    reader.feed(_event({"content": "Hi"}))
    reader.feed(None)
    assert reader.ended and not reader.complete
