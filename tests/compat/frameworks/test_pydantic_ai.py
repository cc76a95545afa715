"""pydantic-ai's OpenAI models over an existing client: ``OpenAIChatModel`` (structured output,
a per-request ``max_retries`` that copies the client with ``with_options``, streamed text) and
``OpenAIResponsesModel``."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from .conftest import Served, assert_openai_client, import_framework

import_framework("pydantic_ai", "pydantic-ai-slim")
from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402

pytestmark = pytest.mark.anyio
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
PROMPT = "Describe Lisbon as a City."


class City(BaseModel):
    name: str
    population: int
    coastal: bool


def chat_model(served: Served) -> OpenAIChatModel:
    assert_openai_client(served)
    return OpenAIChatModel(served.model, provider=OpenAIProvider(openai_client=served.client))


async def test_chat_model_output_type_with_max_retries(served: Served) -> None:
    agent = Agent(chat_model(served), output_type=City, model_settings={"max_retries": 1})
    result = await agent.run(PROMPT)
    assert isinstance(result.output, City)
    request = served.the_request(CHAT)
    assert [t["function"]["name"] for t in request["json"]["tools"]] == ["final_result"]
    answer = served.replay(request)
    arguments = answer["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert result.output.model_dump() == json.loads(arguments)


async def test_chat_model_streams_text(served: Served) -> None:
    agent = Agent(chat_model(served))
    async with agent.run_stream(PROMPT) as run:
        deltas = [delta async for delta in run.stream_text(delta=True, debounce_by=None)]
    request = served.the_request(CHAT)
    assert request["json"]["stream"] is True
    answer = served.replay(request)
    assert len(deltas) > 1
    assert "".join(deltas) == answer["choices"][0]["message"]["content"]


async def test_responses_model_output_type(served: Served) -> None:
    assert_openai_client(served)
    model = OpenAIResponsesModel(served.model, provider=OpenAIProvider(openai_client=served.client))
    agent = Agent(model, output_type=City, model_settings={"max_retries": 1})
    result = await agent.run(PROMPT)
    assert isinstance(result.output, City)
    request = served.the_request(RESPONSES)
    answer = served.replay(request)
    calls = [item for item in answer["output"] if item["type"] == "function_call"]
    assert result.output.model_dump() == json.loads(calls[0]["arguments"])
