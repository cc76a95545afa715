"""openai-agents: an agent with a function tool, on the default model (the Responses API over the
process-wide default client) and on ``OpenAIChatCompletionsModel(openai_client=...)``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import Served, assert_openai_client, import_framework

import_framework("agents", "openai-agents")
from agents import (  # noqa: E402
    Agent,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from agents.models import _openai_shared  # noqa: E402

pytestmark = pytest.mark.anyio
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
PROMPT = "What is the weather in Paris?"


@pytest.fixture(autouse=True)
def default_client_restored() -> Iterator[None]:
    """The default client is process-wide: put the previous one back after each test."""
    before = _openai_shared.get_default_openai_client()
    set_tracing_disabled(True)  # no trace export to api.openai.com
    yield
    _openai_shared._default_openai_client = before


def weather_agent(model: Any, calls: list[str]) -> Agent[Any]:
    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"Sunny in {city}."

    return Agent(
        name="weather", instructions="Answer with the tool.", tools=[get_weather], model=model
    )


async def test_default_model_uses_responses_with_a_tool(served: Served) -> None:
    assert_openai_client(served)
    set_default_openai_client(served.client, use_for_tracing=False)
    calls: list[str] = []
    result = await Runner.run(weather_agent(served.model, calls), PROMPT, max_turns=4)
    first, second = served.the_requests(RESPONSES, at_least=2)[:2]
    tool_call = next(i for i in served.replay(first)["output"] if i["type"] == "function_call")
    assert tool_call["name"] == "get_weather"
    assert calls == [json.loads(tool_call["arguments"])["city"]]
    outputs = [i for i in second["json"]["input"] if i.get("type") == "function_call_output"]
    assert [o["output"] for o in outputs] == [f"Sunny in {calls[0]}."]
    message = next(i for i in served.replay(second)["output"] if i["type"] == "message")
    assert result.final_output == message["content"][0]["text"]


async def test_chat_completions_model_with_a_tool(served: Served) -> None:
    assert_openai_client(served)
    model = OpenAIChatCompletionsModel(model=served.model, openai_client=served.client)
    calls: list[str] = []
    result = await Runner.run(weather_agent(model, calls), PROMPT, max_turns=4)
    first, second = served.the_requests(CHAT, at_least=2)[:2]
    tool_call = served.replay(first)["choices"][0]["message"]["tool_calls"][0]["function"]
    assert tool_call["name"] == "get_weather"
    assert calls == [json.loads(tool_call["arguments"])["city"]]
    assert second["json"]["messages"][-1]["role"] == "tool"
    assert second["json"]["messages"][-1]["content"] == f"Sunny in {calls[0]}."
    assert result.final_output == served.replay(second)["choices"][0]["message"]["content"]
