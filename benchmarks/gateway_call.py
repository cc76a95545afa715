"""The gateway's hand-off of a checked request body to the routing, in one process.

The CPU from a body the gateway has checked to the client's ``Dispatch.answer`` (stubbed here
to return at once, so no request is sent): the gateway's own path (``GatewayApp._call``: the
dispatch's ``classify`` and ``answer``, as the client's seam runs them) against the path it
took before, openai's ``client.post(...)`` (``FinalRequestOptions``, the seam's
``request()``). Rounds alternate the two; the median of the rounds is reported. A ratio of two
CPU times measured side by side, so a loaded machine moves both alike.

    .venv/bin/python benchmarks/gateway_call.py            # ~10 s
    .venv/bin/python benchmarks/gateway_call.py --calls 5000 --rounds 9
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from llmroute._dispatch import Served
from llmroute.server import GatewayApp

CONFIG = {
    "providers": {"sim": {"base_url": "https://127.0.0.1:9/v1", "api_key": "sk-bench"}},
    "models": {"chat": {"targets": ["sim:sim-small"]}},
    "gateway": {"keys": {"bench": "BENCH_GATEWAY_KEY"}},
}
ANSWERED = object()  # the stubbed answer (None would read as "not a route")
BODY = {
    "model": "chat",
    "messages": [{"role": "user", "content": "How much does a gateway add?"}],
    "stream": True,
}


async def main(args: argparse.Namespace) -> None:
    app = GatewayApp(CONFIG, environ={"BENCH_GATEWAY_KEY": "gw-bench"})
    dispatch: Any = app.client._llmroute  # pyright: ignore[reportPrivateUsage]
    reached = [0]

    async def answer(call: Any, live: Any) -> Served:
        reached[0] += 1
        return Served(ANSWERED, None)  # type: ignore[arg-type]

    dispatch.answer = answer
    headers: dict[str, str] = {}

    async def gateway() -> None:
        await app._call("/v1/chat/completions", dict(BODY), headers)  # pyright: ignore[reportPrivateUsage]

    async def post() -> None:
        await app.client.post(
            "/chat/completions",
            body=dict(BODY),
            cast_to=ChatCompletion,
            options={"headers": headers},
            stream=True,
            stream_cls=openai.AsyncStream[ChatCompletionChunk],
        )

    paths = {"gateway hand-off (GatewayApp._call)": gateway, "openai client.post": post}
    per_call: dict[str, list[float]] = {name: [] for name in paths}
    for path in paths.values():
        for _ in range(200):
            await path()  # warm
    for round_ in range(args.rounds):
        names = list(paths)
        for name in names[round_ % 2 :] + names[: round_ % 2]:
            started = time.process_time()
            for _ in range(args.calls):
                await paths[name]()
            per_call[name].append((time.process_time() - started) / args.calls)
    assert reached[0] == (200 + args.calls * args.rounds) * len(paths)
    await app.aclose()
    base = statistics.median(per_call["openai client.post"])
    print("| path | CPU per call (median of rounds) | against client.post |")
    print("| --- | ---: | ---: |")
    for name, values in per_call.items():
        value = statistics.median(values)
        print(f"| {name} | {value * 1e6:.1f} µs | {value / base:.2f}x |")
    print(f"\n{args.rounds} rounds of {args.calls} calls each")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=7)
    asyncio.run(main(parser.parse_args()))
