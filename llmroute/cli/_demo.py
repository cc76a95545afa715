"""``llmroute demo``: hedged routing over simulated providers on loopback, no API keys.

Three simulated providers (TLS + HTTP/2 on 127.0.0.1) with contrasting latency: one fast with a
heavy stall tail, one steady but slow, one flaky (429s and 5xx). A workload with popular repeated
prompts runs through one ``hedge`` route with a memory cache, under a live table of each target's
TTFT percentiles; then the same prompts go to each target alone, and a summary compares them.
Last, tiers: a small fast simulated model and a large slow one behind the tiered name ``auto``,
whose in-process classifier sends simple prompts to the small one (against always-large).
``--real`` runs the same on the vendors whose API key is in the environment.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import anyio

from ._format import (
    MissingExtra,
    make_console,
    ms,
    percentiles,
    progress_bar,
    ratio,
    require,
    table,
)
from ._parser import examples

if TYPE_CHECKING:
    from rich.console import Console

    from .. import AsyncOpenAI
    from ..testing import Profile

__all__ = ["ROUTE", "demo_simulators", "register", "simulated_setup"]

ROUTE = "chat"
SIM_MODEL = "sim-small"
DEMO_PRICES: dict[str, dict[str, float]] = {
    # Made up for the simulated providers (USD per million tokens), so the demo shows costs.
    "fast-but-spiky": {"input": 0.4, "cached_input": 0.04, "output": 1.6},
    "steady-slow": {"input": 0.1, "cached_input": 0.01, "output": 0.4},
    "flaky": {"input": 0.2, "cached_input": 0.02, "output": 0.8},
}
REQUEST_TIMEOUT = 30.0
"""Seconds one demo request may take, retries included (stalls are at most ~1.5 s)."""

REAL_MODELS: dict[str, str] = {
    "openai": "gpt-6-luna",
    "deepseek": "deepseek-v4-flash",
    "groq": "openai/gpt-oss-20b",
    "mistral": "mistral-small-latest",
    "together": "meta-llama/Llama-3.3-70B-Instruct-Turbo",
    "fireworks": "accounts/fireworks/models/gpt-oss-20b",
    "openrouter": "openai/gpt-6-luna",
    "xai": "grok-4.20-non-reasoning",
    "gemini": "gemini-3.5-flash",
    "anthropic": "claude-haiku-4-5",
    "moonshot": "moonshot-v1-8k",
    "zhipu": "glm-4.7-flash",
    "dashscope": "qwen-flash",
    "siliconflow": "Qwen/Qwen3.5-9B",
    "siliconflow-global": "Qwen/Qwen3.5-9B",
}
"""The model ``--real`` asks each catalog vendor for: a small, cheap one from the vendor's
``models`` in the catalog (``--targets`` sets others). deepseek-v4-flash and gpt-6-luna think by
default: their first token may come after some reasoning."""


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = commands.add_parser(
        "demo",
        help="hedged routing over three simulated providers, live (no keys needed)",
        epilog=examples(
            "llmroute demo",
            "llmroute demo --requests 60 --no-tiers",
            "llmroute demo --real --targets openai:gpt-6-luna,deepseek:deepseek-v4-flash",
        ),
        description=(
            "Start three simulated providers on 127.0.0.1 (fast with a stall tail, steady-slow, "
            "flaky), route a workload through a hedge route with a cache under a live table, "
            "then send the same prompts to each target alone and compare TTFT percentiles; last, "
            "a small fast model beside a large slow one behind the tiered name 'auto'."
        ),
    )
    demo.add_argument(
        "--requests", type=int, default=300, help="requests per run (300; --real: 30)"
    )
    demo.add_argument("--concurrency", type=int, default=8, help="requests at a time (8)")
    demo.add_argument(
        "--popular",
        type=float,
        default=0.3,
        help="share of requests that repeat a few popular prompts at temperature 0 (0.3)",
    )
    demo.add_argument(
        "--real",
        action="store_true",
        help="use the catalog vendors whose API key variable is set, instead of simulators",
    )
    demo.add_argument(
        "--targets",
        help="with --real: the targets, comma-separated provider:model (default: one per vendor)",
    )
    demo.add_argument("--max-tokens", type=int, default=16, help="max_tokens of each request (16)")
    demo.add_argument("--seed", type=int, default=7, help="seed of the workload's prompt order")
    demo.add_argument(
        "--no-tiers",
        dest="tiers",
        action="store_false",
        help="skip the tiers part (a small fast model beside a large slow one behind 'auto')",
    )
    demo.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    if args.requests < 1 or args.concurrency < 1 or not 0 <= args.popular <= 1:
        sys.stderr.write(
            "llmroute demo: --requests and --concurrency must be at least 1, "
            "--popular between 0 and 1\n"
        )
        return 2
    if args.targets and not args.real:
        sys.stderr.write("llmroute demo: --targets goes with --real\n")
        return 2
    try:
        require("rich", "cli")
        if not args.real:
            require("hypercorn", "cli")
            require("trustme", "cli")
    except MissingExtra as exc:
        sys.stderr.write(f"llmroute demo: {exc}\n")
        return 2
    try:
        return anyio.run(_demo, args)
    except KeyboardInterrupt:
        sys.stderr.write("llmroute demo: interrupted\n")
        return 130


def _demo_profiles() -> dict[str, Profile]:
    """The three simulated providers: each wins on some measure and loses on another (the
    simulator's presets of the same names, which a config's ``kind = "simulator"`` names)."""
    from ..testing import PRESETS

    return {name: PRESETS[name] for name in ("fast-but-spiky", "steady-slow", "flaky")}


# -- the workload -----------------------------------------------------------------------------


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


# -- the targets ------------------------------------------------------------------------------


@dataclass
class Setup:
    """Where the demo's requests go: the routed client's config, and each target alone."""

    config: dict[str, Any]
    targets: list[str]
    """``provider:model`` of each target, in the route's order."""
    alone: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per target: ``client``, the ``AsyncOpenAI`` arguments that reach it alone (a plain client,
    or a route of that one target for a protocol other than OpenAI's), and ``model``."""
    verify: Any = True
    label: str = ""


def _route_table(targets: Sequence[str], real: bool) -> dict[str, Any]:
    return {
        "targets": list(targets),
        "policy": "hedge",
        # Hedge a late first attempt soon: a stall is seen in a few hundred ms, not at its p95.
        "hedge_after": "1.5s" if real else "200ms",
        "rank_by": "p50",
        "hedge_budget": 0.5,
        "max_hedges": 2,
        "first_token_timeout": "20s" if real else "5s",
    }


def simulated_setup(sims: dict[str, Any]) -> Setup:
    providers = {
        name: {
            "base_url": sim.base_url,
            "api_key": "sk-demo-local",
            **({"prices": {"*": DEMO_PRICES[name]}} if name in DEMO_PRICES else {}),
        }
        for name, sim in sims.items()
    }
    targets = [f"{name}:{SIM_MODEL}" for name in sims]
    config = {
        "providers": providers,
        "models": {ROUTE: _route_table(targets, real=False)},
        "routing": {"ttft_prior": "300ms"},
        "cache": {"backend": "memory", "min_hits": 2},
    }
    alone = {
        f"{name}:{SIM_MODEL}": {
            "client": {"base_url": sim.base_url, "api_key": "sk-demo-local"},
            "model": SIM_MODEL,
        }
        for name, sim in sims.items()
    }
    verify = next(iter(sims.values())).ssl_context()
    return Setup(
        config, targets, alone, verify, "three simulated providers on 127.0.0.1 (TLS + HTTP/2)"
    )


def real_targets(environ: dict[str, str] | os._Environ[str]) -> tuple[list[str], list[str]]:
    """The ``provider:model`` targets whose key variable is set, and every variable looked for."""
    from .._catalog import load_catalog

    catalog = load_catalog()
    looked: list[str] = []
    targets: list[str] = []
    for name, model in REAL_MODELS.items():
        spec = catalog.get(name)
        if spec is None or spec.api_key_env is None:
            continue
        looked.append(spec.api_key_env)
        if any(environ.get(v) for v in (spec.api_key_env, *spec.api_key_env_fallbacks)):
            targets.append(f"{name}:{model}")
    return targets, looked


def real_setup(targets: list[str]) -> Setup:
    from ..config import Target, resolve_provider
    from ..protocols import adapter_for

    providers: dict[str, dict[str, Any]] = {}
    alone: dict[str, dict[str, Any]] = {}
    for text in targets:
        target = Target.parse(text)
        providers[target.provider] = {}
        resolved = resolve_provider(target.provider, {})
        if adapter_for(resolved.spec.protocol).speaks_openai:
            alone[target.name] = {
                "client": {"base_url": str(resolved.base_url), "api_key": resolved.api_key},
                "model": target.model,
            }
        else:  # another wire protocol: a route with this one target speaks it
            only = {"targets": [target.name], "policy": "failover"}
            alone[target.name] = {
                "client": {
                    "api_key": "unused",
                    "config": {"providers": {target.provider: {}}, "models": {"alone": only}},
                },
                "model": "alone",
            }
    config = {
        "providers": providers,
        "models": {ROUTE: _route_table(targets, real=True)},
        "cache": {"backend": "memory", "min_hits": 2},
    }
    return Setup(config, targets, alone, True, "vendors with a key in the environment")


@contextlib.contextmanager
def demo_simulators() -> Iterator[dict[str, Any]]:
    """The demo's three simulated providers (``name: Simulator``), running while inside;
    :func:`simulated_setup` routes over them (``llmroute demo``, ``chat --simulator``,
    ``serve --simulator``)."""
    from ..testing import Simulator

    with contextlib.ExitStack() as stack:
        yield {
            name: stack.enter_context(Simulator(profile=profile, tls=True))
            for name, profile in _demo_profiles().items()
        }


# -- the run ----------------------------------------------------------------------------------


async def _demo(args: argparse.Namespace) -> int:
    from ..config import ConfigError

    console = make_console()
    if args.real:
        if args.targets:
            targets = [t.strip() for t in args.targets.split(",") if t.strip()]
        else:
            targets, looked = real_targets(os.environ)
            if not targets:
                sys.stderr.write(
                    "llmroute demo --real: no vendor API key is set; looked for "
                    + ", ".join(looked)
                    + ". Set one or more, or run the demo without --real.\n"
                )
                return 2
        try:
            setup = real_setup(targets)
        except ConfigError as exc:
            sys.stderr.write(f"llmroute demo --real: {exc}\n")
            return 2
        requests = args.requests if args.requests != 300 else 30
        return await _run_demo(console, setup, args, requests)
    with demo_simulators() as sims:
        status = await _run_demo(console, simulated_setup(sims), args, args.requests)
    if status == 0 and args.tiers:
        status = await _tiers_demo(console, args)
    return status


async def _run_demo(console: Console, setup: Setup, args: argparse.Namespace, count: int) -> int:
    from .. import AsyncOpenAI

    asks = workload(count, args.popular, args.seed)
    began = time.perf_counter()
    console.print(f"llmroute demo: {setup.label}")
    console.print(f"route {ROUTE!r}: hedge over {', '.join(setup.targets)}, memory cache")
    console.print(
        f"workload: {count} requests, {args.concurrency} at a time; "
        f"{sum(a.temperature == 0 for a in asks)} repeat popular prompts at temperature 0 "
        "(cacheable), the others are unique"
    )
    async with AsyncOpenAI(api_key="unused", config=setup.config, verify=setup.verify) as client:
        try:
            with anyio.fail_after(30):
                await client.warmup()
        except Exception as exc:  # an OpenAIError, a timeout, or a group of them
            sys.stderr.write(f"llmroute demo: cannot reach any target: {exc}\n")
            return 1
        routed = await _routed_phase(console, client, asks, args, setup.targets)
    alone = await _alone_phase(console, setup, asks, args)
    _summary(console, setup.targets, routed, alone, time.perf_counter() - began)
    return 0


class _Board:
    """Counters of the routed phase, rendered as the live table."""

    def __init__(self, targets: Sequence[str], total: int) -> None:
        self.targets = list(targets)
        self.total = total
        self.results: list[Result] = []
        self.hedges_won = dict.fromkeys(self.targets, 0)

    def add(self, result: Result) -> None:
        self.results.append(result)
        if result.hedge_won in self.hedges_won:
            self.hedges_won[result.hedge_won] += 1

    def render(self, client: AsyncOpenAI) -> Any:
        stats = client.stats()
        rows: list[list[str]] = []
        for name in self.targets:
            snap = stats.get(name)
            if snap is None:
                rows.append([name, "0", "-", "-", "-", "0", "0", str(self.hedges_won[name]), ""])
                continue
            errors = sum(snap.outcomes.get(k, 0) for k in ("error", "timeout", "rate_limited"))
            rows.append(
                [
                    name,
                    str(snap.n),
                    ms(snap.ttft_p50),
                    ms(snap.ttft_p95),
                    ms(snap.ttft_p99),
                    str(snap.in_flight),
                    str(errors),
                    str(self.hedges_won[name]),
                    "",
                ]
            )
        hits = [r for r in self.results if r.cache_hit]
        rows.append(_row("cache (memory)", hits, extra=["", "", "", str(len(hits))]))
        rows.append(
            _row(
                "routed (caller's view)",
                self.results,
                extra=[
                    "",
                    str(sum(r.error is not None for r in self.results)),
                    str(sum(r.hedge_won is not None for r in self.results)),
                    str(len(hits)),
                ],
            )
        )
        return table(
            f"hedge route {ROUTE!r}: live TTFT per target (done {len(self.results)}/{self.total})",
            ["target", "n", "p50", "p95", "p99", "in flight", "errors", "hedges won", "cache hits"],
            rows,
        )


def _row(name: str, results: Sequence[Result], extra: list[str]) -> list[str]:
    ttfts = [r.ttft for r in results if r.ttft is not None and r.error is None]
    return [name, str(len(ttfts)), *(ms(v) for v in percentiles(ttfts)), *extra]


async def _routed_phase(
    console: Console,
    client: AsyncOpenAI,
    asks: list[Ask],
    args: argparse.Namespace,
    targets: Sequence[str],
) -> list[Result]:
    from rich.console import Group
    from rich.live import Live

    board = _Board(targets, len(asks))
    progress = progress_bar(console)
    task = progress.add_task("routed requests", total=len(asks))
    step = max(1, len(asks) // 4)

    def done(result: Result) -> None:
        board.add(result)
        progress.advance(task)
        if not console.is_terminal and len(board.results) % step == 0:
            console.print(f"routed: {len(board.results)}/{len(asks)} requests done")

    async def once(index: int) -> Result:
        return await ask_once(client, ROUTE, asks[index], args.max_tokens)

    results: list[Result] = []
    if console.is_terminal:
        with Live(
            Group(board.render(client), progress),
            console=console,
            refresh_per_second=4,
            transient=False,
        ) as live:
            async with anyio.create_task_group() as tg:

                async def refresh() -> None:
                    while True:
                        await anyio.sleep(0.25)
                        live.update(Group(board.render(client), progress))

                tg.start_soon(refresh)
                results = await drive(once, len(asks), args.concurrency, done)
                tg.cancel_scope.cancel()
            live.update(Group(board.render(client), progress))
    else:
        results = await drive(once, len(asks), args.concurrency, done)
        console.print(board.render(client))
    return results


async def _alone_phase(
    console: Console, setup: Setup, asks: list[Ask], args: argparse.Namespace
) -> dict[str, list[Result]]:
    import contextlib

    from .. import AsyncOpenAI

    console.print(
        f"Now each target alone (no routing, no cache; openai's retries): the same {len(asks)} "
        "prompts, the three at once."
    )
    out: dict[str, list[Result]] = {}
    with progress_bar(console, disable=not console.is_terminal) as progress:

        async def one_target(name: str, spec: dict[str, Any]) -> None:
            task = progress.add_task(f"{name} alone", total=len(asks))
            async with AsyncOpenAI(**spec["client"], verify=setup.verify) as client:
                with contextlib.suppress(Exception):  # its requests will say what is wrong
                    await client.warmup()

                async def once(index: int) -> Result:
                    return await ask_once(client, spec["model"], asks[index], args.max_tokens)

                out[name] = await drive(
                    once, len(asks), args.concurrency, lambda _: progress.advance(task)
                )
            if not console.is_terminal:
                console.print(f"{name} alone: {len(asks)}/{len(asks)} requests done")

        async with anyio.create_task_group() as tg:
            for name, spec in setup.alone.items():
                tg.start_soon(one_target, name, spec)
    return out


def _summary(
    console: Console,
    targets: Sequence[str],
    routed: list[Result],
    alone: dict[str, list[Result]],
    wall: float,
) -> None:
    def stats(results: Sequence[Result]) -> tuple[int, int, list[float | None]]:
        ttfts = [r.ttft for r in results if r.ttft is not None and r.error is None]
        return len(ttfts), sum(r.error is not None for r in results), percentiles(ttfts)

    n, errors, (p50, p95, p99) = stats(routed)
    live = [r for r in routed if not r.cache_hit]
    live_n, live_errors, (_, live_p95, _) = stats(live)
    rows: list[list[str]] = [
        ["routed: hedge + cache", str(n), str(errors), ms(p50), ms(p95), ms(p99), "1.0x"],
    ]
    live_stats = stats(live)
    rows.append(
        [
            "routed, cache hits left out",
            str(live_n),
            str(live_errors),
            *(ms(v) for v in live_stats[2]),
            ratio(live_p95, p95),
        ]
    )
    ratios: dict[str, float] = {}
    for name in targets:
        if name not in alone:
            continue
        a_n, a_errors, (a50, a95, a99) = stats(alone[name])
        rows.append([f"{name} alone", str(a_n), str(a_errors), ms(a50), ms(a95), ms(a99)])
        rows[-1].append(ratio(a95, p95))
        if a95 is not None and p95:
            ratios[name] = a95 / p95
    console.print(
        table(
            "Summary: time to first token as the caller saw it (same prompts, same run)",
            ["run", "answered", "errors", "p50", "p95", "p99", "p95 / routed p95"],
            rows,
        )
    )
    hedged = sum(r.hedged for r in routed)
    won = sum(r.hedge_won is not None for r in routed)
    hits = sum(r.cache_hit for r in routed)
    lines = [
        f"hedges fired: {hedged} of {len(routed)} routed requests, {won} won; cache hits: {hits}",
    ]
    if ratios:
        best = min(ratios, key=lambda k: ratios[k])
        worst = max(ratios, key=lambda k: ratios[k])
        lines.append(
            f"P95 improvement: {ratios[best]:.1f}x over the best target alone ({best}), "
            f"{ratios[worst]:.1f}x over the worst ({worst})"
        )
        if live_p95 is not None:
            live_best = min(
                (s for s in (stats(alone[t])[2][1] for t in ratios) if s is not None),
                default=None,
            )
            lines.append(
                f"without the cache's help: routed p95 {ms(live_p95)} vs the best target alone "
                f"{ms(live_best)} ({ratio(live_best, live_p95)})"
            )
    lines.append(cost_line(routed))
    lines.append(f"demo wall time: {wall:.1f} s")
    for line in lines:
        console.print(line)


def cost_line(routed: Sequence[Result]) -> str:
    """What the routed requests cost, per 1,000 and on hedges, retries and continuations."""
    costs = [r.cost for r in routed]
    if not costs or any(c is None for c in costs):
        return "cost: unknown (a target's model has no price: docs/cost.md)"
    total = sum((c for c in costs if c is not None), Decimal(0))
    extra = sum((r.extra_cost for r in routed), Decimal(0))
    per_1000 = total * 1000 / len(costs)
    return (
        f"cost: {total:.6f} USD for {len(costs)} routed requests, {per_1000:.4f} per 1,000 "
        f"(hedges, retries, continuations: {extra:.6f})"
    )


# -- tiers: a small fast model beside a large slow one ----------------------------------------

TIER_EXAMPLES: dict[str, list[str]] = {
    "simple": [
        "hi!",
        "What's the capital of Italy?",
        "Translate 'thank you' into Spanish.",
        "thanks, that's all",
        "今天星期几？",  # noqa: RUF001
        "Give me a synonym for big.",
        "How many days are in June?",
        "Tell me a short joke.",
    ],
    "hard": [
        "Prove that there are infinitely many primes.",
        "Write a Python function that parses nested JSON into dataclasses, with tests.",
        "Design a distributed rate limiter and compare token bucket with sliding windows.",
        "证明根号2是无理数，并推广到任意质数的平方根。",  # noqa: RUF001
        "Explain the CAP theorem and how PACELC refines it, with examples.",
        "Debug this stack trace and propose a fix:\nKeyError: 'user:17' in cache[key]",
        "Derive the closed form of the sum of k^2 and prove it by induction.",
        "Compare Raft and Paxos under network partitions.",
    ],
}
"""The classes of the tiered name ``auto``: a few examples each, inline in its config."""

TIER_PROMPTS: dict[str, list[str]] = {
    "simple": [
        "Hello there!",
        "What's the capital of Japan?",
        "How do you say 'good night' in French?",
        "Who wrote Romeo and Juliet?",
        "What is 12 times 12?",
        "Suggest a name for a puppy.",
        "北京是中国的首都吗？",  # noqa: RUF001
        "great, thank you!",
        "What's the opposite of 'early'?",
        "How many minutes are in a day?",
        "Recommend a good book.",
        "给我讲个笑话。",
    ],
    "hard": [
        "Prove that every tree with n vertices has n-1 edges.",
        "Implement an LRU cache in Go with O(1) operations, and explain its design.",
        "Design a URL shortener for a billion requests a day: storage, IDs and caching.",
        "Explain backpropagation with the equations for a two-layer network.",
        "用Python实现快速排序，并分析它的时间复杂度和最坏情况。",  # noqa: RUF001
        "Why does this deadlock, and how do I fix it?\n```go\nch := make(chan int)\nch <- 1\n```",
        "Compare the memory models of C++ and Java, including data races.",
        "Derive the quadratic formula and discuss complex roots.",
        "Analyse the causes of the 2008 financial crisis in a structured essay.",
        "设计一个高可用的分布式消息队列，说明复制和故障恢复。",  # noqa: RUF001
        "Write a SQL query for each customer's three latest orders with a running total.",
        "Explain how TLS 1.3's handshake works, step by step.",
    ],
}
"""The prompts the tiers part sends (none of them is an example)."""

TIER_SIMS = {"small-fast": 0.08, "large-slow": 0.4}
"""The tiers part's simulated models and their median TTFT in seconds."""


def tiers_config(sims: dict[str, Any]) -> dict[str, Any]:
    """Routes ``chat-small`` and ``chat-large`` (a simulator each) and the tiered name ``auto``."""
    providers = {
        name: {
            "base_url": sim.base_url,
            "api_key": "sk-demo-local",
            **({"prices": {"*": DEMO_PRICES[name]}} if name in DEMO_PRICES else {}),
        }
        for name, sim in sims.items()
    }
    classes = {label: {"examples": texts} for label, texts in TIER_EXAMPLES.items()}
    return {
        "providers": providers,
        "models": {
            "chat-small": {"targets": [f"small-fast:{SIM_MODEL}"]},
            "chat-large": {"targets": [f"large-slow:{SIM_MODEL}"]},
            "auto": {
                "tiers": {"simple": "chat-small", "hard": "chat-large"},
                "default": "chat-large",
                "classes": classes,
            },
        },
    }


async def _tiers_demo(console: Console, args: argparse.Namespace) -> int:
    import contextlib
    import importlib.util

    from .. import AsyncOpenAI
    from .._install import install_hint
    from ..testing import Profile, Simulator

    if importlib.util.find_spec("wordllama") is None or importlib.util.find_spec("numpy") is None:
        console.print(
            f"(tiers part skipped: the request classifier is not installed: "
            f"{install_hint('tiers')})",
            markup=False,  # the hint's "[tiers]" is not a style
        )
        return 0
    labelled = [(label, text) for label, texts in TIER_PROMPTS.items() for text in texts]
    rng = random.Random(args.seed)
    labelled = [rng.choice(labelled) for _ in range(2 * len(labelled))]
    asks = [Ask([{"role": "user", "content": text}], 0.7) for _, text in labelled]
    console.print(
        f"\nTiers: model 'auto' classifies each prompt in process ({len(TIER_EXAMPLES['simple'])}"
        " examples a class) and sends simple ones to 'chat-small' (small-fast, median TTFT "
        f"{TIER_SIMS['small-fast'] * 1000:.0f} ms), hard ones to 'chat-large' (large-slow, "
        f"{TIER_SIMS['large-slow'] * 1000:.0f} ms); beside it, the same {len(asks)} prompts "
        "always to 'chat-large'."
    )
    common: dict[str, Any] = {"reply_tokens": 16, "inter_token": 0.01, "ttft_sigma": 0.25}
    with contextlib.ExitStack() as stack:
        sims = {
            name: stack.enter_context(
                Simulator(profile=Profile(ttft_median=median, seed=index, **common), tls=True)
            )
            for index, (name, median) in enumerate(TIER_SIMS.items(), 11)
        }
        verify = next(iter(sims.values())).ssl_context()
        config = tiers_config(sims)
        async with AsyncOpenAI(api_key="unused", config=config, verify=verify) as client:
            try:
                with anyio.fail_after(60):
                    await client.warmup()  # fits the classifier, in a worker thread
            except Exception as exc:
                sys.stderr.write(f"llmroute demo: the tiers part cannot start: {exc}\n")
                return 1
            runs: dict[str, list[Result]] = {}

            async def arm(model: str) -> None:
                async def once(index: int) -> Result:
                    return await ask_once(client, model, asks[index], args.max_tokens)

                runs[model] = await drive(once, len(asks), args.concurrency, lambda _: None)

            async with anyio.create_task_group() as tg:
                for model in ("auto", "chat-large"):
                    tg.start_soon(arm, model)
    _tiers_summary(console, [label for label, _ in labelled], runs)
    return 0


def _tiers_summary(console: Console, labels: list[str], runs: dict[str, list[Result]]) -> None:
    def ttfts(results: list[Result], label: str) -> list[float]:
        return [
            r.ttft
            for lab, r in zip(labels, results, strict=True)
            if lab == label and r.ttft is not None and r.error is None
        ]

    def on(results: list[Result], label: str, target: str) -> str:
        of = [r for lab, r in zip(labels, results, strict=True) if lab == label]
        return f"{sum(r.winner == f'{target}:{SIM_MODEL}' for r in of)}/{len(of)}"

    rows = []
    p50s: dict[str, float | None] = {}
    for model, name in (("auto", "tiered 'auto'"), ("chat-large", "always 'chat-large'")):
        results = runs[model]
        simple, hard = percentiles(ttfts(results, "simple")), percentiles(ttfts(results, "hard"))
        p50s[model] = simple[0]
        rows.append(
            [
                name,
                str(sum(r.error is not None for r in results)),
                ms(simple[0]),
                ms(simple[1]),
                ms(hard[0]),
                ms(hard[1]),
                on(results, "simple", "small-fast"),
                on(results, "hard", "large-slow"),
            ]
        )
    console.print(
        table(
            "Tiers: time to first token by kind of prompt (same prompts, same run)",
            [
                "run",
                "errors",
                "simple p50",
                "simple p95",
                "hard p50",
                "hard p95",
                "simple on small",
                "hard on large",
            ],
            rows,
        )
    )
    console.print(
        f"simple prompts' p50 TTFT: {ms(p50s['auto'])} with tiers vs {ms(p50s['chat-large'])} "
        f"always large ({ratio(p50s['chat-large'], p50s['auto'])} sooner)"
    )
