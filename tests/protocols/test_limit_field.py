"""One route over vendors that spell the answer's length limit differently: OpenAI's reasoning
models refuse ``max_tokens``, Mistral answers ``max_completion_tokens`` with 422, DashScope
deprecated ``max_tokens``. The catalog's ``max_tokens_field`` names the one each takes; the
caller's limit, however written, reaches each target under that name.

Each vendor is a simulator that accepts only the fields of its vendor's request (``Profile.
accepted_fields``: any other field is answered 422), so a limit sent under the wrong name fails
the request instead of passing unseen."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from llmroute import AsyncOpenAI
from llmroute.protocols.openai import rename_limit
from llmroute.testing import Profile, Simulator

from ..conftest import KEY

pytestmark = pytest.mark.anyio

COMMON = ("model", "messages", "stream", "stream_options", "temperature", "seed")
LIMIT = 5


@pytest.fixture(scope="module")
def mistral() -> Iterator[Simulator]:
    profile = Profile(reply_tokens=20, accepted_fields=(*COMMON, "max_tokens"))
    with Simulator(profile=profile, tls=True) as server:
        yield server


@pytest.fixture(scope="module")
def openai_reasoning() -> Iterator[Simulator]:
    profile = Profile(reply_tokens=20, accepted_fields=(*COMMON, "max_completion_tokens"))
    with Simulator(profile=profile, tls=True) as server:
        yield server


def config(mistral: Simulator, openai: Simulator) -> dict[str, Any]:
    return {
        "providers": {
            "m": {"kind": "mistral", "base_url": mistral.base_url, "api_key": KEY},
            "o": {"kind": "openai", "base_url": openai.base_url, "api_key": KEY},
        },
        "models": {
            "via-mistral": {"targets": ["m:sim-small"]},
            "via-openai": {"targets": ["o:sim-small"]},
        },
        "routing": {"explore": 0},
    }


def last_chat(sim: Simulator) -> dict[str, Any]:
    return [r["json"] for r in sim.last_requests if r["path"] == "/v1/chat/completions"][-1]


@pytest.mark.parametrize("spelling", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("stream", [False, True])
async def test_the_callers_limit_reaches_each_vendor_under_its_own_name(
    mistral: Simulator, openai_reasoning: Simulator, spelling: str, stream: bool
) -> None:
    conf = config(mistral, openai_reasoning)
    async with AsyncOpenAI(config=conf, verify=mistral.ssl_context()) as client:
        for route, sim, field in (
            ("via-mistral", mistral, "max_tokens"),
            ("via-openai", openai_reasoning, "max_completion_tokens"),
        ):
            with anyio.fail_after(30):  # a hang guard only
                kwargs: dict[str, Any] = {spelling: LIMIT}
                messages: Any = [{"role": "user", "content": f"limit {route}"}]
                answer: Any = await client.chat.completions.create(
                    model=route, messages=messages, stream=stream, **kwargs
                )
                if stream:
                    chunks = [chunk async for chunk in answer]
                    finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
                    deltas = [c for c in chunks if c.choices and c.choices[0].delta.content]
                    assert len(deltas) == LIMIT
                else:
                    finish = answer.choices[0].finish_reason
                    assert answer.usage.completion_tokens == LIMIT
            assert finish == "length"  # the limit was applied, not dropped
            sent = last_chat(sim)
            assert sent[field] == LIMIT
            other = "max_completion_tokens" if field == "max_tokens" else "max_tokens"
            assert other not in sent


def test_both_spellings_send_the_smaller_under_the_one_name() -> None:
    body: dict[str, Any] = {"max_tokens": 9, "max_completion_tokens": 4, "model": "m"}
    rename_limit(body, "max_tokens")
    assert body == {"max_tokens": 4, "model": "m"}
    body = {"model": "m"}
    rename_limit(body, "max_completion_tokens")
    assert body == {"model": "m"}  # no limit asked: none is added
