"""openai's own surface on a route: parse, stream(), raw and streamed responses, the other
endpoints, and what a route cannot serve (two simulated targets over TLS + HTTP/2)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pydantic
import pytest
from openai._legacy_response import LegacyAPIResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ParsedChatCompletion

import llmroute
from llmroute import AsyncOpenAI
from llmroute.testing import Profile, Simulator

from ..conftest import KEY

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Tell me about drop-in clients."}]
DEAD = "https://127.0.0.1:9/v1"  # the discard port: nothing listens, the connection is refused


@pytest.fixture(scope="module")
def sim_b() -> Iterator[Simulator]:
    with Simulator(profile=Profile(reply_tokens=12, ttft_median=0.01), tls=True) as server:
        yield server


def routed(a: Simulator, b: Simulator, *, first: str = "a", **route: Any) -> dict[str, Any]:
    providers = {
        "a": {"base_url": a.base_url, "api_key": KEY},
        "b": {"base_url": b.base_url, "api_key": KEY},
        "dead": {"base_url": DEAD, "api_key": KEY},
    }
    order = {"a": ["a:sim-small", "b:sim-small"], "dead": ["dead:sim-small", "b:sim-small"]}
    return {
        "providers": providers,
        "models": {"chat": {"targets": order[first], "policy": "failover", **route}},
        "routing": {"explore": 0},
    }


def client(a: Simulator, b: Simulator, **kwargs: Any) -> AsyncOpenAI:
    return AsyncOpenAI(config=routed(a, b, **kwargs), verify=a.ssl_context(), max_retries=0)


async def test_the_client_and_its_results_are_openais(sim: Simulator, sim_b: Simulator) -> None:
    async with client(sim, sim_b) as c:
        assert isinstance(c, openai.AsyncOpenAI)
        assert isinstance(c.with_options(timeout=5), llmroute.AsyncOpenAI)
        done = await c.chat.completions.create(model="chat", messages=MESSAGES)
        assert isinstance(done, ChatCompletion) and done.route.winner == "a:sim-small"
        stream = await c.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        assert isinstance(stream, openai.AsyncStream) and isinstance(stream, llmroute.AsyncStream)
        chunks = [chunk async for chunk in stream]
        assert all(isinstance(chunk, ChatCompletionChunk) for chunk in chunks)
        assert stream.route is not None and stream.route.winner == "a:sim-small"
        assert stream.timings.first_token is not None


async def test_parse_on_a_route_gives_a_parsed_completion_with_its_route(
    sim: Simulator, sim_b: Simulator
) -> None:
    async with client(sim, sim_b) as c:
        parsed = await c.chat.completions.parse(model="chat", messages=MESSAGES)
    assert isinstance(parsed, ParsedChatCompletion)
    assert parsed.choices[0].message.content
    assert parsed.route.winner == "a:sim-small" and parsed.timings.total is not None


async def test_the_stream_helper_on_a_route(sim: Simulator, sim_b: Simulator) -> None:
    async with client(sim, sim_b) as c:
        async with c.chat.completions.stream(model="chat", messages=MESSAGES) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_completion()
    assert "content.delta" in kinds and "content.done" in kinds
    assert final.choices[0].message.content
    assert final.choices[0].finish_reason == "stop"


async def test_raw_and_streamed_responses_on_a_route(sim: Simulator, sim_b: Simulator) -> None:
    async with client(sim, sim_b) as c:
        raw = await c.chat.completions.with_raw_response.create(model="chat", messages=MESSAGES)
        assert isinstance(raw, LegacyAPIResponse) and raw.status_code == 200
        assert raw.headers["x-request-id"]
        completion = raw.parse()
        assert isinstance(completion, ChatCompletion) and completion.route.winner == "a:sim-small"
        raw = await c.chat.completions.with_raw_response.create(
            model="chat", messages=MESSAGES, stream=True
        )
        stream = raw.parse()
        assert isinstance(stream, llmroute.AsyncStream)
        assert [chunk async for chunk in stream]
        async with c.chat.completions.with_streaming_response.create(
            model="chat", messages=MESSAGES
        ) as response:
            assert response.status_code == 200
            parsed = await response.parse()
            assert isinstance(parsed, ChatCompletion) and parsed.route is not None


async def test_completions_and_embeddings_fail_over_across_the_route(
    sim: Simulator, sim_b: Simulator
) -> None:
    before = sim_b.stats()["requests"]
    async with client(sim, sim_b, first="dead") as c:
        text = await c.completions.create(model="chat", prompt="Say hi", max_tokens=4)
        assert text.choices[0].text
        assert text.route.winner == "b:sim-small"
        assert [a.outcome for a in text.route.attempts] == ["error", "won"]
        embedding = await c.embeddings.create(model="chat", input="hello")
        assert embedding.data and isinstance(embedding.data[0].embedding[0], float)
        stream = await c.completions.create(model="chat", prompt="Say hi", stream=True)
        assert isinstance(stream, openai.AsyncStream)
        assert "".join([c.choices[0].text async for c in stream if c.choices])
    assert sim_b.stats()["requests"] >= before + 3


async def test_a_route_on_an_endpoint_that_cannot_be_routed_is_refused_before_sending(
    sim: Simulator, sim_b: Simulator
) -> None:
    before = sim.stats()["requests"], sim_b.stats()["requests"]
    async with client(sim, sim_b) as c:
        with pytest.raises(openai.BadRequestError, match="'chat' is a route") as caught:
            await c.images.generate(model="chat", prompt="a cat")
        assert caught.value.status_code == 400
        with pytest.raises(openai.BadRequestError, match="route 'chat' cannot serve /responses"):
            await c.responses.create(model="chat", input="hi")
    assert (sim.stats()["requests"], sim_b.stats()["requests"]) == before


async def test_other_endpoints_go_through_openai_on_llmroutes_transport(sim: Simulator) -> None:
    async with AsyncOpenAI(api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context()) as c:
        page = await c.models.list()
        assert page.data and isinstance(page, openai.pagination.AsyncPage)
        response = await c.get("/models", cast_to=object)
        assert isinstance(response, dict) and response["data"]
        assert c._transport is not None and c._client._transport is c._transport


def test_the_sync_client_routes_too(sim: Simulator, sim_b: Simulator) -> None:
    with llmroute.OpenAI(config=routed(sim, sim_b), verify=sim.ssl_context(), max_retries=0) as c:
        assert isinstance(c, openai.OpenAI)
        stream = c.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        assert isinstance(stream, openai.Stream) and isinstance(stream, llmroute.Stream)
        assert [chunk for chunk in stream]
        assert stream.route is not None and stream.route.winner == "a:sim-small"
        parsed = c.chat.completions.parse(model="chat", messages=MESSAGES)
        assert isinstance(parsed, ParsedChatCompletion) and parsed.route is not None
        raw = c.chat.completions.with_raw_response.create(model="chat", messages=MESSAGES)
        assert raw.parse().route.winner == "a:sim-small"
        with pytest.raises(openai.BadRequestError, match="is a route"):
            c.images.generate(model="chat", prompt="a cat")


# -- the Responses API on a route -----------------------------------------------------------------


def responses_config(a: Simulator, b: Simulator, *, b_serves: bool = True) -> dict[str, Any]:
    serves = {"responses": True, "responses_stored": True}
    return {
        "providers": {
            "a": {"base_url": a.base_url, "api_key": KEY, **serves},
            "b": {"base_url": b.base_url, "api_key": KEY, **(serves if b_serves else {})},
        },
        "models": {"chat": {"targets": ["a:sim-small", "b:sim-small"], "policy": "failover"}},
        "routing": {"explore": 0},
    }


async def test_responses_on_a_route_stream_and_not(sim: Simulator, sim_b: Simulator) -> None:
    async with AsyncOpenAI(
        config=responses_config(sim, sim_b), verify=sim.ssl_context(), max_retries=0
    ) as c:
        done = await c.responses.create(model="chat", input="Say hello")
        assert isinstance(done, openai.types.responses.Response)
        assert done.output_text and done.route.winner == "a:sim-small"
        stream = await c.responses.create(model="chat", input="Say hello", stream=True)
        assert isinstance(stream, openai.AsyncStream)
        events = [event async for event in stream]
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta")


async def test_previous_response_id_goes_to_the_target_that_holds_it(
    sim: Simulator, sim_b: Simulator
) -> None:
    config = responses_config(sim, sim_b)
    config["providers"]["a"]["headers"] = {"x-sim-fault": "500"}  # a fails every call
    async with AsyncOpenAI(config=config, verify=sim.ssl_context(), max_retries=0) as c:
        first = await c.responses.create(model="chat", input="Remember 7")
        assert first.route.winner == "b:sim-small"
        # The follow-up goes straight to b, which holds the response (a is not even asked).
        follow = await c.responses.create(
            model="chat", input="What number?", previous_response_id=first.id
        )
        assert [a.target for a in follow.route.attempts] == ["b:sim-small"]
        # Streamed: the id arrives in response.created and pins the same way.
        stream = await c.responses.create(model="chat", input="Again", stream=True)
        events = [event async for event in stream]  # read whole: the answer completes
        created = events[0]
        again = await c.responses.create(
            model="chat", input="And?", previous_response_id=created.response.id
        )
        assert [a.target for a in again.route.attempts] == ["b:sim-small"]
    # A client that never saw the id asks each target that keeps responses in turn: a answers
    # 404 previous_response_not_found, b holds it.
    async with AsyncOpenAI(
        config=responses_config(sim, sim_b), verify=sim.ssl_context(), max_retries=0
    ) as fresh:
        found = await fresh.responses.create(model="chat", input="?", previous_response_id=first.id)
        assert found.route.winner == "b:sim-small"
        assert [(a.target, a.outcome) for a in found.route.attempts] == [
            ("a:sim-small", "error"),
            ("b:sim-small", "won"),
        ]


async def test_responses_go_only_to_targets_that_serve_them(
    sim: Simulator, sim_b: Simulator
) -> None:
    before = sim_b.stats()["requests"]
    async with AsyncOpenAI(
        config=responses_config(sim_b, sim, b_serves=False),
        verify=sim.ssl_context(),
        max_retries=0,
    ) as c:
        done = await c.responses.create(model="chat", input="hi")
        assert done.route.winner == "a:sim-small"
        assert [a.target for a in done.route.attempts] == ["a:sim-small"]
    assert sim_b.stats()["requests"] == before + 1


class City(pydantic.BaseModel):
    name: str
    population: int
    landmarks: list[str]


async def test_structured_output_on_a_route(sim: Simulator, sim_b: Simulator) -> None:
    async with AsyncOpenAI(
        config=responses_config(sim, sim_b), verify=sim.ssl_context(), max_retries=0
    ) as c:
        parsed = await c.chat.completions.parse(
            model="chat", messages=MESSAGES, response_format=City
        )
        city = parsed.choices[0].message.parsed
        assert isinstance(city, City) and parsed.route.winner == "a:sim-small"
        beta = getattr(getattr(c, "beta", None), "chat", None)
        if beta is not None:  # openai versions that still have beta.chat.completions.parse
            again = await beta.completions.parse(
                model="chat", messages=MESSAGES, response_format=City
            )
            assert isinstance(again.choices[0].message.parsed, City)
        answer = await c.responses.parse(model="chat", input="A city", text_format=City)
        assert isinstance(answer.output_parsed, City) and answer.route.winner == "a:sim-small"


async def test_a_typo_of_a_route_never_leaves_the_machine(sim: Simulator, sim_b: Simulator) -> None:
    before = sim.stats()["requests"], sim_b.stats()["requests"]
    async with client(sim, sim_b) as c:
        with pytest.raises(llmroute.UnknownModelError, match="did you mean 'chat'") as caught:
            await c.chat.completions.create(model="caht", messages=MESSAGES)
        assert caught.value.suggestion == "chat"
    assert (sim.stats()["requests"], sim_b.stats()["requests"]) == before


async def test_a_cache_hit_names_the_cache_as_winner(sim: Simulator, sim_b: Simulator) -> None:
    config = routed(sim, sim_b)
    config["cache"] = {"backend": "memory", "min_hits": 1}
    async with AsyncOpenAI(config=config, verify=sim.ssl_context(), max_retries=0) as c:
        await c.chat.completions.create(model="chat", messages=MESSAGES, temperature=0)
        hit = await c.chat.completions.create(model="chat", messages=MESSAGES, temperature=0)
        assert hit.route.cache_hit and hit.route.winner == "cache" and hit.route.ttft is not None
        stream = await c.chat.completions.create(
            model="chat", messages=MESSAGES, temperature=0, stream=True
        )
        [chunk async for chunk in stream]
        assert stream.route.winner == "cache" and stream.route.ttft is not None
