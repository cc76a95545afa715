"""Soak, small: many routed requests with faults on leave no task, descriptor or socket behind.

The long run (20,000 requests, memory after warm-up) is ``benchmarks/load.py soak``.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import random
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

from llmroute import AsyncOpenAI, OpenAIError
from llmroute.testing import Profile, Simulator
from llmroute.testing import _resources as proc

from ..conftest import KEY

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not proc.available(), reason="counts descriptors in /proc (Linux)"),
]

REQUESTS = 600


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # asyncio.all_tasks() counts the tasks


def faulty(seed: int) -> Profile:
    return Profile(
        reply_tokens=12,
        ttft_median=0.005,
        rate_500=0.02,
        rate_429=0.01,
        retry_after=0.1,
        rate_drop=0.02,
        rate_malformed=0.01,
        rate_hang=0.01,
        fault_after=4,
        hang_max=30.0,
        seed=seed,
    )


@pytest.fixture
def targets() -> Iterator[tuple[Simulator, Simulator]]:
    with Simulator(profile=faulty(1), tls=True) as a, Simulator(profile=faulty(2), tls=True) as b:
        yield a, b


def port(sim: Simulator) -> int:
    return int(sim.base_url.rsplit(":", 1)[1].split("/")[0])


async def settle(check: Any) -> None:
    with anyio.move_on_after(30):  # a hang guard only: the assertions follow
        while not check():  # noqa: ASYNC110 - counts read from /proc and the simulators
            await anyio.sleep(0.05)


async def test_a_faulty_run_leaves_nothing_behind(targets: tuple[Simulator, Simulator]) -> None:
    a, b = targets
    config = {
        "providers": {
            "a": {"base_url": a.base_url, "api_key": KEY, "continuation": {}},
            "b": {"base_url": b.base_url, "api_key": KEY, "continuation": {}},
        },
        "models": {
            "chat": {
                "targets": ["a:sim-small", "b:sim-small"],
                "policy": "hedge",
                # Deadlines that catch the hangs but not a loaded machine's slow answers (at
                # 0.5 s, with two CPU burners beside it, timeouts opened every circuit).
                "first_token_timeout": "3s",
            }
        },
        "cache": {"backend": "memory", "min_hits": 2},
    }
    gc.collect()
    tasks, fds = len(asyncio.all_tasks()), proc.open_fds()
    outcomes: collections.Counter[str] = collections.Counter()
    rng = random.Random(3)
    timeout = httpx.Timeout(10.0, read=3.0)
    async with AsyncOpenAI(
        config=config, verify=a.ssl_context(), timeout=timeout, max_retries=1
    ) as client:
        limiter = anyio.CapacityLimiter(32)

        async def one(i: int) -> None:
            popular = rng.random() < 0.3
            prompt = f"popular {i % 5}" if popular else f"unique {i}"
            stream = rng.random() < 0.8
            async with limiter:
                try:
                    with anyio.fail_after(15):  # nothing may hang
                        result = await client.chat.completions.create(
                            model="chat",
                            messages=[{"role": "user", "content": prompt}],
                            stream=stream,
                            temperature=0 if popular else 0.7,
                        )
                        if stream:
                            async with result:
                                finish = [c.choices[0].finish_reason async for c in result]
                            assert finish[-1] == "stop"  # read to the end: whole
                        outcomes["ok"] += 1
                except OpenAIError as exc:
                    outcomes[type(exc).__name__] += 1

        async with anyio.create_task_group() as tg:
            for i in range(REQUESTS):
                tg.start_soon(one, i)
        stats = client._router.stats
        kept = {name: len(t._ttft) for name, t in stats._targets.items()}
        in_flight = {name: snap.in_flight for name, snap in client.stats().items()}
    assert sum(outcomes.values()) == REQUESTS
    assert outcomes["ok"] >= REQUESTS * 0.95, outcomes
    assert set(in_flight.values()) == {0}
    limit = stats.settings.max_samples
    assert all(n <= limit for n in kept.values())
    await settle(lambda: a.stats()["in_flight"] == b.stats()["in_flight"] == 0)
    assert a.stats()["in_flight"] == b.stats()["in_flight"] == 0
    gc.collect()
    await settle(lambda: proc.open_fds() <= fds)
    assert proc.tcp_connections(port(a)) == proc.tcp_connections(port(b)) == 0
    assert proc.open_fds() <= fds
    assert len(asyncio.all_tasks()) <= tasks
