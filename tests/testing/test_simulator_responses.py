"""The simulator's Responses API, structured outputs and 404s, read by the real openai client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from datetime import date
from enum import Enum
from typing import Any, Literal, cast

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from llmroute.testing import Profile, Simulator
from llmroute.testing._app import SimApp
from llmroute.testing._responses import IssuedIds
from llmroute.testing._schema import find_schema, instance

TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    *["response.output_text.delta"] * 20,
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "strict": True,
}


class Color(Enum):
    RED = "red"
    BLUE = "blue"


class Address(BaseModel):
    street: str = Field(min_length=12)
    number: int = Field(ge=1, lt=10)
    since: date


class Person(BaseModel):
    name: str
    age: int
    height: float
    admin: bool
    color: Color
    kind: Literal["user", "bot"]
    tags: list[str]
    home: Address
    work: Address | None
    scores: dict[str, int]


class Node(BaseModel):
    label: str
    children: list[Node] = []
    parent: Node | None = None


@pytest.fixture
async def oai(sim: Simulator) -> AsyncIterator[openai.AsyncOpenAI]:
    http = openai.DefaultAsyncHttpxClient(http2=True, verify=sim.ssl_context())
    async with openai.AsyncOpenAI(
        base_url=sim.base_url, api_key="sk-sim", http_client=http, max_retries=0
    ) as client:
        yield client


@pytest.fixture(scope="module")
def other_sim() -> Iterator[Simulator]:
    with Simulator(profile=Profile(reply_tokens=20)) as server:
        yield server


# -- Responses API -------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_responses_create(oai: openai.AsyncOpenAI) -> None:
    r = await oai.responses.create(model="sim-small", input="hello there", instructions="brief")
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.instructions == "brief" and r.model == "sim-small"
    [item] = r.output
    assert item.type == "message" and item.id.startswith("msg_") and item.status == "completed"
    assert len(r.output_text.split()) == 20
    assert r.usage is not None and r.usage.output_tokens == 20
    assert r.usage.total_tokens == r.usage.input_tokens + 20
    again = await oai.responses.create(model="sim-small", input="hello there", instructions="brief")
    assert again.output_text == r.output_text and again.id != r.id


@pytest.mark.anyio
async def test_responses_stream_events(oai: openai.AsyncOpenAI) -> None:
    messages: Any = [{"role": "user", "content": [{"type": "input_text", "text": "hello there"}]}]
    stream = await oai.responses.create(model="sim-small", input=messages, stream=True)
    events = [event async for event in stream]
    assert [e.type for e in events] == TEXT_EVENTS
    assert [e.sequence_number for e in events] == list(range(len(events)))
    created, done = events[0], events[-1]
    assert created.type == "response.created" and done.type == "response.completed"
    assert created.response.status == "in_progress" and created.response.output == []
    assert created.response.id == done.response.id
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert done.response.output_text == text
    assert done.response.usage is not None and done.response.usage.output_tokens == 20
    item_ids = {getattr(e, "item_id", None) for e in events[3:-2]}
    assert item_ids == {done.response.output[0].id}
    whole = await oai.responses.create(model="sim-small", input=messages)
    assert whole.output_text == text


@pytest.mark.anyio
async def test_responses_incomplete_at_max_output_tokens(oai: openai.AsyncOpenAI) -> None:
    r = await oai.responses.create(model="sim-small", input="hi", max_output_tokens=16)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage is not None and r.usage.output_tokens == 16
    stream = await oai.responses.create(
        model="sim-small", input="hi", max_output_tokens=16, stream=True
    )
    events = [e async for e in stream]
    assert events[-1].type == "response.incomplete"


@pytest.mark.anyio
async def test_responses_function_call_then_answer(oai: openai.AsyncOpenAI) -> None:
    ask: Any = [{"role": "user", "content": "Weather in Paris?"}]
    r = await oai.responses.create(model="sim-small", input=ask, tools=[WEATHER])
    [call] = r.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("call_") and call.id is not None and call.id.startswith("fc_")
    args = json.loads(call.arguments)
    assert set(args) == {"city", "unit"} and args["unit"] == "c"
    stream = await oai.responses.create(
        model="sim-small",
        input=ask,
        tools=[WEATHER],
        stream=True,
    )
    events = [e async for e in stream]
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    fragments = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert json.loads("".join(fragments)) == args
    follow: Any = [
        *ask,
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": "{}"},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]
    answer = await oai.responses.create(
        model="sim-small",
        input=follow,
        tools=[WEATHER],
        previous_response_id=r.id,
    )
    assert answer.output[0].type == "message" and answer.output_text
    assert answer.previous_response_id == r.id


@pytest.mark.anyio
async def test_previous_response_id_known_only_where_issued(
    oai: openai.AsyncOpenAI, other_sim: Simulator
) -> None:
    first = await oai.responses.create(model="sim-small", input="hi")
    second = await oai.responses.create(
        model="sim-small", input="more", previous_response_id=first.id
    )
    assert second.previous_response_id == first.id
    http = openai.DefaultAsyncHttpxClient(http2=True, verify=other_sim.ssl_context())
    async with openai.AsyncOpenAI(
        base_url=other_sim.base_url, api_key="sk", http_client=http, max_retries=0
    ) as elsewhere:
        with pytest.raises(openai.NotFoundError) as caught:
            await elsewhere.responses.create(
                model="sim-small", input="more", previous_response_id=first.id, stream=True
            )
    assert caught.value.status_code == 404
    assert caught.value.body == {
        "message": f"Previous response with id '{first.id}' not found.",
        "type": "invalid_request_error",
        "param": "previous_response_id",
        "code": "previous_response_not_found",
    }
    unstored = await oai.responses.create(model="sim-small", input="hi", store=False)
    with pytest.raises(openai.NotFoundError):
        await oai.responses.create(model="sim-small", input="x", previous_response_id=unstored.id)


def test_issued_ids_are_bounded_least_recently_used_first() -> None:
    ids = IssuedIds(size=2)
    ids.add("resp_a")
    ids.add("resp_b")
    assert "resp_a" in ids  # refreshed: resp_b is now the oldest
    ids.add("resp_c")
    assert "resp_b" not in ids and "resp_a" in ids and "resp_c" in ids and len(ids) == 2


@pytest.mark.anyio
async def test_responses_faults(oai: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.RateLimitError):
        await oai.responses.create(
            model="sim-small", input="hi", extra_headers={"x-sim-fault": "429"}
        )
    stream = await oai.responses.create(
        model="sim-small", input="hi", stream=True, extra_headers={"x-sim-fault": "stream-error:3"}
    )
    events = [e async for e in stream]
    assert [e.type for e in events[-4:-1]] == ["response.output_text.delta"] * 3
    assert events[-1].type == "error" and events[-1].code == "server_error"
    stream = await oai.responses.create(
        model="sim-small", input="hi", stream=True, extra_headers={"x-sim-fault": "drop:2"}
    )
    seen: list[str] = []
    with pytest.raises((httpx.HTTPError, openai.APIError)):
        async for event in stream:
            seen.append(event.type)
    assert seen.count("response.output_text.delta") == 2 and "response.completed" not in seen


@pytest.mark.anyio
async def test_responses_bad_request(oai: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await oai.responses.create(model="sim-small", input="hi", max_output_tokens=3)
    assert cast(dict[str, Any], caught.value.body)["param"] == "max_output_tokens"
    with pytest.raises(openai.BadRequestError):
        await oai.post("/responses", cast_to=object, body={"model": "sim-small"})


def test_one_responses_event_per_body_message() -> None:
    """Each event is its own ASGI body message, so the server writes it as its own DATA frame
    (hypercorn may still coalesce what a slow reader has not taken yet)."""
    asyncio.run(_one_event_per_body_message())


async def _one_event_per_body_message() -> None:
    app = SimApp(Profile(reply_tokens=20))
    request = json.dumps({"model": "sim-small", "input": "frames", "stream": True}).encode()
    incoming = [{"type": "http.request", "body": request, "more_body": False}]
    bodies: list[bytes] = []
    ended = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop()
        await ended.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            bodies.append(message["body"])
            if not message.get("more_body"):
                ended.set()

    scope = {
        "type": "http",
        "path": "/v1/responses",
        "method": "POST",
        "http_version": "2",
        "headers": [(b"authorization", b"Bearer sk")],
        "query_string": b"",
    }
    await app(scope, receive, send)
    assert len(bodies) == len(TEXT_EVENTS)
    for frame, kind in zip(bodies, TEXT_EVENTS, strict=True):
        assert frame.count(b"\n\n") == 1 and frame.endswith(b"\n\n")
        assert frame.startswith(f"event: {kind}\ndata: ".encode())


# -- structured outputs --------------------------------------------------------------------------
@pytest.mark.anyio
async def test_responses_parse_pydantic(oai: openai.AsyncOpenAI) -> None:
    r = await oai.responses.parse(model="sim-small", input="who is it?", text_format=Person)
    assert isinstance(r.output_parsed, Person)
    tree = await oai.responses.parse(model="sim-small", input="a tree", text_format=Node)
    assert isinstance(tree.output_parsed, Node)


@pytest.mark.anyio
async def test_chat_parse_pydantic(oai: openai.AsyncOpenAI, anyio_backend: str) -> None:
    messages: Any = [{"role": "user", "content": "who is it?"}]
    done = await oai.chat.completions.parse(
        model="sim-small", messages=messages, response_format=Person
    )
    parsed = done.choices[0].message.parsed
    assert isinstance(parsed, Person) and done.choices[0].finish_reason == "stop"
    if anyio_backend == "trio":
        return  # openai's stream helper leaves an async generator for the GC, which trio reports
    async with oai.chat.completions.stream(
        model="sim-small", messages=messages, response_format=Person
    ) as stream:
        final = await stream.get_final_completion()
    assert final.choices[0].message.parsed == parsed


@pytest.mark.anyio
async def test_chat_forced_function_fits_its_schema(oai: openai.AsyncOpenAI) -> None:
    messages: Any = [{"role": "user", "content": "extract the person"}]
    tool = openai.pydantic_function_tool(Person)
    done = await oai.chat.completions.parse(
        model="sim-small",
        messages=messages,
        tools=[openai.pydantic_function_tool(Node), tool],
        tool_choice={"type": "function", "function": {"name": "Person"}},
    )
    [call] = done.choices[0].message.tool_calls or []
    assert call.function.name == "Person"
    assert isinstance(call.function.parsed_arguments, Person)


@pytest.mark.anyio
async def test_chat_tool_result_gets_a_text_answer(oai: openai.AsyncOpenAI) -> None:
    tools: Any = [{"type": "function", "function": {k: WEATHER[k] for k in ("name", "parameters")}}]
    messages: Any = [{"role": "user", "content": "weather?"}]
    first = await oai.chat.completions.create(model="sim-small", messages=messages, tools=tools)
    [call] = first.choices[0].message.tool_calls or []
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    answer = await oai.chat.completions.create(model="sim-small", messages=messages, tools=tools)
    assert answer.choices[0].message.content and answer.choices[0].finish_reason == "stop"
    forced = await oai.chat.completions.create(
        model="sim-small", messages=messages, tools=tools, tool_choice="required"
    )
    assert forced.choices[0].finish_reason == "tool_calls"


@pytest.mark.anyio
async def test_chat_json_object_follows_a_schema_in_the_prompt(oai: openai.AsyncOpenAI) -> None:
    schema = json.dumps(Person.model_json_schema(), indent=2)
    system = f"Answer in json that matches the following json_schema:\n\n{schema}\n\nThanks."
    messages: Any = [{"role": "system", "content": system}, {"role": "user", "content": "who?"}]
    done = await oai.chat.completions.create(
        model="sim-small", messages=messages, response_format={"type": "json_object"}
    )
    Person.model_validate_json(done.choices[0].message.content or "")
    plain: Any = [{"role": "user", "content": "any json"}]
    done = await oai.chat.completions.create(
        model="sim-small", messages=plain, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(done.choices[0].message.content or ""), dict)


@pytest.mark.parametrize("seed", range(12))
def test_schema_instances_validate(seed: int) -> None:
    for model in (Person, Node, Address):
        model.model_validate(instance(model.model_json_schema(), seed))
    assert instance(Person.model_json_schema(), seed) == instance(Person.model_json_schema(), seed)


def test_schema_corners() -> None:
    assert instance({"const": 3}, 0) == 3
    assert instance({"type": ["null", "integer"], "minimum": 7, "maximum": 7}, 0) == 7
    assert instance({"type": "integer", "exclusiveMinimum": 4, "exclusiveMaximum": 6}, 0) == 5
    assert instance({"type": "number", "multipleOf": 0.5, "minimum": 1.2}, 0) == 1.5
    items = instance({"type": "array", "items": {"type": "integer"}, "minItems": 5}, 0)
    assert len(items) == 5
    assert instance({"type": "array", "maxItems": 0}, 0) == []
    assert instance({"type": "string", "maxLength": 3}, 0).__len__() <= 3
    both = {"allOf": [{"properties": {"a": {"type": "integer"}}}, {"properties": {"b": {}}}]}
    assert set(instance(both, 0)) == {"a", "b"}
    assert find_schema('say {"type": "object", "properties": {"x": {}}} please') is not None
    assert find_schema("no {braces that parse") is None


# -- 404s ----------------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_unknown_paths_are_openai_404s(oai: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await oai.post("/xyz", cast_to=object, body={})
    assert caught.value.body == {
        "message": "Invalid URL (POST /v1/xyz)",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    with pytest.raises(openai.NotFoundError) as caught:
        await oai.get("/responses/resp_123/input_items", cast_to=object)
    assert caught.value.message.endswith("Invalid URL (GET /v1/responses/resp_123/input_items)")
