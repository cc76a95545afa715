"""Ordinary application code, run once with openai.AsyncOpenAI and once with llmroute's.

Both clients talk to the same simulator; the results (objects dumped, types, errors) must be
identical, apart from per-request ids and timestamps.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

import llmroute
from llmroute.testing import Simulator

from ..conftest import KEY

pytestmark = pytest.mark.anyio

Snippet = Callable[[Any], Awaitable[Any]]
VOLATILE = {"id", "created", "system_fingerprint"}
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name three colours."},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def normalize(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    return value


async def plain_chat(client: Any) -> Any:
    completion = await client.chat.completions.create(model="gpt-6-luna", messages=MESSAGES)
    return (
        type(completion).__name__,
        isinstance(completion, ChatCompletion),
        completion.choices[0].message.content,
        completion.choices[0].finish_reason,
        normalize(completion.model_dump()),
        completion.usage.total_tokens if completion.usage else None,
    )


async def streaming_with_usage(client: Any) -> Any:
    stream = await client.chat.completions.create(
        model="gpt-6-luna",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, dumps, usage = [], [], None
    async for chunk in stream:
        assert isinstance(chunk, ChatCompletionChunk)
        dumps.append(normalize(chunk.model_dump()))
        if chunk.usage:
            usage = chunk.usage.model_dump()
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
    return "".join(text), dumps, usage


async def streaming_async_with(client: Any) -> Any:
    stream = await client.chat.completions.create(
        model="sim-small", messages=MESSAGES, stream=True, max_tokens=5
    )
    async with stream:
        reasons = [c.choices[0].finish_reason async for c in stream if c.choices]
    return reasons


async def tool_call_deltas(client: Any) -> Any:
    stream = await client.chat.completions.create(
        model="gpt-6-luna",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=TOOLS,
        stream=True,
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    async for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            if delta.function and delta.function.name:
                call["name"] += delta.function.name
            if delta.function and delta.function.arguments:
                call["arguments"] += delta.function.arguments
        finish = choice.finish_reason or finish
    return {i: (c["name"], json.loads(c["arguments"])) for i, c in calls.items()}, finish


async def non_stream_tool_call(client: Any) -> Any:
    completion = await client.chat.completions.create(
        model="gpt-6-luna",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    call = completion.choices[0].message.tool_calls[0]
    return (
        call.function.name,
        json.loads(call.function.arguments),
        normalize(completion.model_dump())["choices"][0]["finish_reason"],
    )


def error_snippet(fault: str, **create: Any) -> Snippet:
    async def run(client: Any) -> Any:
        client = client.with_options(max_retries=0)
        try:
            result = await client.chat.completions.create(
                model="sim-small",
                messages=MESSAGES,
                extra_headers={"x-sim-fault": fault},
                **create,
            )
            if create.get("stream"):
                async for _ in result:
                    pass
        except openai.RateLimitError as exc:
            return "rate-limit", exc.status_code, exc.body, exc.message, bool(exc.request_id)
        except openai.InternalServerError as exc:
            return (
                "server",
                exc.status_code,
                exc.body,
                exc.message,
                isinstance(exc, openai.APIStatusError),
            )
        except openai.APIStatusError as exc:
            return "status", exc.status_code, exc.body, exc.message
        except openai.APIError as exc:
            return "api-error", exc.message, exc.body, isinstance(exc, openai.OpenAIError)
        return "no error"

    return run


SNIPPETS: dict[str, Snippet] = {
    "plain_chat": plain_chat,
    "streaming_with_usage": streaming_with_usage,
    "streaming_async_with": streaming_async_with,
    "tool_call_deltas": tool_call_deltas,
    "non_stream_tool_call": non_stream_tool_call,
    "rate_limited": error_snippet("429"),
    "rate_limited_stream": error_snippet("429", stream=True),
    "server_error": error_snippet("500"),
    "unavailable": error_snippet("503"),
    "html_from_proxy": error_snippet("html502"),
    "in_stream_error": error_snippet("stream-error:2", stream=True),
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # openai's own client is the reference here


@pytest.mark.parametrize("name", sorted(SNIPPETS))
async def test_same_results_as_openai(sim: Simulator, name: str) -> None:
    snippet = SNIPPETS[name]
    reference = openai.AsyncOpenAI(
        api_key=KEY,
        base_url=sim.base_url,
        http_client=openai.DefaultAsyncHttpxClient(verify=sim.ssl_context()),
    )
    ours = llmroute.AsyncOpenAI(api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context())
    try:
        expected = await snippet(reference)
        actual = await snippet(ours)
    finally:
        await reference.close()
        await ours.close()
    assert expected != "no error" or not name.startswith(("rate", "server", "html", "in_"))
    assert actual == expected
