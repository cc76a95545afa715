"""Client CPU per request: one chat call on a warm connection, llmroute vs openai vs raw httpx.

Where ``overhead.py`` measures the cost per chunk of long answers, this measures what every
request costs: building, sending, the response and, for a routed call, route resolution, the
prediction, the cache key and the bookkeeping. A zero-latency simulator in its own process (TLS,
HTTP/2 and HTTP/1.1 by ALPN, 1-token replies) answers, so only the client's CPU counts. Four
clients, interleaved in rotated order each round, ``--calls`` sequential calls each per round,
``time.process_time()`` per call; medians over ``--rounds`` rounds and the median per-round ratios:

``httpx``           ``httpx.AsyncClient(http2=True)`` posting the JSON body, ``response.json()``
``openai``          ``openai.AsyncOpenAI`` with its default HTTP client (HTTP/1.1)
``llmroute``        ``llmroute.AsyncOpenAI(base_url=...)``: a model name that is not a route
``llmroute-routed`` ``llmroute.AsyncOpenAI(config=...)``: the model name is a route to the
                    simulator (``fastest``), so routing, stats and prediction run for each call

    .venv/bin/python benchmarks/per_request.py                 # non-streamed calls
    .venv/bin/python benchmarks/per_request.py --stream        # 1-token streamed calls
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import openai

import llmroute
from llmroute.testing import Profile, SimulatorProcess

KEY = "sk-bench"
MESSAGES: Any = [{"role": "user", "content": "hi"}]
CLIENTS = ("httpx", "openai", "llmroute", "llmroute-routed")
PRICE = {"input": 1.25, "cached_input": 0.125, "output": 10}

Call = Callable[[], Awaitable[None]]


def calls(sim: SimulatorProcess, stream: bool) -> tuple[dict[str, Call], list[Any]]:
    raw = httpx.AsyncClient(http2=True, verify=sim.ssl_context(), timeout=60)
    plain = openai.AsyncOpenAI(
        api_key=KEY,
        base_url=sim.base_url,
        http_client=openai.DefaultAsyncHttpxClient(verify=sim.ssl_context()),
    )
    direct = llmroute.AsyncOpenAI(api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context())
    config = {
        "providers": {
            # Priced, so that each call's cost is computed (route.cost, the metrics).
            "sim": {"base_url": sim.base_url, "api_key": KEY, "prices": {"*": PRICE}},
        },
        "models": {"chat": {"targets": ["sim:sim-small"], "policy": "fastest"}},
        "routing": {"explore": 0},
    }
    routed = llmroute.AsyncOpenAI(api_key=KEY, verify=sim.ssl_context(), config=config)
    url = sim.base_url + "/chat/completions"
    headers = {"Authorization": f"Bearer {KEY}"}

    async def with_httpx() -> None:
        body = {"model": "sim-small", "messages": MESSAGES, "stream": stream}
        if stream:
            async with raw.stream("POST", url, json=body, headers=headers) as r:
                async for _ in r.aiter_lines():
                    pass
        else:
            r = await raw.post(url, json=body, headers=headers)
            r.raise_for_status()
            r.json()

    def sdk(client: openai.AsyncOpenAI, model: str) -> Call:
        async def one() -> None:
            if stream:
                s = await client.chat.completions.create(
                    model=model, messages=MESSAGES, stream=True
                )
                async for _ in s:
                    pass
            else:
                await client.chat.completions.create(model=model, messages=MESSAGES)

        return one

    runners = {
        "httpx": with_httpx,
        "openai": sdk(plain, "sim-small"),
        "llmroute": sdk(direct, "sim-small"),
        "llmroute-routed": sdk(routed, "chat"),
    }
    return runners, [raw, plain, direct, routed]


async def main(args: argparse.Namespace) -> None:
    with SimulatorProcess(profile=Profile(reply_tokens=1), tls=True) as sim:
        runners, clients = calls(sim, args.stream)
        for run in runners.values():  # warm: connections, imports, caches
            for _ in range(20):
                await run()
        per_call: dict[str, list[float]] = {name: [] for name in CLIENTS}
        for r in range(args.rounds):
            order = CLIENTS[r % len(CLIENTS) :] + CLIENTS[: r % len(CLIENTS)]
            for name in order:
                run = runners[name]
                started = time.process_time()
                for _ in range(args.calls):
                    await run()
                per_call[name].append((time.process_time() - started) / args.calls * 1e3)
        for client in clients:
            await client.aclose() if isinstance(client, httpx.AsyncClient) else await client.close()
    kind = "1-token streamed" if args.stream else "non-streamed"
    print(
        f"client CPU ms per {kind} call, {args.rounds} rounds x {args.calls} calls, "
        f"load average {os.getloadavg()[0]:.1f}:"
    )
    for name in CLIENTS:
        values = per_call[name]
        print(
            f"  {name:<16} median {statistics.median(values):.3f} "
            f"(min {min(values):.3f}, max {max(values):.3f})"
        )
    for name in ("llmroute", "llmroute-routed"):
        for other in ("openai", "httpx"):
            ratios = [a / b for a, b in zip(per_call[name], per_call[other], strict=True)]
            print(
                f"  {name} / {other}: {statistics.median(ratios):.2f}x "
                f"(rounds {min(ratios):.2f}..{max(ratios):.2f})"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--stream", action="store_true", help="1-token streamed calls instead")
    asyncio.run(main(parser.parse_args()))
