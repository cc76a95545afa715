"""Load and soak: one llmroute client under many concurrent streams, and under a long faulty run.

``load``  ``--streams`` (2,000) concurrent streams from one client to a simulator process (TLS,
          HTTP/2, 1 s to the first token so they overlap): every answer compared with the
          expected text, the connections the client opened (counted in ``/proc``) against the
          pool limit, and the client's memory per stream in flight (RSS at the peak, minus RSS
          before, over the streams in flight then).
``soak``  ``--requests`` (20,000) routed requests at ``--concurrency`` (64) over two simulator
          processes with faults on (5xx, 429 with Retry-After, drops, malformed events, hangs
          cut by the first-token deadline), streamed and not, a quarter of them popular prompts
          answered by the cache. Reported: RSS after the warm-up (the first 10%) and at the end,
          asyncio tasks, file descriptors and sockets before and after, requests that outlived
          their deadline, outcomes, and the sizes of the live stats and the cache.

    .venv/bin/python benchmarks/load.py load                  # ~20 s
    .venv/bin/python benchmarks/load.py load --streams 10000 --per-connection 1250
    .venv/bin/python benchmarks/load.py load --streams 1000 --client openai
    .venv/bin/python benchmarks/load.py soak                  # ~2-3 min on 2 cores
    .venv/bin/python benchmarks/load.py soak --requests 2000  # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import os
import random
import ssl
import sys
import time
from typing import Any

import _machine  # benchmarks/_machine.py, beside this script
import anyio
import anyio.lowlevel
import httpx
import openai

from llmroute import AsyncOpenAI, OpenAIError
from llmroute.testing import Profile, SimulatorProcess
from llmroute.testing import _resources as proc

PROMPTS = [f"Load question number {i}" for i in range(50)]
DEADLINE = 30.0  # no request may take longer than this, whatever its faults


def _port(base_url: str) -> int:
    return int(base_url.rsplit(":", 1)[1].split("/")[0])


async def _read(stream: Any, counts: dict[str, int] | None = None) -> tuple[str, str | None]:
    parts: list[str] = []
    finish: str | None = None
    async with stream:
        async for chunk in stream:
            if counts is not None:
                counts["chunks"] += 1
            for choice in chunk.choices:
                parts.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
    return "".join(parts), finish


async def run_load(streams: int, per_connection: int, kind: str) -> dict[str, Any]:
    profile = Profile(
        reply_tokens=30, ttft_median=1.0, inter_token=0.01, max_streams=per_connection
    )
    with SimulatorProcess(profile=profile, tls=True) as sim:
        ctx = ssl.create_default_context(cafile=sim.ca_pem_path)
        if kind == "openai":
            client: Any = openai.AsyncOpenAI(
                api_key="sk-load",
                base_url=sim.base_url,
                max_retries=0,
                timeout=300,
                http_client=openai.DefaultAsyncHttpxClient(verify=ctx, timeout=300),
            )
        else:
            client = AsyncOpenAI(
                api_key="sk-load", base_url=sim.base_url, verify=ctx, max_retries=0
            )
            # Streams per HTTP/2 connection at most (the simulator allows as many).
            client._llmroute.transport.max_streams_per_connection = per_connection
        async with client:
            expected = {}
            for prompt in PROMPTS[:10]:
                whole = await client.chat.completions.create(
                    model="sim-small", messages=[{"role": "user", "content": prompt}]
                )
                expected[prompt] = whole.choices[0].message.content
            gc.collect()
            rss_before = proc.rss_bytes()
            peak = {"rss": rss_before, "in_flight": 0, "connections": 0}
            answers: dict[int, tuple[str, str | None]] = {}
            counts = {"chunks": 0, "failed": 0}
            causes: collections.Counter[str] = collections.Counter()
            in_flight = 0

            async def one(i: int) -> None:
                nonlocal in_flight
                prompt = PROMPTS[i % 10]
                in_flight += 1
                try:
                    stream = await client.chat.completions.create(
                        model="sim-small",
                        messages=[{"role": "user", "content": prompt}],
                        stream=True,
                    )
                    answers[i] = await _read(stream, counts)
                except Exception as exc:
                    counts["failed"] += 1
                    causes[type(exc).__name__] += 1
                finally:
                    in_flight -= 1

            async def watch() -> None:
                while True:
                    rss = proc.rss_bytes()
                    if rss > peak["rss"]:
                        peak["rss"], peak["in_flight"] = rss, in_flight
                    peak["connections"] = max(
                        peak["connections"], proc.tcp_connections(_port(sim.base_url))
                    )
                    await anyio.sleep(0.05)

            started, cpu0 = time.monotonic(), time.process_time()
            with anyio.fail_after(1800):
                async with anyio.create_task_group() as outer:
                    outer.start_soon(watch)
                    async with anyio.create_task_group() as tg:
                        for i in range(streams):
                            tg.start_soon(one, i)
                    outer.cancel_scope.cancel()
            elapsed, cpu = time.monotonic() - started, time.process_time() - cpu0
    wrong = sum(1 for i, a in answers.items() if a != (expected[PROMPTS[i % 10]], "stop"))
    per_stream = (peak["rss"] - rss_before) / max(1, peak["in_flight"])
    return {
        "client": kind,
        "streams": streams,
        "answered": len(answers),
        "wrong": wrong,
        "failed": counts["failed"],
        "failures_by_type": dict(causes),
        "seconds": round(elapsed, 2),
        "cpu_seconds": round(cpu, 2),
        "chunks": counts["chunks"],
        "cpu_us_per_chunk": round(cpu / max(1, counts["chunks"]) * 1e6, 1),
        "peak_connections": peak["connections"],
        "pool_limit": 8 if kind == "llmroute" else 1000,
        "streams_per_connection": per_connection if kind == "llmroute" else 1,
        "rss_before_mb": round(rss_before / 1e6, 1),
        "rss_peak_mb": round(peak["rss"] / 1e6, 1),
        "in_flight_at_peak": peak["in_flight"],
        "kb_per_stream": round(per_stream / 1e3, 1),
        "load_average": os.getloadavg(),
    }


def _faulty(seed: int) -> Profile:
    return Profile(
        reply_tokens=24,
        ttft_median=0.02,
        ttft_sigma=0.5,
        inter_token=0.001,
        rate_500=0.01,
        rate_503=0.005,
        rate_429=0.005,
        retry_after=0.2,
        rate_drop=0.01,
        rate_malformed=0.005,
        rate_hang=0.002,
        fault_after=5,
        hang_max=60.0,
        seed=seed,
    )


def _tasks() -> int:
    return len(asyncio.all_tasks())


async def run_soak(requests: int, concurrency: int) -> dict[str, Any]:
    with (
        SimulatorProcess(profile=_faulty(1), tls=True) as a,
        SimulatorProcess(profile=_faulty(2), tls=True) as b,
    ):
        ctx = ssl.create_default_context(cafile=a.ca_pem_path)
        ctx.load_verify_locations(cafile=b.ca_pem_path)  # each simulator process has its own CA
        config = {
            "providers": {
                "a": {"base_url": a.base_url, "api_key": "sk-soak", "continuation": {}},
                "b": {"base_url": b.base_url, "api_key": "sk-soak", "continuation": {}},
            },
            "models": {
                "chat": {
                    "targets": ["a:sim-small", "b:sim-small"],
                    "policy": "hedge",
                    "first_token_timeout": "1s",
                }
            },
            "cache": {"backend": "memory", "min_hits": 2, "max_bytes": "8MiB"},
        }
        gc.collect()
        base = {"tasks": _tasks(), "fds": proc.open_fds()}
        outcomes: collections.Counter[str] = collections.Counter()
        causes: list[str] = []
        late = 0
        rng = random.Random(7)
        timeout = httpx.Timeout(DEADLINE, connect=5.0, read=2.0)
        async with AsyncOpenAI(config=config, verify=ctx, timeout=timeout, max_retries=1) as c:
            limiter = anyio.CapacityLimiter(concurrency)
            samples: list[tuple[int, int]] = []

            async def one(i: int) -> None:
                nonlocal late
                popular = rng.random() < 0.25
                prompt = PROMPTS[rng.randrange(10)] if popular else f"unique {i} {rng.random()}"
                stream = rng.random() < 0.8
                started = time.monotonic()
                async with limiter:
                    try:
                        with anyio.fail_after(DEADLINE + 5):
                            kwargs: dict[str, Any] = {"temperature": 0} if popular else {}
                            result = await c.chat.completions.create(
                                model="chat",
                                messages=[{"role": "user", "content": prompt}],
                                stream=stream,
                                **kwargs,
                            )
                            if stream:
                                _, finish = await _read(result)
                                outcomes["ok" if finish else "incomplete"] += 1
                            else:
                                outcomes["ok"] += 1
                    except TimeoutError:
                        outcomes["stuck"] += 1
                    except OpenAIError as exc:
                        outcomes[type(exc).__name__] += 1
                        if len(causes) < 5:
                            causes.append(str(exc)[:300])
                if time.monotonic() - started > DEADLINE:
                    late += 1

            started = time.monotonic()
            warm = max(1, requests // 10)
            rss_warm = 0
            async with anyio.create_task_group() as tg:
                for i in range(requests):
                    if i == warm:
                        await anyio.lowlevel.checkpoint()
                        gc.collect()
                        rss_warm = proc.rss_bytes()
                    if i % max(1, requests // 20) == 0:
                        samples.append((i, proc.rss_bytes()))
                    await limiter.acquire_on_behalf_of(i)  # no more tasks than the limit
                    limiter.release_on_behalf_of(i)
                    tg.start_soon(one, i)
            elapsed = time.monotonic() - started
            gc.collect()
            rss_end = proc.rss_bytes()
            stats = c._router.stats
            windows = {  # samples kept per target: TTFT, inter-token, whole-answer latency
                name: len(t._ttft) + len(t._itl) + len(t._latency)
                for name, t in stats._targets.items()
            }
            cache_stats = await c._cache.store.stats() if c._cache is not None else None
            targets = {
                name: {"outcomes": snap.outcomes, "breaker": snap.breaker}
                for name, snap in c.stats().items()
            }
            during = {"tasks": _tasks(), "fds": proc.open_fds()}
        await anyio.sleep(0.5)
        gc.collect()
        after = {
            "tasks": _tasks(),
            "fds": proc.open_fds(),
            "sockets_a": proc.tcp_connections(_port(a.base_url)),
            "sockets_b": proc.tcp_connections(_port(b.base_url)),
        }
        in_flight = {"a": a.stats()["in_flight"], "b": b.stats()["in_flight"]}
    total = sum(outcomes.values())
    return {
        "requests": requests,
        "finished": total,
        "seconds": round(elapsed, 1),
        "outcomes": dict(outcomes),
        "first_errors": causes,
        "late": late,
        "rss_after_warmup_mb": round(rss_warm / 1e6, 1),
        "rss_end_mb": round(rss_end / 1e6, 1),
        "rss_growth": round(rss_end / rss_warm - 1, 4) if rss_warm else None,
        "rss_samples_mb": " ".join(f"{i}:{r / 1e6:.1f}" for i, r in samples),
        "baseline": base,
        "before_close": during,
        "after_close": after,
        "simulator_in_flight_after": in_flight,
        "stats_windows": windows,
        "targets": targets,
        "cache_entries": cache_stats.entries if cache_stats is not None else None,
        "cache_bytes": cache_stats.bytes if cache_stats is not None else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    load = sub.add_parser("load")
    load.add_argument("--streams", type=int, default=2000)
    load.add_argument(
        "--per-connection",
        type=int,
        default=256,
        help="HTTP/2 streams per connection, client and simulator (256; 8 connections at most)",
    )
    load.add_argument("--client", choices=("llmroute", "openai"), default="llmroute")
    soak = sub.add_parser("soak")
    soak.add_argument("--requests", type=int, default=20_000)
    soak.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    if not proc.available():
        sys.stderr.write("load.py reads /proc (Linux only)\n")
        return 2
    if args.what == "load":
        result = anyio.run(run_load, args.streams, args.per_connection, args.client)
    else:
        result = anyio.run(run_soak, args.requests, args.concurrency)
    result["machine"] = _machine.machine(["httpx", "h2", "anyio", "hypercorn", "openai"])
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
