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
    .venv/bin/python benchmarks/per_request.py --baseline /tmp/base   # this tree vs another

``--baseline TREE`` (a folder holding ``llmroute/``, e.g. from ``git archive``) measures
``llmroute`` and ``llmroute-routed`` of this tree and of that one instead: each round, one
child process per tree in rotated order (``PYTHONPATH`` = the tree; ``benchmarks/_trees.py``),
each warming its clients up and then timing ``--inner`` rounds of ``--calls`` calls of each
(the child reports each client's median round); reported are the medians per tree and the
median per-round ratio this/baseline with its range.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import openai
from _trees import interleaved, ratio, rotated, tree_child

import llmroute
from llmroute.testing import Profile, SimulatorProcess

ROOT = Path(__file__).resolve().parent.parent

KEY = "sk-bench"
MESSAGES: Any = [{"role": "user", "content": "hi"}]
CLIENTS = ("httpx", "openai", "llmroute", "llmroute-routed")
PRICE = {"input": 1.25, "cached_input": 0.125, "output": 10}

Call = Callable[[], Awaitable[None]]


def calls(base_url: str, ca: str, stream: bool) -> tuple[dict[str, Call], list[Any]]:
    """Each client's one call against the simulator at ``base_url`` (its CA in ``ca``), and
    the clients (to close)."""

    def trust() -> ssl.SSLContext:
        return ssl.create_default_context(cafile=ca)

    raw = httpx.AsyncClient(http2=True, verify=trust(), timeout=60)
    plain = openai.AsyncOpenAI(
        api_key=KEY,
        base_url=base_url,
        http_client=openai.DefaultAsyncHttpxClient(verify=trust()),
    )
    direct = llmroute.AsyncOpenAI(api_key=KEY, base_url=base_url, verify=trust())
    provider: dict[str, Any] = {"base_url": base_url, "api_key": KEY}
    config = {
        "providers": {"sim": provider},
        "models": {"chat": {"targets": ["sim:sim-small"], "policy": "fastest"}},
        "routing": {"explore": 0},
    }
    try:  # priced, so that each call's cost is computed (route.cost, the metrics)
        priced = {**config, "providers": {"sim": {**provider, "prices": {"*": PRICE}}}}
        routed = llmroute.AsyncOpenAI(api_key=KEY, verify=trust(), config=priced)
    except llmroute.ConfigError:  # a --baseline tree from before prices
        routed = llmroute.AsyncOpenAI(api_key=KEY, verify=trust(), config=config)
    url = base_url + "/chat/completions"
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


async def timed(
    runners: dict[str, Call], names: tuple[str, ...], rounds: int, count: int
) -> dict[str, list[float]]:
    """CPU ms per call of each of ``names``' runners, ``count`` calls a round, in rotated order
    (after 20 warm-up calls each: connections, imports, caches)."""
    for name in names:
        for _ in range(20):
            await runners[name]()
    per_call: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in rotated(names, r):
            run = runners[name]
            started = time.process_time()
            for _ in range(count):
                await run()
            per_call[name].append((time.process_time() - started) / count * 1e3)
    return per_call


async def close(clients: list[Any]) -> None:
    for client in clients:
        await client.aclose() if isinstance(client, httpx.AsyncClient) else await client.close()


async def main(args: argparse.Namespace) -> None:
    with SimulatorProcess(profile=Profile(reply_tokens=1), tls=True) as sim:
        runners, clients = calls(sim.base_url, str(sim.ca_pem_path), args.stream)
        per_call = await timed(runners, CLIENTS, args.rounds, args.calls)
        await close(clients)
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


TREE_CLIENTS = ("llmroute", "llmroute-routed")


async def child(args: argparse.Namespace) -> None:
    """One tree's side of ``--baseline``: its llmroute clients, ``--inner`` rounds of
    ``--calls`` calls each; prints {client: median CPU ms per call} as JSON."""
    runners, clients = calls(args.child[0], args.child[1], args.stream)
    per_call = await timed(runners, TREE_CLIENTS, args.inner, args.calls)
    await close(clients)
    print(json.dumps({name: statistics.median(values) for name, values in per_call.items()}))


def baseline(args: argparse.Namespace) -> None:
    """This tree's llmroute clients against ``args.baseline``'s, one child per tree a round."""
    trees = {"this": ROOT, "baseline": args.baseline.resolve()}
    argv = [
        str(Path(__file__).resolve()),
        "--calls",
        str(args.calls),
        "--inner",
        str(args.inner),
    ] + (["--stream"] if args.stream else [])

    def show(r: int, row: dict[str, dict[str, Any]]) -> None:
        cells = [
            f"{name} {row['this'][name]:.3f}/{row['baseline'][name]:.3f}"
            f" ({row['this'][name] / row['baseline'][name]:.3f})"
            for name in TREE_CLIENTS
        ]
        print(f"round {r + 1}: this/baseline ms: " + ", ".join(cells), flush=True)

    with SimulatorProcess(profile=Profile(reply_tokens=1), tls=True) as sim:
        where = ["--child", sim.base_url, str(sim.ca_pem_path)]
        runs = interleaved(trees, args.rounds, lambda tree: tree_child(tree, argv + where), show)
    kind = "1-token streamed" if args.stream else "non-streamed"
    print(
        f"client CPU ms per {kind} call, this tree vs {trees['baseline']}, {args.rounds} rounds "
        f"x {args.calls} calls, load average {os.getloadavg()[0]:.1f}:"
    )
    for name in TREE_CLIENTS:
        this = [row["this"][name] for row in runs]
        base = [row["baseline"][name] for row in runs]
        r = ratio(this, base)
        print(
            f"  {name:<16} this {statistics.median(this):.3f}, baseline "
            f"{statistics.median(base):.3f}; this/baseline {r['median']:.3f} "
            f"(rounds {r['min']:.3f}..{r['max']:.3f})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--stream", action="store_true", help="1-token streamed calls instead")
    parser.add_argument(
        "--baseline", type=Path, help="a tree holding llmroute/: this tree's clients against its"
    )
    parser.add_argument(
        "--inner",
        type=int,
        default=5,
        help="with --baseline: rounds inside each child, of which it reports the median (5)",
    )
    parser.add_argument("--child", nargs=2, metavar=("URL", "CA"), help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.child:
        asyncio.run(child(parsed))
    elif parsed.baseline:
        baseline(parsed)
    else:
        asyncio.run(main(parsed))
