"""Load: one client, more concurrent streams than one HTTP/2 connection carries, all exact.

The full run (10,000 streams, memory per open stream, CPU per chunk) is ``benchmarks/load.py``;
this is its smoke version, sized past the 1,000 streams at which one connection to hypercorn used
to stall: counts and exactness only.
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
    return "asyncio"  # the transport is the same on trio (tests/transport/test_transport.py)


async def test_concurrent_streams_are_exact_and_share_few_connections() -> None:
    # Every stream's first token is held until all of them have reached the simulator (and
    # released then), not a long TTFT that a loaded machine may outlast while starting them:
    # all STREAMS are in flight at once, whatever the load, and the simulator counts the peak.
    profile = Profile(reply_tokens=20, inter_token=0.005, hold_first_token=True, hang_max=600)
    with Simulator(profile=profile, tls=True) as sim:
        async with AsyncOpenAI(
            api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context(), max_retries=0
        ) as client:
            expected: dict[str, str] = {}
            for prompt in PROMPTS:  # whole answers are never held
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

            async def release_when_all_held() -> None:
                for _ in range(12_000):  # 600 s at most, and fail_after below
                    if sim.stats()["held"] >= STREAMS:
                        break
                    await anyio.sleep(0.05)
                held["at_release"] = sim.release()

            held: dict[str, int] = {}
            with anyio.fail_after(600):  # a hang guard only: a loaded machine is slow here
                async with anyio.create_task_group() as outer:
                    outer.start_soon(watch)
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(release_when_all_held)
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
    # Concurrent for real: every stream at once, more than one connection carries.
    assert held["at_release"] == STREAMS and stats["held"] == 0
    in_flight = stats["peak_in_flight"]
    assert in_flight == STREAMS > MAX_STREAMS
    # Multiplexed: a handful of connections, never one per stream.
    assert origins == 1
    assert math.ceil(in_flight / MAX_STREAMS) <= peak["pooled"] <= 8
    if proc.available():
        assert 1 <= peak["connections"] <= 8
