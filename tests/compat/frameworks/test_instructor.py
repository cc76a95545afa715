"""instructor's ``from_openai``: a pydantic model from the route, by a forced tool call (whole and
streamed), a ``json_schema`` response format, JSON mode (``json_object``, the schema in the
system message) and the Responses API's tools mode."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from .conftest import Served, assert_openai_client, import_framework

instructor = import_framework("instructor", "instructor")

pytestmark = pytest.mark.anyio
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"


class City(BaseModel):
    name: str
    population: int
    coastal: bool


MESSAGES = [{"role": "user", "content": "Describe Lisbon as a City."}]


async def test_tools_mode(served: Served) -> None:
    assert_openai_client(served)
    client = instructor.from_openai(served.client, mode=instructor.Mode.TOOLS)
    city = await client.chat.completions.create(
        model=served.model, response_model=City, messages=MESSAGES, max_retries=0
    )
    assert isinstance(city, City)
    request = served.the_request(CHAT)
    body = request["json"]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "City"}}
    assert [t["function"]["name"] for t in body["tools"]] == ["City"]
    answer = served.replay(request)
    arguments = answer["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert city.model_dump() == json.loads(arguments)


async def test_json_schema_mode(served: Served) -> None:
    assert_openai_client(served)
    client = instructor.from_openai(served.client, mode=instructor.Mode.JSON_SCHEMA)
    city = await client.chat.completions.create(
        model=served.model, response_model=City, messages=MESSAGES, max_retries=0
    )
    assert isinstance(city, City)
    request = served.the_request(CHAT)
    response_format = request["json"]["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["name"] == "City"
    answer = served.replay(request)
    assert city.model_dump() == json.loads(answer["choices"][0]["message"]["content"])


async def test_json_mode(served: Served) -> None:
    client = instructor.from_openai(served.client, mode=instructor.Mode.JSON)
    city = await client.chat.completions.create(
        model=served.model, response_model=City, messages=MESSAGES, max_retries=0
    )
    assert isinstance(city, City)
    request = served.the_request(CHAT)
    assert request["json"]["response_format"] == {"type": "json_object"}
    answer = served.replay(request)
    assert city.model_dump() == json.loads(answer["choices"][0]["message"]["content"])


async def test_responses_tools_mode(served: Served) -> None:
    client = instructor.from_openai(served.client, mode=instructor.Mode.RESPONSES_TOOLS)
    city = await client.responses.create(
        model=served.model, response_model=City, input=MESSAGES, max_retries=0
    )
    assert isinstance(city, City)
    request = served.the_request(RESPONSES)
    answer = served.replay(request)
    call = next(item for item in answer["output"] if item["type"] == "function_call")
    assert call["name"] == "City"
    assert city.model_dump() == json.loads(call["arguments"])


async def test_tools_mode_streamed_partials(served: Served) -> None:
    client = instructor.from_openai(served.client, mode=instructor.Mode.TOOLS)
    partials = [
        partial
        async for partial in client.chat.completions.create_partial(
            model=served.model, response_model=City, messages=MESSAGES, max_retries=0
        )
    ]
    assert len(partials) > 1  # the object grew as the argument fragments streamed in
    request = served.the_request(CHAT)
    assert request["json"]["stream"] is True
    answer = served.replay(request)
    arguments = answer["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert partials[-1].model_dump() == json.loads(arguments)
