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
import sys
import time
from collections.abc import Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import anyio

from ._demo_setup import ROUTE, Setup, demo_simulators, real_setup, real_targets, simulated_setup
from ._demo_tiers import _tiers_demo
from ._demo_workload import Ask, Result, ask_once, drive, workload
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

__all__ = ["ROUTE", "demo_simulators", "register", "simulated_setup"]


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
