"""The gateway's ``POST /v1/responses``: the official openai client's Responses API through
``llmroute serve``, routed (hedged, failed over) behind it, with OpenAI's named events on the
wire and an ``error`` event, never ``response.completed``, for an answer that broke."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from llmroute.server import Gateway
from llmroute.testing import Profile, Simulator

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore:Async generator 'openai:ResourceWarning"),
]

UPSTREAM_KEY = "sk-upstream-0123456789-NEVER-SHOWN"
GW_KEY = "gw-responses-key-0123456789"
ENVIRON = {"GW_KEY_CI": GW_KEY}
SERVES = {"responses": True, "responses_stored": True}


@pytest.fixture(scope="module")
def stalled() -> Iterator[Simulator]:
    """Every first token takes 5 s: a target the route must hedge."""
    with Simulator(profile=Profile(reply_tokens=20, ttft_median=5.0), tls=True) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(sim: Simulator, stalled: Simulator) -> Iterator[Gateway]:
    provider = {"base_url": sim.base_url, "api_key": UPSTREAM_KEY, **SERVES}
    config = {
        "providers": {
            "sim": provider,
            "stalled": {"base_url": stalled.base_url, "api_key": UPSTREAM_KEY, **SERVES},
            "broken": {**provider, "headers": {"x-sim-fault": "drop:3"}},
            "chat-only": {"base_url": sim.base_url, "api_key": UPSTREAM_KEY},
        },
        "models": {
            "chat": {
                "targets": ["stalled:sim-small", "sim:sim-small"],
                "policy": "hedge",
                "hedge_after": "100ms",
            },
            "broken": {"targets": ["broken:sim-small"]},
            "chat-only": {"targets": ["chat-only:sim-small"]},
        },
        "routing": {"explore": 0},
        "gateway": {"keys": {"ci": "GW_KEY_CI"}},
    }
    with Gateway(config, environ=ENVIRON, verify=sim.ssl_context(), max_retries=0) as server:
        yield server


def client_for(gateway: Gateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.base_url, api_key=GW_KEY, max_retries=0)


async def direct(sim: Simulator) -> str:
    async with openai.AsyncOpenAI(
        base_url=sim.base_url,
        api_key="x",
        http_client=httpx.AsyncClient(verify=sim.ssl_context()),
    ) as plain:
        return (await plain.responses.create(model="sim-small", input="Say hello")).output_text


async def test_responses_through_the_gateway_stream_and_not(
    gateway: Gateway, sim: Simulator
) -> None:
    expected = await direct(sim)
    async with client_for(gateway) as client:
        whole = await client.responses.create(model="chat", input="Say hello")
        assert isinstance(whole, openai.types.responses.Response)
        assert whole.output_text == expected and whole.status == "completed"
        stream = await client.responses.create(model="chat", input="Say hello", stream=True)
        events = [event async for event in stream]
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert text == expected == events[-1].response.output_text
        # openai's own helper accumulates the gateway's events as it does OpenAI's.
        async with client.responses.stream(model="chat", input="Say hello") as helper:
            final = await helper.get_final_response()
        assert final.output_text == expected


async def test_the_wire_has_named_events_and_no_done(gateway: Gateway) -> None:
    body = {"model": "chat", "input": "Say hello", "stream": True}
    headers = {"authorization": f"Bearer {GW_KEY}"}
    async with httpx.AsyncClient() as http:
        answer = await http.post(f"{gateway.base_url}/responses", json=body, headers=headers)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in answer.text.split("\n\n") if b]
    assert all(b.startswith("event: response.") and "\ndata: {" in b for b in blocks)
    assert "[DONE]" not in answer.text and blocks[-1].startswith("event: response.completed")


async def test_a_broken_answer_ends_with_an_error_event(gateway: Gateway) -> None:
    async with client_for(gateway) as client:
        stream = await client.responses.create(model="broken", input="Say hello", stream=True)
        events: list[Any] = [event async for event in stream]
    assert events[-1].type == "error" and events[-1].code == "stream_interrupted"
    assert not any(e.type == "response.completed" for e in events)
    assert isinstance(events[-1].sequence_number, int)


async def test_bad_responses_requests_are_refused_before_anything_is_sent(
    gateway: Gateway,
) -> None:
    async with client_for(gateway) as client:
        for bad, param in (
            ({"input": []}, "input"),
            ({"input": "hi", "stream": "false"}, "stream"),
            ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
            ({"input": [1]}, "input[0]"),
        ):
            with pytest.raises(openai.BadRequestError) as caught:
                await client.post(
                    "/responses", body={"model": "chat", **bad}, cast_to=httpx.Response
                )
            assert caught.value.param == param, bad
        with pytest.raises(openai.BadRequestError, match="cannot serve /responses"):
            await client.responses.create(model="chat-only", input="hi")
