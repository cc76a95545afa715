"""Client CPU overhead of streaming: llmroute vs openai vs raw httpx, side by side.

Zero-latency simulators in *separate processes* (so ``time.process_time()`` counts only the
client) stream ``--tokens``-token replies, one SSE chunk per token, over TLS, in two framings:
``event`` (one SSE event per HTTP/2 DATA frame and per TLS record, as vendors that flush every
token send it) and ``coalesced`` (hypercorn packs what the app wrote meanwhile, ~8 events, into
one frame). ``--token-bytes 4096`` makes every event ~4 KB (tool-call arguments). Three clients
are measured against each framing, all six interleaved in one run in rotated order, because
absolute CPU times drift on a shared machine and only ratios measured side by side mean
something:

``httpx``     the floor: ``httpx.AsyncClient(http2=True)``, ``client.stream(...)`` and
              ``aiter_lines()``, counting ``data:`` lines (no JSON parsing, no objects).
``openai``    ``openai.AsyncOpenAI`` with its default HTTP client config (HTTP/1.1),
              ``stream=True``, iterating ``ChatCompletionChunk`` objects.
``llmroute``  ``llmroute.AsyncOpenAI`` (its own h2 transport), ``stream=True``, iterating chunks.

Each client is warmed up first (connection open, imports and caches hot). Then ``--rounds``
rounds each run every client for ``--streams`` streams (``--concurrency`` at a time). Reported:
medians over rounds of client CPU seconds and wall seconds per 1000 chunks, and the ratios
llmroute/httpx and llmroute/openai (median of the per-round ratios, so each ratio compares
measurements taken seconds apart).

    .venv/bin/python benchmarks/overhead.py                      # defaults: 7 rounds x 5 streams
    .venv/bin/python benchmarks/overhead.py --rounds 9 --json    # machine-readable output
    .venv/bin/python benchmarks/overhead.py --framing event --token-bytes 4096
    .venv/bin/python benchmarks/overhead.py --profile llmroute.prof --profile-streams 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import ssl
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import _machine  # benchmarks/_machine.py, beside this script
import httpx
import openai

import llmroute
from llmroute.testing import Profile, SimulatorProcess

CLIENTS = ("httpx", "openai", "llmroute")
FRAMINGS = ("event", "coalesced")
TARGETS = {"httpx": 1.3, "openai": 0.7}  # llmroute CPU per chunk must be <= this x the other
MODEL = "sim-small"
MESSAGES = [{"role": "user", "content": "Tell me a long story."}]
API_KEY = "sk-bench"

StreamOnce = Callable[[], Awaitable[int]]


class Bench:
    """The three clients against one simulator; each ``stream_*`` returns chunks received."""

    def __init__(self, base_url: str, new_ctx: Callable[[], ssl.SSLContext]) -> None:
        # One SSLContext per client: httpcore sets the ALPN list on the context it is given at
        # every connect, so a context shared with openai's HTTP/1.1 client would make the others
        # offer only http/1.1 (llmroute then stays on HTTP/1.1 for good).
        self.base_url = base_url
        self.httpx = httpx.AsyncClient(http2=True, verify=new_ctx(), timeout=60)
        self.openai = openai.AsyncOpenAI(
            api_key=API_KEY,
            base_url=base_url,
            http_client=openai.DefaultAsyncHttpxClient(verify=new_ctx()),
        )
        self.llmroute = llmroute.AsyncOpenAI(api_key=API_KEY, base_url=base_url, verify=new_ctx())
        self.http_version: dict[str, str] = {}
        self.body = {"model": MODEL, "messages": MESSAGES, "stream": True}
        self.headers = {"Authorization": f"Bearer {API_KEY}"}

    def runner(self, name: str) -> StreamOnce:
        return {
            "httpx": self.stream_httpx,
            "openai": self.stream_openai,
            "llmroute": self.stream_llmroute,
        }[name]

    async def stream_httpx(self) -> int:
        n = 0
        url = self.base_url + "/chat/completions"
        async with self.httpx.stream("POST", url, json=self.body, headers=self.headers) as r:
            r.raise_for_status()
            self.http_version["httpx"] = r.http_version
            async for line in r.aiter_lines():
                if line.startswith("data:") and not line.startswith("data: [DONE]"):
                    n += 1
        return n

    async def stream_openai(self) -> int:
        n = 0
        stream = await self.openai.chat.completions.create(
            model=MODEL, messages=MESSAGES, stream=True
        )
        async for _chunk in stream:
            n += 1
        self.http_version["openai"] = stream.response.http_version
        return n

    async def stream_llmroute(self) -> int:
        n = 0
        stream = await self.llmroute.chat.completions.create(
            model=MODEL, messages=MESSAGES, stream=True
        )
        async for _chunk in stream:
            n += 1
        self.http_version["llmroute"] = stream.response.http_version
        return n

    async def aclose(self) -> None:
        await self.httpx.aclose()
        await self.openai.close()
        await self.llmroute.close()


async def run_streams(once: StreamOnce, streams: int, concurrency: int) -> int:
    """Run ``streams`` streams, at most ``concurrency`` at once; return the chunks received."""
    if concurrency <= 1:
        total = 0
        for _ in range(streams):
            total += await once()
        return total
    sem = asyncio.Semaphore(concurrency)

    async def one() -> int:
        async with sem:
            return await once()

    return sum(await asyncio.gather(*(one() for _ in range(streams))))


async def measure(once: StreamOnce, streams: int, concurrency: int) -> dict[str, float]:
    gc.collect()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    chunks = await run_streams(once, streams, concurrency)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"cpu": cpu, "wall": wall, "chunks": chunks}


async def run_bench(
    args: argparse.Namespace, sims: dict[str, SimulatorProcess]
) -> dict[str, dict[str, Any]]:
    benches: dict[str, Bench] = {}
    for framing, sim in sims.items():
        new_ctx = sim.ssl_context
        if args.shared_ssl_context:
            shared = sim.ssl_context()
            new_ctx = lambda shared=shared: shared  # noqa: E731
        benches[framing] = Bench(sim.base_url, new_ctx)
    cells = [(framing, name) for framing in sims for name in CLIENTS]
    rounds: dict[str, list[dict[str, dict[str, float]]]] = {f: [] for f in sims}
    try:
        for framing, name in cells:  # warm-up: connections, imports, pydantic/jiter caches
            await run_streams(benches[framing].runner(name), args.warmup, args.concurrency)
        for r in range(args.rounds):
            shift = r % len(cells)
            rows: dict[str, dict[str, dict[str, float]]] = {f: {} for f in sims}
            for framing, name in cells[shift:] + cells[:shift]:
                once = benches[framing].runner(name)
                rows[framing][name] = await measure(once, args.streams, args.concurrency)
            for framing, row in rows.items():
                rounds[framing].append(row)
                if not args.json and not args.quiet:
                    line = "  ".join(
                        f"{n} {1000 * row[n]['cpu'] / max(row[n]['chunks'], 1) * 1000:6.1f}"
                        for n in CLIENTS
                    )
                    print(
                        f"  round {r + 1}/{args.rounds} {framing:<9}: CPU ms/1000 chunks  {line}",
                        flush=True,
                    )
    finally:
        for bench in benches.values():
            await bench.aclose()
    results: dict[str, dict[str, Any]] = {}
    for framing, bench in benches.items():
        result = summarize(rounds[framing])
        for name in CLIENTS:
            result["clients"][name]["http_version"] = bench.http_version.get(name)
        results[framing] = result
    return results


def per_k(m: dict[str, float], key: str) -> float:
    return 1000 * m[key] / m["chunks"] if m["chunks"] else float("nan")


def summarize(rounds: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    clients: dict[str, Any] = {}
    for name in CLIENTS:
        cpu = [per_k(row[name], "cpu") for row in rounds]
        wall = [per_k(row[name], "wall") for row in rounds]
        clients[name] = {
            "cpu_s_per_1000_chunks": statistics.median(cpu),
            "cpu_min": min(cpu),
            "cpu_max": max(cpu),
            "wall_s_per_1000_chunks": statistics.median(wall),
            "cpu_s_per_round": statistics.median(row[name]["cpu"] for row in rounds),
            "wall_s_per_round": statistics.median(row[name]["wall"] for row in rounds),
            "chunks_per_round": statistics.median(row[name]["chunks"] for row in rounds),
        }
    ratios: dict[str, Any] = {}
    for other, target in TARGETS.items():
        each = [per_k(row["llmroute"], "cpu") / per_k(row[other], "cpu") for row in rounds]
        ratio = statistics.median(each)
        ratios[f"llmroute/{other}"] = {
            "median": ratio,
            "min": min(each),
            "max": max(each),
            "target": target,
            "met": ratio <= target,
        }
    return {"clients": clients, "ratios": ratios, "rounds": rounds}


def machine() -> dict[str, Any]:
    return _machine.machine(
        ("llmroute", "httpx", "httpcore", "h2", "openai", "anyio", "hypercorn", "pydantic")
    )


def print_table(result: dict[str, Any], args: argparse.Namespace, framing: str) -> None:
    m = result["machine"]
    print()
    print(
        f"framing {framing!r}: {args.rounds} rounds x {args.streams} streams x {args.tokens} "
        f"tokens of {args.token_bytes or 'word'} bytes, concurrency {args.concurrency}; "
        f"{m['nproc']} CPUs, {m['cpu']}, Python {m['python']}, load {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'client':<10} {'protocol':<9} {'CPU s/1000 chunks':>18} {'(min..max)':>17} "
        f"{'wall s/1000':>12} {'chunks':>7}"
    )
    for name in CLIENTS:
        c = result["clients"][name]
        spread = f"{c['cpu_min']:.4f}..{c['cpu_max']:.4f}"
        print(
            f"{name:<10} {c['http_version'] or '?':<9} {c['cpu_s_per_1000_chunks']:>18.4f} "
            f"{spread:>17} {c['wall_s_per_1000_chunks']:>12.4f} {c['chunks_per_round']:>7.0f}"
        )
    print()
    for key, r in result["ratios"].items():
        verdict = "met" if r["met"] else "MISSED"
        print(
            f"{key:<16} {r['median']:.2f}x  (rounds {r['min']:.2f}..{r['max']:.2f}; "
            f"target <= {r['target']}x: {verdict})"
        )


async def profile_llmroute(args: argparse.Namespace, sim: SimulatorProcess) -> None:
    """cProfile llmroute alone while it streams ``--profile-streams`` replies."""
    import cProfile
    import pstats

    bench = Bench(sim.base_url, sim.ssl_context)
    try:
        await run_streams(bench.stream_llmroute, args.warmup, 1)
        prof = cProfile.Profile()
        gc.collect()
        cpu0 = time.process_time()
        prof.enable()
        chunks = await run_streams(bench.stream_llmroute, args.profile_streams, args.concurrency)
        prof.disable()
        cpu = time.process_time() - cpu0
    finally:
        await bench.aclose()
    prof.dump_stats(args.profile)
    print(f"profiled {chunks} chunks, {cpu:.3f} s CPU (under cProfile); saved {args.profile}")
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7, help="measured rounds (default 7)")
    p.add_argument("--streams", type=int, default=5, help="streams per client per round (5)")
    p.add_argument("--tokens", type=int, default=1000, help="tokens per reply (1000)")
    p.add_argument("--concurrency", type=int, default=1, help="streams at once (1: sequential)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up streams per client (2)")
    p.add_argument(
        "--shared-ssl-context",
        action="store_true",
        help="give all three clients one SSLContext (shows llmroute falling back to HTTP/1.1)",
    )
    p.add_argument(
        "--framing",
        choices=(*FRAMINGS, "both"),
        default="both",
        help="event: one SSE event per DATA frame and TLS record; coalesced: as hypercorn packs "
        "them; both (default): the two side by side, interleaved",
    )
    p.add_argument(
        "--token-bytes", type=int, default=0, help="pad each token to this many bytes (0: words)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON document instead")
    p.add_argument("--quiet", action="store_true", help="no per-round lines")
    p.add_argument("--profile", metavar="FILE", help="instead: cProfile llmroute, save to FILE")
    p.add_argument("--profile-streams", type=int, default=20, help="streams to profile (20)")
    args = p.parse_args(argv)
    if min(args.rounds, args.streams, args.tokens, args.concurrency) < 1:
        p.error("--rounds, --streams, --tokens and --concurrency must be >= 1")

    framings = FRAMINGS if args.framing == "both" else (args.framing,)
    with contextlib.ExitStack() as stack:
        sims = {
            framing: stack.enter_context(
                SimulatorProcess(
                    profile=Profile(
                        reply_tokens=args.tokens,
                        token_bytes=args.token_bytes,
                        frame_per_event=framing == "event",
                    ),
                    tls=True,
                )
            )
            for framing in framings
        }
        if args.profile:
            asyncio.run(profile_llmroute(args, sims[framings[0]]))
            return 0
        if not args.json:
            for framing, sim in sims.items():
                print(f"simulator ({framing}) pid {sim.pid} at {sim.base_url}")
            print(f"client pid {os.getpid()}; load average {os.getloadavg()}")
        results = asyncio.run(run_bench(args, sims))
    config = {
        k: getattr(args, k)
        for k in (
            "rounds",
            "streams",
            "tokens",
            "token_bytes",
            "concurrency",
            "warmup",
            "shared_ssl_context",
        )
    }
    for result in results.values():
        result["machine"] = machine()
        result["config"] = config
        result["load_average"] = os.getloadavg()
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
    else:
        for framing, result in results.items():
            print_table(result, args, framing)
    return 0


if __name__ == "__main__":
    sys.exit(main())
