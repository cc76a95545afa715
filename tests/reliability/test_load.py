"""Load: one client, more concurrent streams than one HTTP/2 connection carries, all exact.

The full run (2,000 streams, memory per stream) is ``benchmarks/load.py``; this is its smoke
version, sized past the 1,000 streams at which one connection to hypercorn used to stall.
"""

from __future__ import annotations

import math
from typing import Any

import anyio
import pytest

from llmroute import AsyncOpenAI
from llmroute.testing import Profile, Simulator
from llmroute.testing import _resources as proc
from llmroute.transport._h2 import MAX_STREAMS

from ..conftest import KEY

pytestmark = pytest.mark.anyio

STREAMS = 1100
PROMPTS = [f"Load question {i}" for i in range(10)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the transport is the same on trio (tests/test_transport.py)


async def test_concurrent_streams_are_exact_and_share_few_connections() -> None:
    # Every stream waits 3 s for its first token, so the streams overlap even when a loaded
    # machine starts them slowly; the simulator counts the exact peak of streams in flight.
    profile = Profile(reply_tokens=20, ttft_median=3.0, inter_token=0.005)
    with Simulator(profile=profile, tls=True) as sim:
        async with AsyncOpenAI(
            api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context(), max_retries=0
        ) as client:
            expected: dict[str, str] = {}
            for prompt in PROMPTS:
                whole = await client.chat.completions.create(
                    model="sim-small", messages=[{"role": "user", "content": prompt}]
                )
                expected[prompt] = whole.choices[0].message.content or ""
            sim.reset_stats()
            answers: dict[int, tuple[str, str | None]] = {}
            peak = {"connections": 0, "pooled": 0}
            transport: Any = client._transport

            async def one(i: int) -> None:
                prompt = PROMPTS[i % len(PROMPTS)]
                stream = await client.chat.completions.create(
                    model="sim-small", messages=[{"role": "user", "content": prompt}], stream=True
                )
                parts: list[str] = []
                finish: str | None = None
                async with stream:
                    async for chunk in stream:
                        for choice in chunk.choices:
                            parts.append(choice.delta.content or "")
                            finish = choice.finish_reason or finish
                answers[i] = ("".join(parts), finish)

            async def watch() -> None:
                while True:
                    pooled = sum(len(p.connections) for p in transport._pools.values())
                    peak["pooled"] = max(peak["pooled"], pooled)
                    if proc.available():
                        port = int(sim.base_url.rsplit(":", 1)[1].split("/")[0])
                        peak["connections"] = max(peak["connections"], proc.tcp_connections(port))
                    await anyio.sleep(0.05)

            with anyio.fail_after(120):
                async with anyio.create_task_group() as outer:
                    outer.start_soon(watch)
                    async with anyio.create_task_group() as tg:
                        for i in range(STREAMS):
                            tg.start_soon(one, i)
                    outer.cancel_scope.cancel()
            origins = len(transport._pools)
    assert len(answers) == STREAMS
    wrong = [i for i, answer in answers.items() if answer != (expected[PROMPTS[i % 10]], "stop")]
    assert not wrong, f"{len(wrong)} answers differ, e.g. #{wrong[0]}"
    stats = sim.stats()
    assert stats["streams_completed"] == STREAMS
    assert stats["streams_cancelled"] == 0
    # Concurrent for real: more streams at once than one connection carries (a loaded machine
    # starts 1,100 streams more slowly: 508 at once with two CPU burners beside it).
    in_flight = stats["peak_in_flight"]
    assert in_flight > MAX_STREAMS
    # Multiplexed: a handful of connections, never one per stream.
    assert origins == 1
    assert math.ceil(in_flight / MAX_STREAMS) <= peak["pooled"] <= 8
    if proc.available():
        assert 1 <= peak["connections"] <= 8
