"""Frameworks over a client with a response cache: the second identical call is answered from
the cache (no request reaches the target) and the framework gives the same result as from the
live answer. The early cache check answers inside ``chat.completions.create`` (the method the
frameworks call or wrap), so what it returns must be what openai's path returns."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from pydantic import BaseModel

import llmroute
from llmroute.testing import Simulator

from ...conftest import KEY
from ...settle import stored
from .conftest import import_framework

pytestmark = pytest.mark.anyio
PROMPT = "Describe Lisbon as a City."


class City(BaseModel):
    """A city."""

    name: str
    population: int
    coastal: bool


@pytest.fixture
async def cached(
    sims: tuple[Simulator, Simulator], tmp_path: Path
) -> AsyncIterator[tuple[llmroute.AsyncOpenAI, llmroute.OpenAI, Simulator]]:
    sim = sims[0]
    config = {
        "providers": {"sim": {"base_url": sim.base_url, "api_key": KEY}},
        "models": {"chat": {"targets": ["sim:sim-small"]}},
        # "on": cached whatever the framework sends for temperature; on disk, so the sync
        # client (routing state of its own) shares the entries.
        "cache": {"backend": "disk", "path": str(tmp_path), "min_hits": 1, "mode": "on"},
    }
    ctx = sim.ssl_context()
    sync_client = llmroute.OpenAI(api_key=KEY, config=config, verify=ctx, max_retries=0)
    try:
        async with llmroute.AsyncOpenAI(
            api_key=KEY, config=config, verify=ctx, max_retries=0
        ) as client:
            yield client, sync_client, sim
    finally:
        sync_client.close()


async def _twice(
    sim: Simulator, client: llmroute.AsyncOpenAI, call: Any, *, early: bool | None = None
) -> tuple[Any, Any]:
    """``call()`` live, then again from the cache (no new request at the target); ``early``:
    whether the hit must (or must not) be the early check's, before openai's ``create()``."""
    first = await call()
    await stored(client)
    cache = client._cache  # pyright: ignore[reportPrivateUsage]
    assert cache is not None
    before = sim.stats()["chat_requests"]
    hits = cache._hits
    answered: list[bool] = []
    real = client._cache_first  # pyright: ignore[reportPrivateUsage]

    async def noting(path: str, body: dict[str, Any]) -> Any:
        found = await real(path, body)
        answered.append(found[1] is not None and cache._hits > hits)
        return found

    client._cache_first = noting  # type: ignore[method-assign]
    try:
        second = await call()
    finally:
        del client._cache_first
    assert sim.stats()["chat_requests"] == before
    assert cache._hits == hits + 1
    if early is not None:
        assert any(answered) is early, answered
    return first, second


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA", "JSON"])
async def test_instructor(cached: Any, mode: str) -> None:
    instructor = import_framework("instructor", "instructor")
    client, _, sim = cached
    patched = instructor.from_openai(client, mode=getattr(instructor.Mode, mode))

    async def call() -> Any:
        return await patched.chat.completions.create(
            model="chat",
            response_model=City,
            messages=[{"role": "user", "content": PROMPT}],
            max_retries=0,
        )

    first, second = await _twice(sim, client, call, early=True)
    # (instructor keeps the completion in a private attribute: compare the fields)
    assert isinstance(second, City) and second.model_dump() == first.model_dump()


async def test_langchain(cached: Any) -> None:
    import_framework("langchain_openai", "langchain-openai")
    from langchain_openai import ChatOpenAI

    client, sync_client, sim = cached
    llm = ChatOpenAI(
        model="chat",
        api_key=KEY,
        root_client=sync_client,
        client=sync_client.chat.completions,
        root_async_client=client,
        async_client=client.chat.completions,
        max_retries=0,
    )

    async def ainvoke() -> Any:
        return await llm.ainvoke(PROMPT)

    first, second = await _twice(sim, client, ainvoke)
    assert second.content == first.content and second.content
    assert second.response_metadata["model_name"] == first.response_metadata["model_name"]
    # The sync client (its own cache check, on llmroute's loop) hits the same entry.
    before = sim.stats()["chat_requests"]
    again = await anyio.to_thread.run_sync(llm.invoke, PROMPT)
    assert again.content == first.content and sim.stats()["chat_requests"] == before

    tools = llm.bind_tools([City], tool_choice="City")

    async def tool_call() -> Any:
        return await tools.ainvoke(PROMPT)

    first, second = await _twice(sim, client, tool_call)
    assert second.tool_calls == first.tool_calls and second.tool_calls

    async def streamed() -> Any:
        return "".join([str(c.content) async for c in llm.astream(PROMPT + " Stream it.")])

    first, second = await _twice(sim, client, streamed)
    assert second == first and second

    structured = llm.with_structured_output(City)

    async def city() -> Any:
        return await structured.ainvoke(PROMPT)

    first, second = await _twice(sim, client, city)
    assert isinstance(second, City) and second.model_dump() == first.model_dump()
    assert json.loads(second.model_dump_json()) == first.model_dump()
