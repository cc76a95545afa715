"""``llmroute demo``'s workload: the prompts (popular ones repeated, so the cache has hits), one
request asked and timed, and a pool of workers driving them.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from .. import AsyncOpenAI

REQUEST_TIMEOUT = 30.0
"""Seconds one demo request may take, retries included (stalls are at most ~1.5 s)."""


@dataclass(frozen=True, slots=True)
class Ask:
    """One request of the workload."""

    messages: list[dict[str, str]]
    temperature: float


_POPULAR = (
    "What is HTTP/2 multiplexing?",
    "Why does time to first token matter?",
    "Explain hedged requests in one line.",
    "What is a p95 latency?",
    "Name three causes of a slow first token.",
)


def workload(count: int, popular: float, seed: int) -> list[Ask]:
    """``count`` requests: a ``popular`` share repeats a few prompts at temperature 0 (cacheable),
    the rest are unique prompts at temperature 0.7. The same list for every run of one demo."""
    rng = random.Random(seed)
    asks: list[Ask] = []
    for index in range(count):
        if rng.random() < popular:
            prompt = _POPULAR[min(int(rng.paretovariate(1.2)) - 1, len(_POPULAR) - 1)]
            temperature = 0.0
        else:
            prompt = f"Question {index}: what is {index} times {index + 7}? Answer briefly."
            temperature = 0.7
        asks.append(Ask([{"role": "user", "content": prompt}], temperature))
    return asks


@dataclass(slots=True)
class Result:
    """One caller request as the caller saw it: TTFT from ``create()`` to the first content."""

    ttft: float | None = None
    error: str | None = None
    cache_hit: bool = False
    hedged: bool = False
    hedge_won: str | None = None
    """The target whose hedge attempt won, if a hedge won."""
    winner: str | None = None
    """The target that answered."""
    cost: Decimal | None = None
    """What the routed request cost (every attempt); ``None``: unknown or not routed."""
    extra_cost: Decimal = Decimal(0)
    """The part of ``cost`` spent on hedges, retries and continuations."""


async def ask_once(client: AsyncOpenAI, model: str, ask: Ask, max_tokens: int) -> Result:
    """Stream one request and time it; an error is recorded, never raised."""
    from .. import OpenAIError

    result = Result()
    began = time.perf_counter()
    try:
        with anyio.fail_after(REQUEST_TIMEOUT):
            stream = await client.chat.completions.create(
                model=model,
                messages=ask.messages,  # type: ignore[arg-type]
                temperature=ask.temperature,
                max_tokens=max_tokens,
                stream=True,
            )
            async with stream:
                async for chunk in stream:
                    if result.ttft is None and chunk.choices and chunk.choices[0].delta.content:
                        result.ttft = time.perf_counter() - began
            route = stream.route
            if route is not None:
                result.cache_hit = route.cache_hit
                result.hedged = route.hedges > 0
                result.winner = route.winner
                for attempt in route.attempts:
                    if attempt.reason == "hedge" and attempt.outcome == "won":
                        result.hedge_won = attempt.target
                cost = route.cost
                if cost is not None:
                    result.cost = cost.amount
                    result.extra_cost = sum(
                        (v for k, v in cost.kinds.items() if k != "answer"), Decimal(0)
                    )
    except (OpenAIError, TimeoutError) as exc:
        result.error = type(exc).__name__
    return result


async def drive(
    once: Callable[[int], Awaitable[Result]],
    count: int,
    concurrency: int,
    done: Callable[[Result], None],
) -> list[Result]:
    """Call ``once(i)`` for every i below ``count``, in order, ``concurrency`` at a time."""
    results: list[Result] = [Result(error="not run") for _ in range(count)]
    indices = iter(range(count))

    async def worker() -> None:
        for index in indices:
            results[index] = await once(index)
            done(results[index])

    async with anyio.create_task_group() as tg:
        for _ in range(min(concurrency, count)):
            tg.start_soon(worker)
    return results
