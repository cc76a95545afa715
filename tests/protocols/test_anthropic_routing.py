"""Anthropic's Messages API behind a route: the simulator's Anthropic mode, end to end."""

from __future__ import annotations

import socket
from typing import Any

import openai
import pytest

from llmroute import AsyncOpenAI
from llmroute.testing import Simulator

from ..conftest import KEY

pytestmark = pytest.mark.anyio

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name three colours."},
]


def config(sim: Simulator, targets: list[str], **route: Any) -> dict[str, Any]:
    return {
        "providers": {
            "claude": {"kind": "anthropic", "base_url": sim.base_url, "api_key": KEY},
            "oai": {"base_url": sim.base_url, "api_key": KEY},
        },
        "models": {"chat": {"targets": targets, **route}},
        "routing": {"explore": 0},
    }


async def test_a_streamed_and_a_whole_answer_come_back_as_openai_objects(sim: Simulator) -> None:
    async with AsyncOpenAI(
        api_key=KEY, verify=sim.ssl_context(), config=config(sim, ["claude:claude-sim"])
    ) as c:
        stream = await c.chat.completions.create(
            model="chat",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        assert stream.route.winner == "claude:claude-sim"
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
        assert text and finish[-1] == "stop"
        assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0
        whole = await c.chat.completions.create(model="chat", messages=MESSAGES)
        assert whole.choices[0].message.content == text
        assert whole.usage is not None and whole.choices[0].finish_reason == "stop"
        sent = [r for r in sim.last_requests if r["path"] == "/v1/messages"]
        assert sent and sent[-1]["json"]["system"] == "You are terse."
        assert sent[-1]["headers"]["x-api-key"] == KEY
        assert "authorization" not in sent[-1]["headers"]


async def test_tools_come_back_as_tool_calls(sim: Simulator) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    async with AsyncOpenAI(
        api_key=KEY, verify=sim.ssl_context(), config=config(sim, ["claude:claude-sim"])
    ) as c:
        answer = await c.chat.completions.create(
            model="chat", messages=MESSAGES, tools=tools, tool_choice="required"
        )
        calls = answer.choices[0].message.tool_calls
        assert calls and calls[0].function.name == "get_weather"  # type: ignore[union-attr]
        assert answer.choices[0].finish_reason == "tool_calls"


async def test_what_anthropic_cannot_express_is_refused_before_sending(sim: Simulator) -> None:
    async with AsyncOpenAI(
        api_key=KEY,
        verify=sim.ssl_context(),
        config=config(sim, ["claude:claude-sim"]),
        max_retries=0,
    ) as c:
        before = sim.stats()["chat_requests"]
        with pytest.raises(openai.APIError) as info:
            await c.chat.completions.create(model="chat", messages=MESSAGES, n=2)
        assert "n" in str(info.value) and "claude:claude-sim" in str(info.value)
        assert sim.stats()["chat_requests"] == before


async def test_an_anthropic_target_that_fails_is_failed_over(sim: Simulator) -> None:
    route = config(sim, ["claude:claude-sim", "oai:sim-small"], policy="failover")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    route["providers"]["claude"]["base_url"] = f"https://127.0.0.1:{port}/v1"  # nobody there
    async with AsyncOpenAI(api_key=KEY, verify=sim.ssl_context(), config=route, max_retries=0) as c:
        answer = await c.chat.completions.create(model="chat", messages=MESSAGES)
        assert answer.route.winner == "oai:sim-small"
        first = answer.route.attempts[0]
        assert (first.target, first.outcome) == ("claude:claude-sim", "error")
