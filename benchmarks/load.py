r"""Load and soak: one llmroute client under many concurrent streams, and under a long faulty run.

``load``  ``--streams`` (2,000) concurrent streams from one client to ``--servers`` simulator
          processes (TLS, HTTP/2; several: one route, round-robin over them). Each simulator
          holds every stream before its first token until all are open (``--no-hold``: a 1 s
          TTFT instead), then releases them: 30 tokens 10 ms apart. Reported: every answer
          compared with the expected text, failures by type with an example of each, the
          client's memory per open stream (RSS with all open, minus RSS before, over the
          streams open), its CPU per stream opened and per chunk streamed, the simulators' CPU,
          and the connections the client used. ``--then-openai N``: openai-python on N streams
          next, in the same run.
``soak``  ``--requests`` (20,000) routed requests at ``--concurrency`` (64) over two simulator
          processes with faults on (5xx, 429 with Retry-After, drops, malformed events, hangs
          cut by the first-token deadline), streamed and not, a quarter of them popular prompts
          answered by the cache. Reported: RSS after the warm-up (the first 10%) and at the end,
          asyncio tasks, file descriptors and sockets before and after, requests that outlived
          their deadline, outcomes, and the sizes of the live stats and the cache.

    .venv/bin/python benchmarks/load.py load                  # ~1 min
    .venv/bin/python benchmarks/load.py load --streams 10000 --per-connection 2000 \
        --then-openai 1000
    .venv/bin/python benchmarks/load.py load --streams 10000 --per-connection 1250 --servers 4
    .venv/bin/python benchmarks/load.py soak                  # ~2-3 min on 2 cores
    .venv/bin/python benchmarks/load.py soak --requests 2000  # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import json
import os
import random
import ssl
import subprocess
import sys
import time
from typing import Any

import _machine  # benchmarks/_machine.py, beside this script
import anyio
import anyio.lowlevel
import anyio.to_thread
import httpx
import openai

from llmroute import AsyncOpenAI, OpenAIError
from llmroute.testing import Profile, SimulatorProcess
from llmroute.testing import _resources as proc

PROMPTS = [f"Load question number {i}" for i in range(50)]
DEADLINE = 30.0  # no request may take longer than this, whatever its faults
MODEL = "sim-small"
LOAD_TIMEOUT = 900.0  # seconds a load stream may wait, for its headers or its next chunk
OPEN_STALL = 30.0  # seconds without one more stream held: release those that are


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


def _client(kind: str, sims: list[SimulatorProcess], per_connection: int) -> Any:
    """One client for every stream: openai-python (its default HTTP/1.1 client), llmroute on
    the one simulator's base_url, or llmroute with a route over several simulator processes."""
    ctx = ssl.create_default_context(cafile=sims[0].ca_pem_path)
    for sim in sims[1:]:
        ctx.load_verify_locations(cafile=sim.ca_pem_path)  # each process has its own CA
    if kind == "openai":
        return openai.AsyncOpenAI(
            api_key="sk-load",
            base_url=sims[0].base_url,
            max_retries=0,
            timeout=LOAD_TIMEOUT,
            http_client=openai.DefaultAsyncHttpxClient(verify=ctx, timeout=LOAD_TIMEOUT),
        )
    # Streams per HTTP/2 connection at most (the simulator allows as many).
    config: dict[str, Any] = {"connections": {"max_streams": per_connection}}
    if len(sims) > 1:
        names = [f"sim{i}" for i in range(len(sims))]
        config |= {
            "providers": {
                name: {"base_url": sim.base_url, "api_key": "sk-load"}
                for name, sim in zip(names, sims, strict=True)
            },
            "models": {
                MODEL: {
                    "targets": [f"{name}:{MODEL}" for name in names],
                    "policy": "round-robin",
                    # One attempt per stream, whatever the load: a stream that fails counts as
                    # failed, never as answered elsewhere.
                    "first_token_timeout": LOAD_TIMEOUT,
                    "stall_timeout": "off",
                    "continue_on_break": False,
                }
            },
        }
    return AsyncOpenAI(
        api_key="sk-load",
        base_url=sims[0].base_url,
        verify=ctx,
        max_retries=0,
        timeout=LOAD_TIMEOUT,
        config=config,
    )


def _connections(client: Any, ports: list[int]) -> int:
    """The client's connections to the simulators: its HTTP/2 pool's, or (openai) sockets."""
    llmroute = getattr(client, "_llmroute", None)
    if llmroute is not None:
        return len(llmroute.transport.connections())
    return sum(proc.tcp_connections(p) for p in ports)


async def run_load(
    streams: int, per_connection: int, kind: str, servers: int, hold: bool
) -> dict[str, Any]:
    profile = Profile(
        reply_tokens=30,
        ttft_median=0.0 if hold else 1.0,
        inter_token=0.01,
        max_streams=per_connection,
        hold_first_token=hold,
        hang_max=LOAD_TIMEOUT,
    )
    with contextlib.ExitStack() as stack:
        sims = [
            stack.enter_context(SimulatorProcess(profile=profile, tls=True, seed=i))
            for i in range(servers)
        ]
        client = _client(kind, sims, per_connection)
        ports = [_port(sim.base_url) for sim in sims]
        async with client:
            expected = {}
            for prompt in PROMPTS[:10]:  # whole answers: never held
                whole = await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": prompt}]
                )
                expected[prompt] = whole.choices[0].message.content
            gc.collect()
            rss_before = proc.rss_bytes()
            peak = {"rss": rss_before, "in_flight": 0, "connections": 0}
            answers: dict[int, tuple[str, str | None]] = {}
            counts = {"chunks": 0, "failed": 0, "retried": 0}
            causes: collections.Counter[str] = collections.Counter()
            examples: dict[str, str] = {}
            in_flight = 0

            async def one(i: int) -> None:
                nonlocal in_flight
                prompt = PROMPTS[i % 10]
                in_flight += 1
                try:
                    stream = await client.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": prompt}],
                        stream=True,
                    )
                    answers[i] = await _read(stream, counts)
                    route = getattr(stream, "route", None)
                    if route is not None and len(route.attempts) > 1:
                        counts["retried"] += 1
                except Exception as exc:
                    counts["failed"] += 1
                    name = type(exc).__name__
                    causes[name] += 1
                    examples.setdefault(name, f"{exc!r}"[:300])
                finally:
                    in_flight -= 1

            async def watch() -> None:
                while True:
                    rss = proc.rss_bytes()
                    if rss > peak["rss"]:
                        peak["rss"], peak["in_flight"] = rss, in_flight
                    peak["connections"] = max(
                        peak["connections"], sum(proc.tcp_connections(p) for p in ports)
                    )
                    await anyio.sleep(0.05)

            opened: dict[str, Any] = {}

            async def release_when_all_held() -> None:
                # Every stream held by a simulator before its first token (or failed, or no
                # progress for OPEN_STALL s: a client that cannot open them all at once).
                last, since = -1, time.monotonic()
                held = 0
                while True:
                    try:
                        stats = [await anyio.to_thread.run_sync(sim.stats) for sim in sims]
                    except OSError:  # a busy simulator's answer took too long (timeouts too)
                        await anyio.sleep(0.5)  # not asked again at once: it is busy
                        continue
                    held = sum(st["held"] for st in stats)
                    if held != last:
                        last, since = held, time.monotonic()
                    if held + counts["failed"] >= streams or time.monotonic() - since > OPEN_STALL:
                        break
                    await anyio.sleep(0.5)
                gc.collect()
                opened.update(
                    held=held,
                    rss=proc.rss_bytes(),
                    in_flight=in_flight,
                    seconds=time.monotonic() - started,
                    cpu=time.process_time() - cpu0,
                    server_cpu=sum(proc.cpu_seconds(sim.pid or 0) for sim in sims),
                    connections=_connections(client, ports),
                )
                for sim in sims:
                    await anyio.to_thread.run_sync(sim.release)
                # Streams that reach a simulator after the release are let go as they come.
                while len(answers) + counts["failed"] < streams:
                    await anyio.sleep(5)
                    for sim in sims:
                        try:
                            late = await anyio.to_thread.run_sync(sim.release)
                        except OSError:  # busy streaming: next time
                            continue
                        opened["late"] = opened.get("late", 0) + late

            server_cpu0 = sum(proc.cpu_seconds(sim.pid or 0) for sim in sims)
            started, cpu0 = time.monotonic(), time.process_time()
            with anyio.fail_after(3 * LOAD_TIMEOUT):
                async with anyio.create_task_group() as outer:
                    outer.start_soon(watch)
                    async with anyio.create_task_group() as tg:
                        if hold:
                            tg.start_soon(release_when_all_held)
                        for i in range(streams):
                            tg.start_soon(one, i)
                    outer.cancel_scope.cancel()
            elapsed, cpu = time.monotonic() - started, time.process_time() - cpu0
            server_cpu = sum(proc.cpu_seconds(sim.pid or 0) for sim in sims) - server_cpu0
    wrong = sum(1 for i, a in answers.items() if a != (expected[PROMPTS[i % 10]], "stop"))
    chunks = max(1, counts["chunks"])
    result: dict[str, Any] = {
        "client": kind,
        "streams": streams,
        "servers": servers,
        "answered": len(answers),
        "wrong": wrong,
        "failed": counts["failed"],
        "failures_by_type": dict(causes),
        "failure_examples": examples,
        "answered_after_a_retry": counts["retried"],
        "seconds": round(elapsed, 2),
        "cpu_seconds": round(cpu, 2),
        "server_cpu_seconds": round(server_cpu, 2),
        "chunks": counts["chunks"],
        "cpu_us_per_chunk": round(cpu / chunks * 1e6, 1),
        "peak_connections": peak["connections"],
        "pool_limit": 1000 if kind == "openai" else 8 * servers,
        "streams_per_connection": 1 if kind == "openai" else per_connection,
        "rss_before_mb": round(rss_before / 1e6, 1),
        "rss_peak_mb": round(peak["rss"] / 1e6, 1),
        "in_flight_at_peak": peak["in_flight"],
        "kb_per_stream_at_peak": round((peak["rss"] - rss_before) / peak["in_flight"] / 1e3, 1)
        if peak["in_flight"]
        else None,  # the peak came after the streams (an allocator's later growth)
        "load_average": os.getloadavg(),
    }
    if opened:
        streamed = cpu - opened["cpu"]
        result["all_open"] = {
            "held_by_servers": opened["held"],
            "in_flight": opened["in_flight"],
            "connections": opened["connections"],
            "seconds_to_open": round(opened["seconds"], 2),
            "rss_mb": round(opened["rss"] / 1e6, 1),
            # RSS with every stream open, minus RSS before, over the streams open then.
            "kb_per_open_stream": round(
                (opened["rss"] - rss_before) / max(1, opened["in_flight"]) / 1e3, 1
            ),
            "cpu_ms_per_stream_opened": round(opened["cpu"] / streams * 1e3, 2),
            "server_cpu_seconds_opening": round(opened["server_cpu"] - server_cpu0, 2),
            "held_after_the_release": opened.get("late", 0),
        }
        # After the release: reading the answers (and closing the streams).
        result["streaming"] = {
            "seconds": round(elapsed - opened["seconds"], 2),
            "cpu_seconds": round(streamed, 2),
            "cpu_us_per_chunk": round(streamed / chunks * 1e6, 1),
            "server_cpu_seconds": round(server_cpu - (opened["server_cpu"] - server_cpu0), 2),
        }
    return result


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
    load.add_argument(
        "--servers",
        type=int,
        default=1,
        help="simulator processes (more than one: llmroute routes round-robin over them)",
    )
    load.add_argument(
        "--no-hold",
        dest="hold",
        action="store_false",
        help="do not hold first tokens until every stream is open (1 s TTFT instead)",
    )
    load.add_argument(
        "--then-openai",
        type=int,
        metavar="N",
        default=0,
        help="then, in the same run (a fresh process), N streams from openai-python",
    )
    soak = sub.add_parser("soak")
    soak.add_argument("--requests", type=int, default=20_000)
    soak.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    if not proc.available():
        sys.stderr.write("load.py reads /proc (Linux only)\n")
        return 2
    if args.what == "load":
        if args.client == "openai" and args.servers != 1:
            parser.error("--client openai takes one simulator (--servers 1)")
        result = anyio.run(
            run_load, args.streams, args.per_connection, args.client, args.servers, args.hold
        )
        if args.then_openai:
            # A fresh interpreter: memory freed by the first client would hide the second's RSS.
            cmd = [sys.executable, __file__, "load", "--client", "openai"]
            cmd += ["--streams", str(args.then_openai), *([] if args.hold else ["--no-hold"])]
            child = subprocess.run(cmd, capture_output=True, text=True, check=True)
            result = {args.client: result, "openai": json.loads(child.stdout)}
    else:
        result = anyio.run(run_soak, args.requests, args.concurrency)
    result["machine"] = _machine.machine(["httpx", "h2", "anyio", "hypercorn", "openai"])
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
