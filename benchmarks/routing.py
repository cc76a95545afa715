"""Routing benchmark: time to first token of each policy against three simulated targets.

Three simulated providers, each a ``SimulatorProcess`` (its own process, TLS + HTTP/2), serve the
same model name ``sim-small`` with short replies (16 tokens, 5 ms apart) so that TTFT dominates:

``A``  median TTFT 250 ms (lognormal, sigma ``--sigma``), 10% stalls of +1.5..3 s
``B``  median TTFT 400 ms (lognormal, sigma ``--sigma``), 1% stalls of +1 s
``C``  median TTFT 700 ms, steady (sigma 0)

Runs, each with freshly started simulators (so every run sees the same seeded latency draws in
the order its requests reach each simulator) and a fresh client (fresh live stats):

* each target alone (a route with that one target, policy ``failover``);
* each policy over ``[A, B, C]``: ``fastest``, ``hedge`` (after the primary's live p95, budget
  0.1), ``race`` (k=2), ``failover``, ``weighted`` ([1, 1, 1]);
* the oracle: every prompt sent to all three targets at once by three plain (unrouted) llmroute
  clients; its TTFT is the per-request minimum, the best any router could do.

Every run first sends ``--warmup`` requests (200; same prompts for every run) so the live stats
have settled, as in a client that has been serving traffic (a fresh client needs about a hundred
requests before every target has samples; the warm-up's own p50/p95 are printed as the cold
start), then ``--requests`` measured requests, ``--concurrency`` at a time, each with
its own prompt (the same prompt sequence in every run). TTFT is the caller's view: from the
``create()`` call to the first chunk with content. Amplification is the chat requests the
simulators received during the measured phase (their ``/_sim/stats`` counters, diffed) divided
by the requests the caller made. Percentiles are nearest-rank.

The hedging bound: from the TTFT samples of the solo runs, the best p95 any fixed schedule
"start X; if no token by d, start Y" reaches with amplification <= 1.15, over every ordered pair
(X, Y) and d on a 1 ms grid, assuming the targets are independent: computed exactly over all
n x n pairings of the samples (and, for comparison, pairing the i-th samples only).

The fault scenario (``--faults``, on by default): target F (median 200 ms; 10% 429, 5% 500,
5% streams dropped after 3 tokens, 3% hangs) and a clean target G (median 500 ms), both allowing
assistant-prefix continuation, policy ``hedge`` with a 2 s first-token timeout; then the same
with policy ``failover`` (F first whenever it is available), because the hedge policy soon
prefers G and so meets few of F's faults. Every answer must equal, exactly, G's answer to the
same prompt fetched without routing afterwards; an exception counts as a wrong answer.

    .venv/bin/python benchmarks/routing.py                  # ~7 minutes
    .venv/bin/python benchmarks/routing.py --sigma 0.1
    .venv/bin/python benchmarks/routing.py --quick          # smoke run, ~1.5 minutes
    .venv/bin/python benchmarks/routing.py --json /tmp/routing.json   # also save raw samples
    .venv/bin/python benchmarks/routing.py --scenarios --litellm .venv-litellm/bin/python
                          # every weather side by side, from a fresh client: ~25 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import os
import shlex
import ssl
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _machine  # benchmarks/_machine.py, beside this script
import openai

import llmroute
from llmroute.testing import Profile, SimulatorProcess

MODEL = "sim-small"
ROUTE = "chat"
REPLY_TOKENS = 16
INTER_TOKEN = 0.005
REQUEST_TIMEOUT = 60.0  # seconds, one caller request (stalls are at most ~3.5 s)
HEDGE_VS_ORACLE = 1.25  # target: hedge p95 <= this x oracle p95 ...
MAX_AMPLIFICATION = 1.15  # ... with at most this amplification
FASTEST_SLACK = 1.05  # target: fastest p95 <= best single target's p95 (+5% for noise)
SEEDS = {"a": 1, "b": 2, "c": 3, "f": 4, "g": 5}  # distinct: equal seeds = correlated draws
POLICIES: dict[str, dict[str, Any]] = {
    "fastest": {"policy": "fastest"},
    "hedge": {"policy": "hedge", "hedge_after": "p95", "hedge_budget": 0.1},
    "race": {"policy": "race", "race": 2},
    "failover": {"policy": "failover"},
    "weighted": {"policy": "weighted", "weights": [1, 1, 1]},
}
POLICY_LABELS = {"race": "race (k=2)", "weighted": "weighted [1,1,1]"}


# -- the simulated targets --------------------------------------------------------------------
def target_profiles(sigma: float) -> dict[str, Profile]:
    common: dict[str, Any] = {"reply_tokens": REPLY_TOKENS, "inter_token": INTER_TOKEN}
    return {
        "a": Profile(
            ttft_median=0.25,
            ttft_sigma=sigma,
            stall_prob=0.1,
            stall_range=(1.5, 3.0),
            seed=SEEDS["a"],
            **common,
        ),
        "b": Profile(
            ttft_median=0.40,
            ttft_sigma=sigma,
            stall_prob=0.01,
            stall_range=(1.0, 1.0),
            seed=SEEDS["b"],
            **common,
        ),
        "c": Profile(ttft_median=0.70, ttft_sigma=0.0, seed=SEEDS["c"], **common),
    }


def fault_profiles(sigma: float) -> dict[str, Profile]:
    common: dict[str, Any] = {"reply_tokens": REPLY_TOKENS, "inter_token": INTER_TOKEN}
    return {
        "f": Profile(
            ttft_median=0.20,
            ttft_sigma=sigma,
            rate_429=0.10,
            rate_500=0.05,
            rate_drop=0.05,
            rate_hang=0.03,
            hang_max=30.0,
            fault_after=3,
            seed=SEEDS["f"],
            **common,
        ),
        "g": Profile(ttft_median=0.50, ttft_sigma=sigma, seed=SEEDS["g"], **common),
    }


class Sims:
    """Simulator processes, started together; one client SSL context trusts all their CAs."""

    def __init__(self, profiles: dict[str, Profile]) -> None:
        self.profiles = profiles
        self.procs: dict[str, SimulatorProcess] = {}

    def __enter__(self) -> Sims:
        procs = {name: SimulatorProcess(profile=p, tls=True) for name, p in self.profiles.items()}
        try:
            with ThreadPoolExecutor(len(procs)) as pool:
                for future in [pool.submit(p.start) for p in procs.values()]:
                    future.result()
        except BaseException:
            for p in procs.values():
                p.stop()
            raise
        self.procs = procs
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs.values():
            p.stop()

    def ssl_context(self, names: Sequence[str] | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context()
        for name in names or list(self.procs):
            ctx.load_verify_locations(cafile=self.procs[name].ca_pem_path)
        return ctx

    async def stats(self) -> dict[str, dict[str, Any]]:
        async def one(proc: SimulatorProcess) -> dict[str, Any]:
            return await asyncio.to_thread(proc.stats)  # urllib, 10 s timeout

        async with asyncio.timeout(30):
            values = await asyncio.gather(*(one(p) for p in self.procs.values()))
        return dict(zip(self.procs, values, strict=True))


def stats_delta(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, new in after.items():
        old = before[name]
        delta: dict[str, Any] = {
            key: new[key] - old[key]
            for key in (
                "chat_requests",
                "streams_started",
                "streams_completed",
                "streams_cancelled",
            )
        }
        delta["faults"] = {
            kind: count - old["faults"].get(kind, 0) for kind, count in new["faults"].items()
        }
        out[name] = delta
    return out


# -- prompts and one request --------------------------------------------------------------------
def prompts(kind: str, count: int) -> list[list[dict[str, str]]]:
    """``count`` distinct prompts; the same list in every run."""
    return [
        [
            {"role": "system", "content": "Answer in a few words."},
            {"role": "user", "content": f"{kind} question {i}: what is {i} times {i + 7}?"},
        ]
        for i in range(count)
    ]


@dataclass
class Outcome:
    """One caller request: its TTFT (create() to first content), the answer, the route report."""

    ttft: float | None = None
    text: str = ""
    route: Any = None
    error: str | None = None


async def stream_once(
    client: llmroute.AsyncOpenAI, model: str, messages: list[dict[str, str]]
) -> Outcome:
    out = Outcome()
    began = time.perf_counter()
    parts: list[str] = []
    try:
        async with asyncio.timeout(REQUEST_TIMEOUT):
            stream = await client.chat.completions.create(
                model=model, messages=messages, stream=True
            )
            out.route = stream.route
            async with stream:
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        if out.ttft is None:
                            out.ttft = time.perf_counter() - began
                        parts.append(chunk.choices[0].delta.content)
    except (openai.APIError, TimeoutError) as exc:  # StreamInterrupted, AllTargetsFailed, ...
        out.error = type(exc).__name__
    out.text = "".join(parts)
    return out


async def drive(
    once: Callable[[int], Awaitable[Outcome]], count: int, concurrency: int
) -> list[Outcome]:
    """Call ``once(i)`` for i in 0..count-1, in order, ``concurrency`` at a time."""
    results: list[Outcome | None] = [None] * count
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        while next_index < count:
            i = next_index
            next_index += 1
            results[i] = await once(i)

    async with asyncio.TaskGroup() as tg:
        for _ in range(min(concurrency, count)):
            tg.create_task(worker())
    return [r if r is not None else Outcome(error="missing") for r in results]


# -- one run --------------------------------------------------------------------------------------
@dataclass
class Run:
    name: str
    label: str
    requests: int
    outcomes: list[Outcome]
    sims: dict[str, dict[str, Any]]
    wall: float
    warmup_errors: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ttfts(self) -> list[float]:
        return [o.ttft for o in self.outcomes if o.ttft is not None]

    @property
    def errors(self) -> Counter[str]:
        return Counter(o.error for o in self.outcomes if o.error is not None)

    @property
    def server_requests(self) -> int:
        return sum(d["chat_requests"] for d in self.sims.values())

    @property
    def amplification(self) -> float:
        return self.server_requests / self.requests if self.requests else math.nan

    def counter(self, pick: Callable[[Any], Any]) -> Counter[str]:
        return Counter(pick(o.route) for o in self.outcomes if o.route is not None)


def routed_config(
    sims: Sims,
    targets: Sequence[str],
    route: dict[str, Any],
    *,
    continuation: bool = False,
) -> dict[str, Any]:
    providers: dict[str, Any] = {}
    for name in targets:
        providers[name] = {"base_url": sims.procs[name].base_url, "api_key": "sk-bench"}
        if continuation:
            providers[name]["continuation"] = {}
    return {
        "providers": providers,
        "models": {
            ROUTE: {
                "targets": [f"{name}:{MODEL}" for name in targets],
                "first_token_timeout": "5s",
                **route,
            }
        },
        "routing": {"window": "5m", "explore": 0.02},
    }


async def run_routed(
    name: str,
    label: str,
    profiles: dict[str, Profile],
    route: dict[str, Any],
    args: argparse.Namespace,
    *,
    continuation: bool = False,
    requests: int | None = None,
    check: Callable[[Sims, list[Outcome]], Awaitable[dict[str, Any]]] | None = None,
) -> Run:
    count = requests if requests is not None else args.requests
    warm, measured = prompts("warm-up", args.warmup), prompts("measured", count)
    with Sims(profiles) as sims:
        config = routed_config(sims, list(profiles), route, continuation=continuation)
        client = llmroute.AsyncOpenAI(api_key="unused", config=config, verify=sims.ssl_context())
        async with client:
            async with asyncio.timeout(30):
                await client.warmup()
            warmed = await drive(
                lambda i: stream_once(client, ROUTE, warm[i]), len(warm), args.concurrency
            )
            before = await sims.stats()
            began = time.perf_counter()
            outcomes = await drive(
                lambda i: stream_once(client, ROUTE, measured[i]), count, args.concurrency
            )
            wall = time.perf_counter() - began
            after = await sims.stats()
            run = Run(
                name,
                label,
                count,
                outcomes,
                stats_delta(before, after),
                wall,
                warmup_errors=sum(o.error is not None for o in warmed),
            )
            run.extra["warm_ttfts"] = [o.ttft for o in warmed if o.ttft is not None]
            run.extra["live_stats"] = {
                target: {"n": s.n, "ttft_p50": s.ttft_p50, "ttft_p95": s.ttft_p95}
                for target, s in client.stats().items()
            }
        if check is not None:
            run.extra.update(await check(sims, outcomes))
    return run


async def run_oracle(profiles: dict[str, Profile], args: argparse.Namespace) -> Run:
    """Every prompt to all targets at once (plain clients); TTFT = the per-request minimum."""
    warm, measured = prompts("warm-up", args.warmup), prompts("measured", args.requests)
    with Sims(profiles) as sims:
        async with AsyncExitStack() as stack:
            clients = {
                name: await stack.enter_async_context(
                    llmroute.AsyncOpenAI(
                        api_key="sk-bench",
                        base_url=proc.base_url,
                        verify=sims.ssl_context([name]),
                    )
                )
                for name, proc in sims.procs.items()
            }

            async def all_at_once(messages: list[dict[str, str]]) -> Outcome:
                # Each measures from its own create() call; gather starts them together.
                each = await asyncio.gather(
                    *(stream_once(c, MODEL, messages) for c in clients.values())
                )
                ttfts = [o.ttft for o in each if o.ttft is not None]
                best = min(ttfts) if ttfts else None
                winner = None
                if best is not None:
                    winner = next(n for n, o in zip(clients, each, strict=True) if o.ttft == best)
                errors = [o.error for o in each if o.error]
                return Outcome(
                    ttft=best, route=winner, error=errors[0] if len(errors) == 3 else None
                )

            async with asyncio.timeout(30):
                await asyncio.gather(*(c.warmup() for c in clients.values()))
            warmed = await drive(lambda i: all_at_once(warm[i]), len(warm), args.concurrency)
            before = await sims.stats()
            began = time.perf_counter()
            outcomes = await drive(
                lambda i: all_at_once(measured[i]), args.requests, args.concurrency
            )
            wall = time.perf_counter() - began
            after = await sims.stats()
    run = Run(
        "oracle",
        "oracle (min of A, B, C)",
        args.requests,
        outcomes,
        stats_delta(before, after),
        wall,
        warmup_errors=sum(o.error is not None for o in warmed),
    )
    run.extra["winners"] = dict(Counter(o.route for o in outcomes if o.route is not None))
    return run


# -- statistics -------------------------------------------------------------------------------
def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile: the smallest sample with at least q of the samples at or below."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class Schedule:
    first: str
    second: str | None
    delay: float | None
    p95: float
    amplification: float


def _survival(ordered: Sequence[float], t: float) -> float:
    """P(sample > t) over sorted samples."""
    return (len(ordered) - bisect.bisect_right(ordered, t)) / len(ordered)


def _schedule_p95_exact(x: Sequence[float], y: Sequence[float], d: float, q: float) -> float:
    """p95 of min(X, d + Y) (Y starts at d only if X has no token by then), X and Y independent,
    over all len(x) * len(y) pairings: inf{t : P(T > t) <= 1 - q}."""

    def survival(t: float) -> float:
        s = _survival(x, t)
        return s * _survival(y, t - d + 1e-9) if t >= d else s  # 1e-9: (d + v) - d != v

    def first(values: Sequence[float], shift: float) -> float:
        """The smallest ``shift + v`` (v in sorted ``values``) where the survival is low
        enough (it is non-increasing in t); ``inf`` if none."""
        lo, hi = 0, len(values)
        while lo < hi:
            mid = (lo + hi) // 2
            if survival(shift + values[mid]) <= 1 - q + 1e-12:
                hi = mid
            else:
                lo = mid + 1
        return shift + values[lo] if lo < len(values) else math.inf

    # The answer is a sample of X or d plus a sample of Y: the smallest of either that passes.
    return min(first(x, 0.0), first(y, d))


def _schedule_p95_paired(x: Sequence[float], y: Sequence[float], d: float, q: float) -> float:
    """The same, pairing the i-th sample of X with the i-th of Y only."""
    return pct([a if a <= d else min(a, d + b) for a, b in zip(x, y, strict=False)], q)


def hedging_bound(
    samples: dict[str, list[float]],
    *,
    max_amplification: float = MAX_AMPLIFICATION,
    q: float = 0.95,
    step: float = 0.001,
    paired: bool = False,
) -> Schedule:
    """The best p95 of "start X; if no token by d start Y" with amplification <= the cap.

    A sample of ``inf`` is a request the target never answered (an error, a hang): the
    schedule waits out its delay then, as it does for a slow answer."""
    ordered = {name: sorted(v) for name, v in samples.items() if v}
    best: Schedule | None = None
    for first, x in ordered.items():
        alone = Schedule(first, None, None, pct(x, q), 1.0)
        if best is None or alone.p95 < best.p95:
            best = alone
        finite = [v for v in x if math.isfinite(v)]
        if not finite:
            continue
        # The earliest delay the cap allows: fewer than that share of X's samples beyond it.
        allowed = [v for v in finite if _survival(x, v) <= max_amplification - 1.0 + 1e-12]
        if not allowed:
            continue
        start = math.floor(min(allowed) / step) * step
        for second, y in ordered.items():
            if second == first:
                continue
            ys = samples[second] if paired else y
            xs = samples[first] if paired else x
            d = round(start, 6)
            while d <= finite[-1]:
                amp = 1.0 + _survival(x, d)
                if amp <= max_amplification + 1e-12:
                    p95 = (
                        _schedule_p95_paired(xs, ys, d, q)
                        if paired
                        else _schedule_p95_exact(x, y, d, q)
                    )
                    if p95 < best.p95:
                        best = Schedule(first, second, d, p95, amp)
                d = round(d + step, 6)
    assert best is not None
    return best


# -- output -------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    info = _machine.machine(("llmroute", "openai", "h2", "anyio", "hypercorn"))
    root = Path(__file__).resolve().parents[1]
    commit = "?"
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            # The library only: edits to benchmarks/ or docs/ do not change what is measured.
            ["git", "-C", str(root), "status", "--porcelain", "--", "llmroute", "providers"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        if dirty:
            commit += " (with uncommitted changes to llmroute/)"
    except (OSError, subprocess.SubprocessError):
        pass
    return {**info, "commit": commit}


def ms(seconds: float | None) -> str:
    return "-" if seconds is None or math.isnan(seconds) else f"{1000 * seconds:.0f}"


def share(counter: Counter[str] | dict[str, int], total: int) -> str:
    if not counter or not total:
        return "-"

    def percent(n: int) -> str:
        value = 100 * n / total
        return "<1%" if 0 < value < 0.5 else f"{value:.0f}%"

    return " ".join(
        f"{name.split(':')[0].upper()} {percent(n)}" for name, n in sorted(counter.items())
    )


def print_report(
    runs: dict[str, Run],
    bound: Schedule,
    bound_paired: Schedule,
    faults: list[Run],
    args: argparse.Namespace,
    info: dict[str, Any],
    elapsed: float,
) -> dict[str, bool]:
    oracle = runs["oracle"]
    o95 = pct(oracle.ttfts, 0.95)
    print()
    print(f"Command: {info['command']}")
    print(
        f"Machine: {info['machine']['nproc']} CPUs, {info['machine']['cpu']}, "
        f"Python {info['machine']['python']}; llmroute at {info['machine']['commit']}"
    )
    print(
        f"Targets (sigma {args.sigma}): A median 250 ms, 10% stalls +1.5..3 s; "
        f"B median 400 ms, 1% stalls +1 s; C 700 ms steady. {REPLY_TOKENS}-token replies, "
        f"{1000 * INTER_TOKEN:.0f} ms apart. {args.requests} measured requests per run after "
        f"{args.warmup} warm-up, concurrency {args.concurrency}. Runtime {elapsed:.0f} s."
    )
    print()
    print(
        "| run | TTFT p50 ms | p95 ms | p99 ms | p95 / oracle p95 | amplification "
        "| hedges (denied) | first attempt | winner | errors | wall s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | ---: | ---: |")
    for run in runs.values():
        t = run.ttfts
        routed = any(o.route is not None and not isinstance(o.route, str) for o in run.outcomes)
        if routed:
            hedges = sum(o.route.hedges for o in run.outcomes if o.route is not None)
            denied = sum(o.route.hedges_denied for o in run.outcomes if o.route is not None)
            first = share(
                run.counter(lambda r: r.attempts[0].target if r.attempts else "?"), run.requests
            )
            winner = share(run.counter(lambda r: r.winner or "?"), run.requests)
            hedge_cell = f"{hedges} ({denied})"
        else:
            first, hedge_cell = "all three", "-"
            winner = share(run.extra.get("winners", {}), run.requests)
        errors = sum(run.errors.values())
        print(
            f"| {run.label} | {ms(pct(t, 0.5))} | {ms(pct(t, 0.95))} | {ms(pct(t, 0.99))} "
            f"| {pct(t, 0.95) / o95:.2f}x | {run.amplification:.3f} | {hedge_cell} | {first} "
            f"| {winner} | {errors} | {run.wall:.0f} |"
        )
    print()

    def describe(s: Schedule) -> str:
        if s.second is None:
            return f"{s.first.upper()} alone"
        assert s.delay is not None
        return (
            f"start {s.first.upper()}, hedge to {s.second.upper()} after "
            f"{1000 * s.delay:.0f} ms (amplification {s.amplification:.3f})"
        )

    if args.warmup:
        cold = []
        for run in runs.values():
            warm = run.extra.get("warm_ttfts")
            if warm and run.name in ("fastest", "hedge", "race", "failover", "weighted"):
                cold.append(f"{run.name} p50 {ms(pct(warm, 0.5))} / p95 {ms(pct(warm, 0.95))}")
        print(
            f"Cold start (the {args.warmup} warm-up requests of each fresh client, not in the "
            f"table): " + "; ".join(cold) + " ms"
        )
    hedge = runs["hedge"]
    h95 = pct(hedge.ttfts, 0.95)
    print(f"hedge: {hedge_summary(hedge)}")
    for name in ("fastest", "hedge"):
        print(f"{name} by quarter of the measured requests: {by_quarter(runs[name])}")
    print(
        f"Hedging bound (best fixed one-hedge schedule with amplification <= "
        f"{MAX_AMPLIFICATION}, from the solo runs' samples, independence assumed): "
        f"p95 {ms(bound.p95)} ms = {bound.p95 / o95:.2f}x oracle p95: {describe(bound)}. "
        f"Pairing only the i-th samples: {ms(bound_paired.p95)} ms ({describe(bound_paired)})."
    )
    print(
        f"hedge p95 {ms(h95)} ms = {h95 / bound.p95:.2f}x the hedging bound "
        f"({h95 / o95:.2f}x oracle p95)."
    )
    print()
    checks: dict[str, bool] = {}
    amp = hedge.amplification
    ok_hedge = h95 <= HEDGE_VS_ORACLE * o95 and amp <= MAX_AMPLIFICATION
    checks["hedge"] = ok_hedge
    print(
        f"{'PASS' if ok_hedge else 'FAIL'}  hedge p95 <= {HEDGE_VS_ORACLE} x oracle p95 with "
        f"amplification <= {MAX_AMPLIFICATION}: p95 {ms(h95)} ms vs {HEDGE_VS_ORACLE} x "
        f"{ms(o95)} = {ms(HEDGE_VS_ORACLE * o95)} ms "
        f"({'ok' if h95 <= HEDGE_VS_ORACLE * o95 else 'missed'}); amplification {amp:.3f} "
        f"({'ok' if amp <= MAX_AMPLIFICATION else 'missed'})"
    )
    singles = {name: pct(run.ttfts, 0.95) for name, run in runs.items() if name.startswith("solo")}
    best_name = min(singles, key=lambda n: singles[n])
    best95 = singles[best_name]
    f95 = pct(runs["fastest"].ttfts, 0.95)
    ok_fastest = f95 <= FASTEST_SLACK * best95
    checks["fastest"] = ok_fastest
    print(
        f"{'PASS' if ok_fastest else 'FAIL'}  fastest p95 <= best single target p95 (+5%): "
        f"fastest {ms(f95)} ms vs {runs[best_name].label} {ms(best95)} ms "
        f"(limit {ms(FASTEST_SLACK * best95)} ms)"
    )
    if faults:
        checks["faults"] = print_faults(faults, args)
    return checks


def hedge_summary(run: Run) -> str:
    """When the hedges of a run started (after the request began) and where they went."""
    reports = [o.route for o in run.outcomes if o.route is not None]
    hedges = [a for r in reports for a in r.attempts if a.reason == "hedge"]
    if not hedges:
        return "no hedges fired"
    starts = [a.started for a in hedges]
    where = Counter(a.target.split(":")[0].upper() for a in hedges)
    won = sum(a.outcome == "won" for a in hedges)
    primaries = [r.attempts[0] for r in reports if r.attempts]
    primary_won = [a.ttft for a in primaries if a.outcome == "won" and a.ttft is not None]
    return (
        f"{len(hedges)} hedges fired at {ms(pct(starts, 0.5))} ms median "
        f"({ms(min(starts))}..{ms(max(starts))} ms) after the request began, to "
        + ", ".join(f"{k} {v}" for k, v in sorted(where.items()))
        + f"; {won} of them won; {sum(r.hedges_denied for r in reports)} denied by the budget. "
        f"Primary attempts that won: {len(primary_won)}/{len(primaries)}, their TTFT p95 "
        f"{ms(pct(primary_won, 0.95))} ms"
    )


def by_quarter(run: Run) -> str:
    """p95 and the first attempt's target in each quarter of the measured requests, in order
    (shows how long a policy took to settle)."""
    cells = []
    size = max(1, math.ceil(len(run.outcomes) / 4))
    for start in range(0, len(run.outcomes), size):
        part = run.outcomes[start : start + size]
        t = [o.ttft for o in part if o.ttft is not None]
        first = Counter(
            o.route.attempts[0].target for o in part if o.route is not None and o.route.attempts
        )
        cells.append(f"p95 {ms(pct(t, 0.95))} ms, first attempt {share(first, len(part))}")
    return "; ".join(cells)


def not_sent(reports: Sequence[Any], reason: str) -> int:
    """Attempts of ``reason`` that never went out: their target was unavailable then."""
    return sum(
        1
        for r in reports
        for a in r.attempts
        if a.reason == reason and (a.error or "").startswith("TargetUnavailable")
    )


def fault_rows(run: Run) -> list[tuple[str, str]]:
    reports = [o.route for o in run.outcomes if o.route is not None]
    reasons: Counter[str] = Counter(a.reason for r in reports for a in r.attempts)
    outcomes: Counter[str] = Counter(a.outcome for r in reports for a in r.attempts)
    hedges = sum(r.hedges for r in reports)
    denied = sum(r.hedges_denied for r in reports)
    continued = sum(len(r.continued_on) for r in reports)
    continued_requests = sum(1 for r in reports if r.continued_on)
    correct = run.extra.get("correct", 0)
    t = run.ttfts
    joined = ", ".join
    return [
        (
            "answers exactly correct",
            f"{correct}/{run.requests} ({100 * correct / run.requests:.1f}%)",
        ),
        ("wrong text (no exception)", str(run.extra.get("wrong_text", 0))),
        ("exceptions", joined(f"{k} {v}" for k, v in sorted(run.errors.items())) or "0"),
        (
            "faults F served (measured phase)",
            joined(f"{k} {v}" for k, v in sorted(run.sims["f"]["faults"].items())) or "none",
        ),
        (
            "requests F / G received",
            f"{run.sims['f']['chat_requests']} / {run.sims['g']['chat_requests']}",
        ),
        ("hedges fired (denied)", f"{hedges} ({denied})"),
        ("hedges never sent (target unavailable)", str(not_sent(reports, "hedge"))),
        ("failover attempts", str(reasons.get("failover", 0))),
        ("retry attempts", str(reasons.get("retry", 0))),
        ("continuations (requests continued)", f"{continued} ({continued_requests})"),
        ("attempt outcomes", joined(f"{k} {v}" for k, v in sorted(outcomes.items()))),
        (
            "first attempt",
            share(run.counter(lambda r: r.attempts[0].target if r.attempts else "?"), run.requests),
        ),
        ("TTFT p50 / p95 / p99 ms", f"{ms(pct(t, 0.5))} / {ms(pct(t, 0.95))} / {ms(pct(t, 0.99))}"),
        ("amplification", f"{run.amplification:.3f}"),
        ("warm-up requests failed", str(run.warmup_errors)),
    ]


def print_faults(runs: Sequence[Run], args: argparse.Namespace) -> bool:
    print()
    print(
        f"Fault scenario (sigma {args.sigma}): F median 200 ms with 10% 429, 5% 500, 5% drops "
        f"after 3 tokens, 3% hangs; G median 500 ms, clean; both allow continuation; "
        f"first_token_timeout 2s; {runs[0].requests} requests after {args.warmup} warm-up, "
        f"concurrency {args.concurrency}. The target is policy hedge; failover (F always first "
        f"while available) is run too, so that more of F's faults are exercised."
    )
    print()
    columns = [fault_rows(run) for run in runs]
    print("| fault scenario | " + " | ".join(run.label for run in runs) + " |")
    print("| --- |" + " ---: |" * len(runs))
    for i, (key, _) in enumerate(columns[0]):
        print(f"| {key} | " + " | ".join(col[i][1] for col in columns) + " |")
    print()
    ok_all = True
    for run in runs:
        print(f"{run.label} hedges: {hedge_summary(run)}")
    for run in runs:
        correct = run.extra.get("correct", 0)
        ok = correct == run.requests
        ok_all = ok_all and ok
        print(
            f"{'PASS' if ok else 'FAIL'}  {run.label}: 100% of answers exactly correct: "
            f"{correct}/{run.requests}"
        )
    return ok_all


# -- main ------------------------------------------------------------------------------------------
async def check_answers(sims: Sims, outcomes: list[Outcome]) -> dict[str, Any]:
    """Compare each answer with G's answer to the same prompt, fetched without routing."""
    measured = prompts("measured", len(outcomes))
    async with llmroute.AsyncOpenAI(
        api_key="sk-bench", base_url=sims.procs["g"].base_url, verify=sims.ssl_context(["g"])
    ) as plain:
        reference = await drive(lambda i: stream_once(plain, MODEL, measured[i]), len(measured), 32)
    if any(r.error for r in reference):
        raise RuntimeError(f"reference requests to G failed: {Counter(r.error for r in reference)}")
    correct = sum(
        o.error is None and o.text == r.text for o, r in zip(outcomes, reference, strict=True)
    )
    wrong = sum(
        o.error is None and o.text != r.text for o, r in zip(outcomes, reference, strict=True)
    )
    return {"correct": correct, "wrong_text": wrong}


async def run_all(args: argparse.Namespace) -> tuple[dict[str, Run], list[Run]]:
    profiles = target_profiles(args.sigma)
    runs: dict[str, Run] = {}

    def done(run: Run) -> None:
        runs[run.name] = run
        t = run.ttfts
        print(
            f"  {run.label:<26} p50 {ms(pct(t, 0.5)):>5}  p95 {ms(pct(t, 0.95)):>5}  "
            f"p99 {ms(pct(t, 0.99)):>5} ms  amplification {run.amplification:.3f}  "
            f"errors {sum(run.errors.values())}  ({run.wall:.0f} s)",
            flush=True,
        )

    for name in profiles:
        solo = {name: profiles[name]}
        route = {"policy": "failover"}
        done(await run_routed(f"solo-{name}", f"{name.upper()} alone", solo, route, args))
    for policy, route in POLICIES.items():
        done(await run_routed(policy, POLICY_LABELS.get(policy, policy), profiles, route, args))
    done(await run_oracle(profiles, args))
    faults: list[Run] = []
    if args.faults:
        for policy, label in (("hedge", "hedge F, G"), ("failover", "failover F, G")):
            route = {**POLICIES[policy], "first_token_timeout": "2s"}
            run = await run_routed(
                f"faults-{policy}",
                label,
                fault_profiles(args.sigma),
                route,
                args,
                continuation=True,
                requests=args.fault_requests,
                check=check_answers,
            )
            faults.append(run)
            print(
                f"  faults, {run.label:<19} correct {run.extra.get('correct')}/{run.requests}  "
                f"errors {sum(run.errors.values())}  ({run.wall:.0f} s)",
                flush=True,
            )
    return runs, faults


def request_record(o: Outcome) -> dict[str, Any]:
    """One measured request, for --json."""
    out: dict[str, Any] = {"ttft": o.ttft, "error": o.error}
    if isinstance(o.route, str):
        out["winner"] = o.route
    elif o.route is not None:
        r = o.route
        out.update(
            winner=r.winner,
            hedges=r.hedges,
            hedges_denied=r.hedges_denied,
            continued_on=list(r.continued_on),
            explored=r.explored,
            attempts=[
                [a.target, a.reason, round(a.started, 4), a.outcome, a.ttft, a.error]
                for a in r.attempts
            ],
        )
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--scenarios" in argv:  # routing under change: benchmarks/routing_scenarios.py
        import routing_scenarios

        return routing_scenarios.main([a for a in argv if a != "--scenarios"])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=None, help="measured requests per run (320)")
    p.add_argument("--concurrency", type=int, default=8, help="requests at once (8)")
    p.add_argument("--sigma", type=float, default=0.2, help="lognormal sigma of A and B (0.2)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up requests per run (200)")
    p.add_argument(
        "--faults",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the fault scenario (default: yes)",
    )
    p.add_argument("--fault-requests", type=int, default=None, help="fault scenario (300)")
    p.add_argument("--quick", action="store_true", help="60 requests, 10 warm-up: a smoke run")
    p.add_argument("--json", metavar="FILE", help="also write the raw samples and results here")
    p.add_argument(
        "--run-timeout",
        type=float,
        default=900.0,
        help="time bound, seconds per run (900; the whole benchmark: runs x this)",
    )
    args = p.parse_args(argv)
    if args.requests is None:
        args.requests = 60 if args.quick else 320
    if args.warmup is None:
        args.warmup = 10 if args.quick else 200
    if args.fault_requests is None:
        args.fault_requests = 60 if args.quick else 300
    if min(args.requests, args.concurrency, args.fault_requests) < 1 or args.warmup < 0:
        p.error("--requests, --concurrency and --fault-requests must be >= 1, --warmup >= 0")
    if args.sigma < 0:
        p.error("--sigma must be >= 0")

    info = {
        "command": " ".join(shlex.quote(a) for a in [".venv/bin/python", *sys.argv]),
        "machine": machine(),
    }
    print(
        f"routing benchmark: {args.requests} requests per run, warm-up {args.warmup}, "
        f"concurrency {args.concurrency}, sigma {args.sigma}; client pid {os.getpid()}",
        flush=True,
    )
    began = time.perf_counter()

    async def bounded() -> tuple[dict[str, Run], list[Run]]:
        runs_count = 3 + len(POLICIES) + 1 + (2 if args.faults else 0)
        async with asyncio.timeout(args.run_timeout * runs_count):
            return await run_all(args)

    runs, faults = asyncio.run(bounded())
    samples = {
        name.removeprefix("solo-"): run.ttfts for name, run in runs.items() if "solo" in name
    }
    bound = hedging_bound(samples)
    bound_paired = hedging_bound(samples, paired=True)
    elapsed = time.perf_counter() - began
    checks = print_report(runs, bound, bound_paired, faults, args, info, elapsed)
    if args.json:
        every = {**runs, **{run.name: run for run in faults}}
        doc = {
            **info,
            "config": {
                k: getattr(args, k)
                for k in ("requests", "concurrency", "sigma", "warmup", "fault_requests")
            },
            "checks": checks,
            "hedging_bound": vars(bound),
            "hedging_bound_paired": vars(bound_paired),
            "runs": {
                name: {
                    "label": run.label,
                    "ttft": run.ttfts,
                    "p50": pct(run.ttfts, 0.5),
                    "p95": pct(run.ttfts, 0.95),
                    "p99": pct(run.ttfts, 0.99),
                    "amplification": run.amplification,
                    "errors": dict(run.errors),
                    "sims": run.sims,
                    "wall": run.wall,
                    "extra": run.extra,
                    "requests": [request_record(o) for o in run.outcomes],
                }
                for name, run in every.items()
            },
        }
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
