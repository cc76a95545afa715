"""Cache benchmark: a disk-cache hit against a live call, and a Zipf workload with and without.

Part 1, hit vs live, first with the in-memory cache, then the disk cache. One client with the
cache (the disk one in a fresh directory) and one simulator in its
own process (``SimulatorProcess``, TLS + HTTP/2, zero latency, 20-token replies). A prompt is asked
until it is stored; then ``--pairs`` pairs are measured, interleaved: the stored prompt (a hit)
and the same prompt with ``x-llmroute-cache: off`` (a live call on the same warm connection). Time
to first chunk is from the ``create()`` call to the first chunk that carries content, streamed;
also its client CPU, the wall and CPU time before the call first reaches llmroute (its early
cache check for plain JSON arguments, ``AsyncOpenAI._cache_first``, else the seam
``AsyncOpenAI.request`` after openai's own request machinery; both wrapped by this script to note
the time), and the CPU from there to that chunk (llmroute's part, the median of each hit's own).

Part 2, a Zipf workload. ``--requests`` (2,000) requests over ``--prompts`` (500) distinct prompts,
prompt ranks drawn from a Zipf law (exponent ``--zipf``, 1.0) with a fixed seed, sent
``--concurrency`` (32) at a time through a route to one simulated target with a 300 ms median TTFT
(lognormal sigma 0.2) and 20 tokens 5 ms apart. The same sequence runs twice in this process
against the same simulator: without the cache, then with the disk cache (default settings:
``min_hits`` 2, single-flight on). Reported: the requests that reached the simulator (its own
counter), and the caller's p50/p95 TTFT (nearest rank).

Or, with ``--fresh N``, only a fresh process's first disk-cache hit: one process stores a
prompt's answer in a new disk cache directory, then each of ``N`` new Python processes builds a
client on that directory and asks the prompt ``--later`` + 1 times (streamed, plain JSON
arguments, no warmup); the first ask's time to first content chunk (and its CPU) is set against
the median of the later ones. A child run with ``--profile`` writes a cProfile of its first hit
(on ``time.process_time``) instead of timing it.

    .venv/bin/python benchmarks/cache.py            # about a minute
    .venv/bin/python benchmarks/cache.py --quick    # smoke run
    .venv/bin/python benchmarks/cache.py --fresh 10 # a fresh process's first hit, 10 processes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import machine

from llmroute import AsyncOpenAI
from llmroute.testing import Profile, SimulatorProcess

KEY = "sk-bench-cache"


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


SEAM: list[tuple[float, float]] = []  # (wall, CPU) when a call reached llmroute's seam


def _note_seam() -> None:
    """Record when each call first reaches llmroute: its early cache check
    (``AsyncOpenAI._cache_first``, before openai's ``create()`` builds the request, for plain
    JSON arguments) or ``AsyncOpenAI.request`` (after openai's own machinery)."""
    real_request = AsyncOpenAI.request
    real_first = getattr(AsyncOpenAI, "_cache_first", None)  # absent before issue 18's pass 3

    async def request(self: AsyncOpenAI, *args: Any, **kwargs: Any) -> Any:
        SEAM.append((time.perf_counter(), time.process_time()))
        return await real_request(self, *args, **kwargs)

    async def cache_first(self: AsyncOpenAI, *args: Any, **kwargs: Any) -> Any:
        SEAM.append((time.perf_counter(), time.process_time()))
        return await real_first(self, *args, **kwargs)  # type: ignore[misc]

    AsyncOpenAI.request = request  # type: ignore[method-assign]
    if real_first is not None:
        AsyncOpenAI._cache_first = cache_first  # type: ignore[method-assign]


async def first_chunk(
    client: AsyncOpenAI,
    model: str,
    prompt: str,
    out: dict[str, list[float]] | None = None,
    **extra: Any,
) -> float:
    """Seconds from create() to the first chunk with content; the stream is read to its end.
    With ``out``: also the CPU to that chunk and the wall and CPU time spent before the seam."""
    SEAM.clear()
    started, cpu = time.perf_counter(), time.process_time()
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        stream=True,
        **extra,
    )
    ttft = math.nan
    async with stream:
        async for chunk in stream:
            if math.isnan(ttft) and chunk.choices and chunk.choices[0].delta.content:
                ttft = time.perf_counter() - started
                if out is not None:
                    out["cpu"].append(time.process_time() - cpu)
                    if SEAM:
                        out["seam"].append(SEAM[0][0] - started)
                        out["seam_cpu"].append(SEAM[0][1] - cpu)
                        out["ours_cpu"].append(out["cpu"][-1] - out["seam_cpu"][-1])
    return ttft


async def settle(client: AsyncOpenAI) -> None:
    cache = client._cache
    while cache is not None and cache._flights:  # noqa: ASYNC110
        await asyncio.sleep(0.002)


def _ms(values: Sequence[float]) -> dict[str, float]:
    return {"p50": pct(values, 0.5) * 1e3, "p95": pct(values, 0.95) * 1e3}


async def hit_vs_live(pairs: int, directory: str, backend: str = "disk") -> dict[str, Any]:
    with SimulatorProcess(Profile(reply_tokens=20)) as sim:
        config: dict[str, Any] = {"cache": {"backend": backend}}
        if backend == "disk":
            config["cache"]["path"] = directory
        async with AsyncOpenAI(
            api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context(), config=config
        ) as client:
            await client.warmup()
            prompt = "What is a cache hit?"
            for _ in range(3):
                await first_chunk(client, "sim-small", prompt)
                await settle(client)
            hits: list[float] = []
            live: list[float] = []
            parts = ("cpu", "seam", "seam_cpu", "ours_cpu")
            hit_parts: dict[str, list[float]] = {part: [] for part in parts}
            live_parts: dict[str, list[float]] = {part: [] for part in parts}
            off = {"extra_headers": {"x-llmroute-cache": "off"}}
            for i in range(pairs):
                order = (True, False) if i % 2 == 0 else (False, True)
                for cached in order:
                    if cached:
                        hits.append(await first_chunk(client, "sim-small", prompt, hit_parts))
                    else:
                        live.append(
                            await first_chunk(client, "sim-small", prompt, live_parts, **off)
                        )
            assert client._cache is not None
            stats = await client._cache.stats()
            assert stats.hits >= pairs, stats
    return {
        "backend": backend,
        "pairs": pairs,
        "hit_ms": _ms(hits),
        "hit_cpu_ms": _ms(hit_parts["cpu"]),
        "hit_before_seam_ms": _ms(hit_parts["seam"]),
        "hit_before_seam_cpu_ms": _ms(hit_parts["seam_cpu"]),
        "hit_after_seam_cpu_ms": _ms(hit_parts["ours_cpu"]),
        "live_ms": _ms(live),
        "live_cpu_ms": _ms(live_parts["cpu"]),
        "ratio_p50": pct(hits, 0.5) / pct(live, 0.5),
    }


def _report(part: dict[str, Any]) -> str:
    return (
        f"{part['backend']}-cache hit vs live ({part['pairs']} interleaved pairs, time to first "
        "content chunk):\n"
        f"  hit   p50 {part['hit_ms']['p50']:.3f} ms  p95 {part['hit_ms']['p95']:.3f} ms  "
        f"(CPU p50 {part['hit_cpu_ms']['p50']:.3f} ms; before llmroute sees the call "
        f"p50 {part['hit_before_seam_ms']['p50']:.3f} ms, CPU "
        f"{part['hit_before_seam_cpu_ms']['p50']:.3f} ms; llmroute's part to the chunk, CPU "
        f"p50 {part['hit_after_seam_cpu_ms']['p50']:.3f} ms)\n"
        f"  live  p50 {part['live_ms']['p50']:.3f} ms  p95 {part['live_ms']['p95']:.3f} ms  "
        f"(CPU p50 {part['live_cpu_ms']['p50']:.3f} ms)\n"
        f"  hit / live p50  {part['ratio_p50']:.3f}x"
    )


def zipf_sequence(requests: int, prompts: int, exponent: float, seed: int) -> list[int]:
    weights = [1.0 / (rank**exponent) for rank in range(1, prompts + 1)]
    return random.Random(seed).choices(range(prompts), weights=weights, k=requests)


async def workload(
    sim: SimulatorProcess, sequence: list[int], concurrency: int, cache: dict[str, Any] | None
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "providers": {"sim": {"base_url": sim.base_url, "api_key": KEY}},
        "models": {"chat": {"targets": ["sim:sim-small"], "policy": "fastest"}},
        "routing": {"explore": 0},
    }
    if cache is not None:
        config["cache"] = cache
    before = sim.stats()["chat_requests"]
    ttfts: list[float] = []
    queue = list(enumerate(sequence))
    started = time.perf_counter()
    async with AsyncOpenAI(api_key=KEY, verify=sim.ssl_context(), config=config) as client:
        await client.warmup()

        async def worker() -> None:
            while queue:
                _, rank = queue.pop(0)
                ttfts.append(await first_chunk(client, "chat", f"Popular prompt number {rank}."))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        await settle(client)
        hit_rate = None
        if client._cache is not None:
            hit_rate = (await client._cache.stats()).hit_rate
    upstream = sim.stats()["chat_requests"] - before
    return {
        "requests": len(sequence),
        "upstream": upstream,
        "p50_ms": pct(ttfts, 0.5) * 1e3,
        "p95_ms": pct(ttfts, 0.95) * 1e3,
        "wall_s": time.perf_counter() - started,
        "hit_rate": hit_rate,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        _note_seam()
        floor = await hit_vs_live(args.pairs, str(Path(tmp) / "memory"), "memory")
        print(_report(floor), flush=True)
        part1 = await hit_vs_live(args.pairs, str(Path(tmp) / "hit"))
        print(_report(part1), f"\n  load average {os.getloadavg()}", flush=True)
        if args.hits_only:
            return {
                "machine": machine(["llmroute", "diskcache", "httpx", "h2", "openai"]),
                "memory": floor,
                "hit_vs_live": part1,
            }
        profile = Profile(
            reply_tokens=20, inter_token=0.005, ttft_median=0.3, ttft_sigma=0.2, seed=7
        )
        sequence = zipf_sequence(args.requests, args.prompts, args.zipf, seed=11)
        distinct = len(set(sequence))
        with SimulatorProcess(profile) as sim:
            without = await workload(sim, sequence, args.concurrency, None)
            with_cache = await workload(
                sim,
                sequence,
                args.concurrency,
                {"backend": "disk", "path": str(Path(tmp) / "zipf")},
            )
    saved = without["upstream"] - with_cache["upstream"]
    print(
        f"\nZipf workload: {args.requests} requests over {args.prompts} prompts "
        f"(exponent {args.zipf}; {distinct} distinct asked), {args.concurrency} at a time, "
        "300 ms median TTFT:\n"
        f"  {'':14} {'upstream':>9} {'p50 TTFT':>10} {'p95 TTFT':>10} {'wall':>7}\n"
        f"  {'no cache':14} {without['upstream']:>9} {without['p50_ms']:>8.1f}ms "
        f"{without['p95_ms']:>8.1f}ms {without['wall_s']:>6.1f}s\n"
        f"  {'disk cache':14} {with_cache['upstream']:>9} {with_cache['p50_ms']:>8.1f}ms "
        f"{with_cache['p95_ms']:>8.1f}ms {with_cache['wall_s']:>6.1f}s\n"
        f"  upstream requests saved: {saved} ({saved / without['upstream']:.1%}); "
        f"cache hit rate {with_cache['hit_rate']:.1%}"
    )
    return {
        "machine": machine(["llmroute", "diskcache", "httpx", "h2", "openai"]),
        "memory": floor,
        "hit_vs_live": part1,
        "zipf": {"distinct": distinct, "without": without, "with": with_cache, "saved": saved},
    }


_PROMPT = "What is a cache hit?"


async def fresh_child(
    directory: str, base_url: str, ca: str, later: int, profile: str | None
) -> dict[str, Any]:
    """In a new process: the first hit on a stored prompt, then ``later`` more."""
    import ssl

    config = {"cache": {"backend": "disk", "path": directory}}
    verify = ssl.create_default_context(cafile=ca)
    async with AsyncOpenAI(api_key=KEY, base_url=base_url, verify=verify, config=config) as c:
        cpu: dict[str, list[float]] = {"cpu": [], "seam": [], "seam_cpu": [], "ours_cpu": []}
        if profile is not None:
            import cProfile

            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
            await first_chunk(c, "sim-small", _PROMPT, cpu)
            profiler.disable()
            profiler.dump_stats(profile)
            return {}
        first = await first_chunk(c, "sim-small", _PROMPT, cpu)
        hits = [await first_chunk(c, "sim-small", _PROMPT, cpu) for _ in range(later)]
        assert c._cache is not None
        stats = await c._cache.stats()
    return {
        "first_ms": first * 1e3,
        "first_cpu_ms": cpu["cpu"][0] * 1e3,
        "later_ms": pct(hits, 0.5) * 1e3,
        "later_cpu_ms": pct(cpu["cpu"][1:], 0.5) * 1e3,
        "hits": stats.hits,
    }


async def store_answer(sim: SimulatorProcess, directory: str) -> int:
    """Ask until the prompt's answer is stored in ``directory``; the store's hits so far."""
    config = {"cache": {"backend": "disk", "path": directory}}
    async with AsyncOpenAI(
        api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context(), config=config
    ) as client:
        for _ in range(3):
            await first_chunk(client, "sim-small", _PROMPT)
            await settle(client)
        assert (await first_chunk(client, "sim-small", _PROMPT)) > 0
        assert client._cache is not None
        return (await client._cache.stats()).hits


def fresh(processes: int, later: int) -> dict[str, Any]:
    """``processes`` fresh processes' first hits on one stored prompt (see the docstring)."""
    import subprocess

    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, SimulatorProcess(Profile(reply_tokens=20)) as sim:
        hits = asyncio.run(store_answer(sim, tmp))
        child = [sys.executable, __file__, "--fresh-child", tmp, sim.base_url, sim.ca_pem_path]
        for _ in range(processes):
            done = subprocess.run(
                [*child, str(later)], capture_output=True, text=True, timeout=120, check=True
            )
            runs.append(json.loads(done.stdout.splitlines()[-1]))
            assert runs[-1]["hits"] == hits + later + 1, runs  # every ask was a hit
            hits = runs[-1]["hits"]
    firsts = [r["first_ms"] for r in runs]
    laters = [r["later_ms"] for r in runs]
    return {
        "processes": processes,
        "later": later,
        "runs": runs,
        "first_ms": {"p50": pct(firsts, 0.5), "max": max(firsts)},
        "first_cpu_ms": {"p50": pct([r["first_cpu_ms"] for r in runs], 0.5)},
        "later_ms": {"p50": pct(laters, 0.5)},
        "ratio_p50": pct(firsts, 0.5) / pct(laters, 0.5),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=500, help="hit/live pairs (500)")
    p.add_argument("--requests", type=int, default=2000, help="Zipf workload requests (2000)")
    p.add_argument("--prompts", type=int, default=500, help="distinct prompts (500)")
    p.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent (1.0)")
    p.add_argument("--concurrency", type=int, default=32, help="requests at once (32)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 50 pairs, 200 requests")
    p.add_argument("--hits-only", action="store_true", help="only the hit-vs-live parts")
    p.add_argument("--json", metavar="FILE", help="also write the results here")
    p.add_argument("--fresh", type=int, metavar="N", help="only a fresh process's first hit")
    p.add_argument("--later", type=int, default=20, help="hits after the first (--fresh; 20)")
    p.add_argument("--profile", metavar="FILE", help="(--fresh-child) cProfile the first hit")
    p.add_argument("--fresh-child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.fresh_child:
        directory, base_url, ca, later = args.fresh_child
        child = fresh_child(directory, base_url, ca, int(later), args.profile)
        print(json.dumps(asyncio.run(child)))
        return 0
    if args.fresh:
        found = fresh(args.fresh, args.later)
        for i, one in enumerate(found["runs"], 1):
            print(
                f"process {i}: first hit {one['first_ms']:.3f} ms (CPU {one['first_cpu_ms']:.3f}"
                f" ms), later hits p50 {one['later_ms']:.3f} ms (CPU {one['later_cpu_ms']:.3f} ms)"
            )
        print(
            f"a fresh process's first disk hit, {found['processes']} processes: p50 "
            f"{found['first_ms']['p50']:.3f} ms (max {found['first_ms']['max']:.3f} ms, CPU p50 "
            f"{found['first_cpu_ms']['p50']:.3f} ms); later hits p50 "
            f"{found['later_ms']['p50']:.3f} ms; first / later {found['ratio_p50']:.1f}x"
        )
        found["machine"] = machine(["llmroute", "diskcache", "httpx", "h2", "openai"])
        if args.json:
            Path(args.json).write_text(json.dumps(found, indent=2))
        return 0
    if args.quick:
        args.pairs, args.requests, args.prompts = 50, 200, 50
    results = asyncio.run(run(args))
    print(f"\nmachine: {json.dumps(results['machine'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
