"""``AsyncOpenAI.route_json``: the public hand-off of a checked JSON body to the routing (the
gateway's, and any server's of its own)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

import llmroute
from llmroute.testing import Simulator

from ..conftest import KEY

pytestmark = pytest.mark.anyio

MESSAGES: Any = [{"role": "user", "content": "Tell me a story."}]


def _config(sim: Simulator) -> dict[str, Any]:
    return {
        "providers": {"sim": {"base_url": sim.base_url, "api_key": KEY}},
        "models": {"chat": {"targets": ["sim:sim-small"], "policy": "fastest"}},
    }


async def test_route_json_routes_a_body_as_create_would(sim: Simulator) -> None:
    async with llmroute.AsyncOpenAI(
        api_key=KEY, verify=sim.ssl_context(), config=_config(sim)
    ) as client:
        whole = await client.route_json(
            "/chat/completions", {"model": "chat", "messages": MESSAGES}, timeout=30.0
        )
        created = await client.chat.completions.create(model="chat", messages=MESSAGES)
        assert isinstance(whole, openai.types.chat.ChatCompletion)
        assert whole.choices[0].message.content == created.choices[0].message.content
        assert whole.route.winner == "sim:sim-small"  # type: ignore[attr-defined]

        body = {"model": "chat", "messages": MESSAGES, "stream": True}
        stream = await client.route_json("/chat/completions", body, headers={})
        assert isinstance(stream, llmroute.AsyncStream)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == created.choices[0].message.content
        assert stream.route is not None and stream.route.winner == "sim:sim-small"


async def test_route_json_gives_none_for_a_model_that_is_not_a_route(sim: Simulator) -> None:
    async with llmroute.AsyncOpenAI(
        api_key=KEY, verify=sim.ssl_context(), config=_config(sim)
    ) as client:
        body = {"model": "sim-small", "messages": MESSAGES}
        assert await client.route_json("/chat/completions", body) is None
        with pytest.raises(openai.BadRequestError):  # a body the routing cannot read
            await client.route_json("/chat/completions", {"model": "chat", "messages": 3})
