"""llama-index-llms-openai's ``OpenAI`` over existing clients (``async_openai_client=``,
``openai_client=``): ``achat``, ``astream_chat``, ``complete``, a structured prediction
(json_schema) and a tool call.
Its current release needs openai<3: ``make test-openai2`` runs this module."""

from __future__ import annotations

import json
from typing import Any

import anyio.to_thread
import pytest
from pydantic import BaseModel

from ...conftest import KEY
from .conftest import Served, assert_openai_client, import_framework

import_framework("llama_index.llms.openai", "llama-index-llms-openai")
from llama_index.core.llms import ChatMessage  # noqa: E402
from llama_index.core.prompts import PromptTemplate  # noqa: E402
from llama_index.core.tools import FunctionTool  # noqa: E402
from llama_index.llms.openai import OpenAI  # noqa: E402

pytestmark = pytest.mark.anyio
CHAT = "/v1/chat/completions"
# llama-index's OpenAI refuses a model name it does not know (it looks up the context window):
# the route carries the name of an OpenAI model, its targets another.
ROUTE = "gpt-6.1-sol"
TARGET_MODEL = "gpt-6-luna"
MESSAGES = [ChatMessage(role="user", content="Describe Lisbon as a City.")]


class City(BaseModel):
    """A city."""

    name: str
    population: int
    coastal: bool


def llm(served: Served) -> OpenAI:
    assert_openai_client(served)
    return OpenAI(
        model=served.model,
        api_key=KEY,
        max_retries=0,
        openai_client=served.sync_client,
        async_openai_client=served.client,
    )


def content(served: Served, request: dict[str, Any]) -> str:
    return served.replay(request)["choices"][0]["message"]["content"]


async def test_achat(served: Served) -> None:
    response = await llm(served).achat(MESSAGES)
    request = served.the_request(CHAT)
    assert response.message.content == content(served, request)


async def test_astream_chat(served: Served) -> None:
    stream = await llm(served).astream_chat(MESSAGES)
    deltas = [chunk.delta async for chunk in stream if chunk.delta]
    assert len(deltas) > 1
    request = served.the_request(CHAT)
    assert request["json"]["stream"] is True
    assert "".join(deltas) == content(served, request)


async def test_complete_sync(served: Served) -> None:
    response = await anyio.to_thread.run_sync(llm(served).complete, "Name three colours.")
    request = served.the_request(CHAT)
    assert response.text == content(served, request)


async def test_astructured_predict(served: Served) -> None:
    prompt = PromptTemplate("Describe {city} as a City.")
    city = await llm(served).astructured_predict(City, prompt, city="Lisbon")
    assert isinstance(city, City)
    request = served.the_request(CHAT)
    assert request["json"]["response_format"]["type"] == "json_schema"
    assert city.model_dump() == json.loads(content(served, request))


async def test_apredict_and_call_runs_the_tool(served: Served) -> None:
    calls: list[str] = []

    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"Sunny in {city}."

    tool = FunctionTool.from_defaults(fn=get_weather)
    output = await llm(served).apredict_and_call([tool], "What is the weather in Paris?")
    request = served.the_request(CHAT)
    call = served.replay(request)["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather"
    assert calls == [json.loads(call["arguments"])["city"]]
    assert output.response == f"Sunny in {calls[0]}."
