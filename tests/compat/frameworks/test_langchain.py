"""langchain-openai's ``ChatOpenAI`` over existing clients (``root_client``/``client`` and
``root_async_client``/``async_client``): ``invoke``, ``ainvoke``, ``astream`` (chat and the
Responses API), tool binding, and the default ``with_structured_output`` (json_schema, through
``with_raw_response.parse``)."""

from __future__ import annotations

import json
from typing import Any

import anyio.to_thread
import pytest
from pydantic import BaseModel

from ...conftest import KEY
from .conftest import Served, assert_openai_client, import_framework

import_framework("langchain_openai", "langchain-openai")
from langchain_core.messages import AIMessage, AIMessageChunk  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402

pytestmark = pytest.mark.anyio
CHAT = "/v1/chat/completions"
PROMPT = "Describe Lisbon as a City."


class City(BaseModel):
    """A city."""

    name: str
    population: int
    coastal: bool


def chat(served: Served, **kwargs: Any) -> ChatOpenAI:
    assert_openai_client(served)
    return ChatOpenAI(
        model=served.model,
        api_key=KEY,
        root_client=served.sync_client,
        client=served.sync_client.chat.completions,
        root_async_client=served.client,
        async_client=served.client.chat.completions,
        max_retries=0,
        **kwargs,
    )


def content(served: Served, request: dict[str, Any]) -> str:
    return served.replay(request)["choices"][0]["message"]["content"]


async def test_invoke_sync(served: Served) -> None:
    llm = chat(served)
    message = await anyio.to_thread.run_sync(llm.invoke, PROMPT)
    assert isinstance(message, AIMessage)
    request = served.the_request(CHAT)
    assert message.content == content(served, request)


async def test_ainvoke(served: Served) -> None:
    message = await chat(served).ainvoke(PROMPT)
    assert isinstance(message, AIMessage)
    request = served.the_request(CHAT)
    assert message.content == content(served, request)
    assert message.response_metadata["model_name"] == "sim-small"


async def test_astream(served: Served) -> None:
    chunks = [chunk async for chunk in chat(served).astream(PROMPT)]
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    texts = [c.content for c in chunks if c.content]
    assert len(texts) > 1
    request = served.the_request(CHAT)
    assert request["json"]["stream"] is True
    assert "".join(texts) == content(served, request)


async def test_bind_tools(served: Served) -> None:
    llm = chat(served).bind_tools([City], tool_choice="City")
    message = await llm.ainvoke(PROMPT)
    request = served.the_request(CHAT)
    call = served.replay(request)["choices"][0]["message"]["tool_calls"][0]["function"]
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [
        ("City", json.loads(call["arguments"]))
    ]


async def test_default_with_structured_output(served: Served) -> None:
    city = await chat(served).with_structured_output(City).ainvoke(PROMPT)
    assert isinstance(city, City)
    request = served.the_request(CHAT)
    assert request["json"]["response_format"]["type"] == "json_schema"
    assert city.model_dump() == json.loads(content(served, request))


async def test_responses_api_astream(served: Served) -> None:
    llm = chat(served, use_responses_api=True)
    chunks = [chunk async for chunk in llm.astream(PROMPT)]
    text = "".join(chunk.text for chunk in chunks)
    request = served.the_request("/v1/responses")
    assert request["json"]["stream"] is True
    message = next(i for i in served.replay(request)["output"] if i["type"] == "message")
    assert text == message["content"][0]["text"]
