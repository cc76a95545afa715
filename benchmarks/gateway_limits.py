"""What per-key limits (and a team's, and a model's) cost per request, in memory and in Redis,
beside the gateway's cost without them, in one run.

One zero-latency simulator in its own process (``SimulatorProcess``, TLS + HTTP/2, one SSE event
per DATA frame as vendors that flush each token send them, ``--tokens`` per reply), one
redis-server started here on a free loopback port (``tests/redis_server.py``'s helpers: the
server answering must name its own pid), and six ``llmroute serve`` processes
(benchmarks/gateway.py's ``gateway_process``: HTTPS, HTTP/2), the same route ``chat`` -> the
simulator, the same key, differing only in their limits:

``a``  today's gateway: ``max_concurrency_per_key`` counted in memory, no per-key limits
``b``  memory limits: ``[gateway.limits]`` rpm, tpm and a daily token budget, all far above
       what the run uses (nothing is refused), counted in memory
``c``  Redis, no limits: ``limits_backend = "redis"``, so the concurrency slot is a Redis
       script (acquire) and a ``ZREM`` (release) per request: today's shared cost
``d``  Redis limits: ``c`` plus ``b``'s limits, counted in Redis (the slot and the limits in
       one admission script, and one script when the request ends)
``e``  ``d`` plus a team (``[gateway.teams]``, the same limits) and a per-model limit on
       ``chat``: four scopes counted per request, in the same two scripts
``a2`` ``a`` again in another process: how far two identical gateways differ (each process's
       routing state, its place in memory), the floor under every difference above

This process is the client (``llmroute.AsyncOpenAI``, HTTP/2 over TLS to each gateway), sending
the same streamed chat request (``max_tokens`` 64) to each; at each concurrency (``--levels``)
the cases alternate in batches, in rotated order each round, so drift on a shared machine hits
all alike. Per case:

- the gateway process's CPU (user + system from ``/proc``, its threads included: the Redis
  calls run in anyio's worker threads) over its own batches, per request, and what it adds
  over ``a``'s; its ratio to ``a``'s in each round (the median and the range over rounds);
- the redis-server's CPU per request;
- the Redis round trips of a request, in all and before its first token: 20 streams one after
  another under ``MONITOR`` before the measured rounds (a command a script runs is not a round
  trip, nor is a replica's poll of its key store's change counter, four a second whatever the
  traffic);
- TTFT (``create()`` to the first chunk with content; every stream is read to its end),
  nearest-rank p50 and p95, and what each adds over ``a``.

Each case is checked once before measuring: ``b`` and ``d`` answer with OpenAI's
``x-ratelimit-*`` headers, ``a`` and ``c`` without.

Then ``admit()`` + ``settle()`` alone, in this process (a micro-benchmark, the variants
interleaved the same way): ``LocalLimits`` and ``RedisLimits`` (against the same redis-server),
beside ``RedisSlots``' acquire + release (case ``c``'s two calls) and one Redis ``PING``: through
``anyio.to_thread`` as the gateway makes its Redis calls, on redis-py's asyncio client, and
inline, blocking the event loop (the round trip's floor).
Wall time and this process's CPU per pair of calls, and the redis-server's CPU.

    PYTHONPATH=. .venv/bin/python benchmarks/gateway_limits.py           # 3-5 minutes
    PYTHONPATH=. .venv/bin/python benchmarks/gateway_limits.py --quick   # smoke run
    PYTHONPATH=. .venv/bin/python benchmarks/gateway_limits.py --json /tmp/limits.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import machine
from gateway import GATEWAY_KEY, ROOT, cpu_seconds, gateway_process, pct

sys.path.insert(0, str(ROOT))
import anyio.to_thread

from llmroute import AsyncOpenAI
from llmroute.config import KeySettings
from llmroute.server._limits import Counts, Grant, LocalLimits, RedisLimits
from llmroute.server._limits._verdicts import scope_headers
from llmroute.server._slots import RedisSlots
from llmroute.server._tenants import Tenant
from llmroute.testing import Profile, SimulatorProcess
from tests.redis_server import _free_port, _start, _stop, _wait_ready

MESSAGES: Any = [{"role": "user", "content": "How much does a key's limit cost?"}]
MAX_TOKENS = 64
# Far above anything a run uses: nothing is refused, every limit is still counted.
RPM, TPM, BUDGET = 1_000_000_000, 1_000_000_000_000, 1_000_000_000_000_000
LIMITS = (
    f"\n[gateway.limits]\nrpm = {RPM}\ntpm = {TPM}\nbudget_tokens = {BUDGET}\n"
    'budget_period = "day"\n'
)
TEAM = (
    f"\n[gateway.teams.bench]\nrpm = {RPM}\ntpm = {TPM}\nbudget_tokens = {BUDGET}\n"
    'budget_period = "day"\n'
)
SCOPES = f'team = "bench"\nmodel_limits = {{ chat = {{ rpm = {RPM}, tpm = {TPM} }} }}\n'
CASES = ("a", "a2", "b", "c", "d", "e")
LIMITED, REDIS = {"b", "d", "e"}, {"c", "d", "e"}
TITLES = {
    "a": "a: memory, no limits (today)",
    "a2": "a2: a again, another process (noise floor)",
    "b": "b: memory limits",
    "c": "c: Redis slots, no limits",
    "d": "d: Redis limits",
    "e": "e: d + team + model limits",
}


def gateway_lines(case: str, redis_url: str) -> str:
    """The lines ``case`` adds to the gateway's ``[gateway]`` table (and the tables after it)."""
    # A connection idle while the other cases run is kept (5 s by default): a request racing
    # the idle close would fail here (the client does not retry, so every request is counted).
    idle = "idle_timeout = 600\n"
    redis = 'limits_backend = "redis"\n' if case in REDIS else ""
    limits = LIMITS if case in LIMITED else ""
    if case == "e":
        limits += SCOPES + TEAM
    table = f'\n[redis]\nurl = "{redis_url}"\nprefix = "bench-{case}"\n' if case in REDIS else ""
    return idle + redis + limits + table


@contextmanager
def redis_process(folder: str) -> Iterator[str]:
    """A private redis-server on a free loopback port (no persistence); yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    workdir = Path(tempfile.mkdtemp(dir=folder, prefix="redis-"))
    for _ in range(5):  # the port taken by another process before redis-server bound it: again
        port = _free_port()
        proc = _start(binary, port, workdir)
        try:
            ready = _wait_ready(port, proc, time.monotonic() + 30)
        except BaseException:
            _stop(proc)
            raise
        if ready:
            break
        _stop(proc)
    else:
        raise RuntimeError("redis-server could not bind a free loopback port in 5 tries")
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        _stop(proc)


def redis_usage(client: Any) -> tuple[float, int]:
    """The redis-server's CPU seconds so far (its own ``INFO cpu``, in microseconds) and the
    commands it has run (``INFO stats``; a script's own commands included)."""
    cpu = client.info("cpu")
    calls = int(client.info("stats")["total_commands_processed"])
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), calls


_STOP = "llmroute-bench-monitor-stop"
_OWN = {"ECHO", "INFO", "MONITOR", "PING"}  # this process's own commands
_SETUP = {"CLIENT", "HELLO", "AUTH", "SELECT"}  # a new connection's, not a request's


@contextmanager
def monitored(redis_url: str) -> Iterator[list[dict[str, Any]]]:
    """Every command the redis-server runs meanwhile, as ``MONITOR`` shows it: its time, its
    client (``lua`` for a script's own commands) and its words."""
    import threading

    import redis

    seen: list[dict[str, Any]] = []
    ready = threading.Event()
    listener = redis.Redis.from_url(redis_url)

    def listen() -> None:
        with listener.monitor() as monitor:
            ready.set()
            for item in monitor.listen():
                if _STOP in item["command"]:
                    return
                seen.append(item)

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    if not ready.wait(30):
        raise RuntimeError("MONITOR did not start")
    try:
        yield seen
    finally:
        stopper = redis.Redis.from_url(redis_url)
        stopper.echo(_STOP)
        stopper.close()
        thread.join(30)
        listener.close()


def _a_round_trip(item: dict[str, Any]) -> bool:
    """A command a client sent (not a script's own, not this process's, not a replica's poll
    of its key store's change counter, which is not a request's)."""
    words = item["command"].split()
    name = words[0].upper() if words else ""
    if item.get("client_type") == "lua" or name in _OWN or name in _SETUP:
        return False
    return not (name == "GET" and len(words) > 1 and words[1].endswith("gateway-keys-version"))


async def _quiet(seen: list[dict[str, Any]], pause: float = 0.05, calm: int = 6) -> None:
    """Wait until no round trip came for ``calm`` pauses in a row (bounded: 200 pauses)."""
    count, still = -1, 0
    for _ in range(200):
        now = sum(1 for item in seen if _a_round_trip(item))
        still = still + 1 if now == count else 0
        if still >= calm:
            return
        count = now
        await asyncio.sleep(pause)


def _at_the_end(item: dict[str, Any]) -> bool:
    """A round trip made when a request ends (its settle script, its slot's ZREM), not before
    its first token."""
    import hashlib

    from llmroute.server._limits import _redis as limits_redis

    words = item["command"].split()
    settle = hashlib.sha1(limits_redis._SETTLE.encode()).hexdigest()  # pyright: ignore[reportPrivateUsage]
    return words[0].upper() == "ZREM" or (words[0].upper() == "EVALSHA" and words[1] == settle)


async def round_trips(client: AsyncOpenAI, redis_url: str, requests: int) -> dict[str, float]:
    """Redis round trips per request, in all and before its first token (those not made when
    it ends), over ``requests`` streams under ``MONITOR`` (a probe apart from the measured
    rounds: MONITOR slows the server)."""
    with monitored(redis_url) as seen:
        await batch(client, requests, 1)
        await _quiet(seen)  # the last request's end
    sent = [item for item in seen if _a_round_trip(item)]
    before = [item for item in sent if not _at_the_end(item)]
    return {"per_request": len(sent) / requests, "before_first_token": len(before) / requests}


async def ttft(client: AsyncOpenAI) -> float:
    """Seconds from create() to the first chunk with content; the stream is read to its end."""
    started = time.perf_counter()
    stream = await client.chat.completions.create(
        model="chat", messages=MESSAGES, stream=True, max_tokens=MAX_TOKENS
    )
    first = math.nan
    async with stream:
        async for chunk in stream:
            if math.isnan(first) and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - started
    return first


async def batch(client: AsyncOpenAI, requests: int, concurrency: int) -> list[float]:
    """``requests`` streams, ``concurrency`` at a time (each worker one after another)."""
    out: list[float] = []

    async def worker(count: int) -> None:
        for _ in range(count):
            out.append(await ttft(client))

    share, extra = divmod(requests, concurrency)
    await asyncio.gather(*(worker(share + (i < extra)) for i in range(concurrency)))
    return out


async def check_headers(client: AsyncOpenAI, case: str) -> list[tuple[str, str]]:
    """``b`` and ``d`` answer with the limits' headers, ``a`` and ``c`` without: the limits
    measured are the limits configured. Returns the answer's headers."""
    raw = await client.chat.completions.with_raw_response.create(
        model="chat", messages=MESSAGES, stream=True, max_tokens=MAX_TOKENS
    )
    async for _ in raw.parse():
        pass
    limited = "x-ratelimit-limit-requests" in raw.headers
    if limited != (case in LIMITED):
        raise RuntimeError(f"case {case}: x-ratelimit-* headers {'' if limited else 'not '}sent")
    return [(k.decode(), v.decode()) for k, v in raw.headers.raw]


async def measure_gateways(
    gateways: dict[str, tuple[str, ssl.SSLContext, int]],
    redis_url: str,
    levels: list[tuple[int, int]],
    rounds: int,
) -> dict[str, Any]:
    """Each case's TTFTs, gateway CPU, redis-server CPU and commands, per level
    (concurrency, requests per batch)."""
    import redis

    probe = redis.Redis.from_url(redis_url)
    clients = {
        case: AsyncOpenAI(api_key=GATEWAY_KEY, base_url=url, verify=ctx, max_retries=0)
        for case, (url, ctx, _) in gateways.items()
    }
    results: dict[str, Any] = {"headers": {}, "levels": {}, "round_trips": {}}
    try:
        for case, client in clients.items():
            results["headers"][case] = await check_headers(client, case)
            await batch(client, 48, 8)  # warm connections, pools and scripts
        for case, client in clients.items():
            results["round_trips"][case] = await round_trips(client, redis_url, 20)
        for concurrency, per_batch in levels:
            samples: dict[str, list[float]] = {case: [] for case in clients}
            cpu: dict[str, list[float]] = {case: [] for case in clients}  # per round
            redis_cpu = dict.fromkeys(clients, 0.0)
            commands = dict.fromkeys(clients, 0)
            for round_ in range(rounds):
                names = list(clients)
                order = names[round_ % len(names) :] + names[: round_ % len(names)]
                for case in order:
                    pid = gateways[case][2]
                    redis_before, calls_before = redis_usage(probe)
                    before = cpu_seconds(pid)
                    samples[case] += await batch(clients[case], per_batch, concurrency)
                    cpu[case].append(cpu_seconds(pid) - before)
                    redis_after, calls_after = redis_usage(probe)
                    redis_cpu[case] += redis_after - redis_before
                    commands[case] += calls_after - calls_before
            n = rounds * per_batch
            row: dict[str, Any] = {"concurrency": concurrency, "requests": n, "cases": {}}
            for case in clients:
                row["cases"][case] = {
                    "cpu_per_request": sum(cpu[case]) / n,
                    "cpu_per_round": [c / per_batch for c in cpu[case]],
                    "redis_cpu_per_request": redis_cpu[case] / n,
                    "redis_commands_per_request": commands[case] / n,
                    "ttft_p50": pct(samples[case], 0.5),
                    "ttft_p95": pct(samples[case], 0.95),
                }
            results["levels"][str(concurrency)] = row
    finally:
        for client in clients.values():
            await client.close()
        probe.close()
    return results


# -- admit() + settle() alone ------------------------------------------------------------------


def tenant() -> Tenant:
    settings = KeySettings(rpm=RPM, tpm=TPM, budget_tokens=BUDGET, budget_period="day")
    return Tenant("bench", settings, 1000)


ESTIMATE, USED = 80, 31  # a short prompt plus max_tokens 64; what such an answer uses


async def micro(
    redis_url: str, pairs: int, rounds: int, *, warm: int = 200, prefix: str = "bench-micro"
) -> dict[str, Any]:
    """Per pair of calls (``admit`` + ``settle``, ``acquire`` + ``release``, or two PINGs): wall
    and CPU microseconds in this process, the redis-server's CPU, over ``rounds`` interleaved
    rounds; ``LocalLimits`` gets 20 times as many pairs (it makes no round trip)."""
    t = tenant()
    local = LocalLimits()
    shared = RedisLimits(redis_url, prefix=prefix, timeout=1.0)
    slots = RedisSlots(redis_url, prefix=prefix, timeout=1.0, lease=60.0)
    import redis

    ping = redis.Redis.from_url(redis_url)
    from redis.asyncio import Redis as AsyncRedis

    ping_async = AsyncRedis.from_url(redis_url)

    async def local_pair() -> None:
        grant = await local.admit(t, ESTIMATE)
        assert isinstance(grant, Grant)
        await local.settle(grant, USED)

    async def redis_pair() -> None:
        grant = await shared.admit(t, ESTIMATE)
        assert isinstance(grant, Grant) and not grant.local, grant
        await shared.settle(grant, USED)

    async def slots_pair() -> None:
        token = await slots.acquire("bench", 1000)
        assert token is not None and not token.startswith("local:"), token
        await slots.release("bench", token)

    async def ping_thread() -> None:
        await anyio.to_thread.run_sync(ping.ping)
        await anyio.to_thread.run_sync(ping.ping)

    async def ping_inline() -> None:
        ping.ping()
        ping.ping()

    async def ping_asyncio() -> None:
        await ping_async.ping()
        await ping_async.ping()

    variants: dict[str, tuple[Callable[[], Awaitable[None]], int, int]] = {
        "LocalLimits admit + settle": (local_pair, pairs * 20, 0),
        "RedisLimits admit + settle": (redis_pair, pairs, 2),
        "RedisSlots acquire + release (case c's calls)": (slots_pair, pairs, 2),
        "2 x PING through anyio.to_thread": (ping_thread, pairs, 2),
        "2 x PING, redis.asyncio (no thread)": (ping_asyncio, pairs, 2),
        "2 x PING inline, blocking (the floor)": (ping_inline, pairs, 2),
    }
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    server: dict[str, float] = dict.fromkeys(variants, 0.0)
    try:
        for call, _, _ in variants.values():
            for _ in range(warm):
                await call()
        names = list(variants)
        for round_ in range(rounds):
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                call, count, _ = variants[name]
                redis_before = redis_usage(ping)[0]
                started, cpu_started = time.perf_counter(), time.process_time()
                for _ in range(count):
                    await call()
                wall[name].append((time.perf_counter() - started) / count)
                cpu[name].append((time.process_time() - cpu_started) / count)
                server[name] += redis_usage(ping)[0] - redis_before
    finally:
        await shared.aclose()
        await slots.aclose()
        ping.close()
        await ping_async.aclose()
    return {
        name: {
            "round_trips": trips,
            "pairs": count * rounds,
            "wall_per_pair": statistics.median(wall[name]),
            "wall_per_round": wall[name],
            "cpu_per_round": cpu[name],
            "cpu_per_pair": statistics.median(cpu[name]),
            "redis_cpu_per_pair": server[name] / (count * rounds),
        }
        for name, (_, count, trips) in variants.items()
    }


def hpack_cost(headers: list[tuple[str, str]], responses: int, rounds: int) -> dict[str, float]:
    """CPU per response of HPACK-encoding case ``a``'s answer headers, with and without the
    limits' ``x-ratelimit-*`` headers (built by ``scope_headers`` from counts that grow as in a
    run, so their values change per answer as they do), on one long-lived encoder each as on
    one HTTP/2 connection: what h2 does for the answer's HEADERS frame (huffman on)."""
    from hpack import Encoder

    settings = tenant().settings
    base = [(":status", "200"), *((k, v) for k, v in headers if not k.startswith("x-ratelimit"))]
    start = time.time()
    bucket = int(start // 10)

    def with_limits(i: int) -> list[tuple[str, str]]:
        counts = Counts(i + 1, bucket, ESTIMATE * (i + 1), bucket, ESTIMATE * (i + 1))
        now = start + i * 0.0071
        own = scope_headers(settings, counts, now, start + 86400)
        return base + list(own.items())

    lists = {"a": [base] * responses, "b": [with_limits(i) for i in range(responses)]}
    cpu: dict[str, list[float]] = {"a": [], "b": []}
    for round_ in range(rounds):
        for case in ("a", "b") if round_ % 2 == 0 else ("b", "a"):
            encoder = Encoder()
            started = time.process_time()
            for one in lists[case]:
                encoder.encode(one)
            cpu[case].append((time.process_time() - started) / responses)
    return {
        "headers_a": len(base),
        "headers_b": len(lists["b"][0]),
        "cpu_a": statistics.median(cpu["a"]),
        "cpu_b": statistics.median(cpu["b"]),
    }


# -- the report ---------------------------------------------------------------------------------


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} µs"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def report(result: dict[str, Any]) -> str:
    lines = [
        "| conc. | case | requests | gateway CPU / request | added CPU | vs a: median of rounds "
        "(range) | redis CPU / request | Redis round trips / request (before the first token) "
        "| TTFT p50 | added p50 | TTFT p95 | added p95 |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in result["gateway"]["levels"].values():
        cases = row["cases"]
        base = cases["a"]
        for case, c in cases.items():
            ratios = [x / a for x, a in zip(c["cpu_per_round"], base["cpu_per_round"], strict=True)]
            added = c["cpu_per_request"] - base["cpu_per_request"]
            cells = [str(row["concurrency"]), TITLES[case], str(row["requests"])]
            cells += [ms(c["cpu_per_request"]), f"{added * 1e6:+.0f} µs"]
            median = statistics.median(ratios)
            cells += [f"{median:.3f}x ({min(ratios):.2f}..{max(ratios):.2f})"]
            trips = result["gateway"].get("round_trips", {}).get(case)
            shown = (
                f"{trips['per_request']:.2f} ({trips['before_first_token']:.2f})" if trips else "-"
            )
            cells += [us(c["redis_cpu_per_request"]), shown]
            cells += [ms(c["ttft_p50"]), f"{(c['ttft_p50'] - base['ttft_p50']) * 1e3:+.2f} ms"]
            cells += [ms(c["ttft_p95"]), f"{(c['ttft_p95'] - base['ttft_p95']) * 1e3:+.2f} ms"]
            lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| calls (one pair) | Redis round trips | pairs | wall / pair | pairs / s "
        "| CPU / pair (caller) | redis-server CPU / pair |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, m in result["micro"].items():
        cells = [name, str(m["round_trips"]), str(m["pairs"]), f"{m['wall_per_pair'] * 1e6:.1f} µs"]
        cells += [f"{1 / m['wall_per_pair']:,.0f}", f"{m['cpu_per_pair'] * 1e6:.1f} µs"]
        cells += [f"{m['redis_cpu_per_pair'] * 1e6:.1f} µs"]
        lines.append("| " + " | ".join(cells) + " |")
    h = result["hpack"]
    added = (h["cpu_b"] - h["cpu_a"]) * 1e6
    lines += [
        "",
        "| answer headers, HPACK-encoded | headers | CPU / answer |",
        "| --- | ---: | ---: |",
        f"| case a's | {h['headers_a']} | {h['cpu_a'] * 1e6:.1f} µs |",
        f"| with the limits' x-ratelimit-* | {h['headers_b']} | {h['cpu_b'] * 1e6:.1f} µs |",
        f"| added | {h['headers_b'] - h['headers_a']} | {added:+.1f} µs |",
    ]
    return "\n".join(lines)


def footer(result: dict[str, Any]) -> str:
    info, args, load = result["machine"], result["args"], result["load"]
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items() if v)
    return (
        f"\nllmroute {result.get('commit', '?')}; nproc={info['nproc']} cpu={info['cpu']} "
        f"python={info['python']}; {versions}, redis-server {info['redis-server']}; load "
        f"average (1 min) {load[0]:.1f} before, {load[1]:.1f} after; rounds={args['rounds']} "
        f"levels={args['levels']} tokens={args['tokens']} (one SSE event per DATA frame); "
        f"{result['seconds']:.0f} s"
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    levels = [(int(c), int(n)) for c, n in (lv.split(":") for lv in args.levels.split(","))]
    asked = {c.strip() for c in args.cases.split(",") if c.strip()}
    unknown = asked - set(CASES)
    if unknown:
        raise SystemExit(
            f"--cases: unknown {', '.join(sorted(unknown))} (known: {', '.join(CASES)})"
        )
    cases = [case for case in CASES if case in asked | {"a"}]
    load_before = os.getloadavg()
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory() as folder,
        redis_process(folder) as redis_url,
        SimulatorProcess(Profile(reply_tokens=args.tokens, frame_per_event=True), tls=True) as sim,
        ExitStack() as stack,
    ):
        gateways = {
            case: stack.enter_context(
                gateway_process(sim, folder, gateway=gateway_lines(case, redis_url))
            )
            for case in cases
        }
        measured = asyncio.run(measure_gateways(gateways, redis_url, levels, args.rounds))
        alone = asyncio.run(micro(redis_url, args.pairs, args.micro_rounds))
        encoded = hpack_cost(measured["headers"]["a"], args.pairs * 2, args.micro_rounds)
        version = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, check=False
        ).stdout.split()
    info = machine(["openai", "h2", "hypercorn", "anyio", "redis"])
    info["redis-server"] = next((w[2:] for w in version if w.startswith("v=")), "?")
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "commit": commit or "?",
        "gateway": measured,
        "micro": alone,
        "hpack": encoded,
        "machine": info,
        "load": [load_before[0], os.getloadavg()[0]],
        "seconds": time.monotonic() - started,
        "args": vars(args),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="rounds of the cases")
    parser.add_argument(
        "--levels",
        default="1:60,16:128",
        help="concurrency:requests per batch, comma-separated (1:60,16:128)",
    )
    parser.add_argument("--tokens", type=int, default=20, help="reply length (SSE chunks)")
    parser.add_argument("--pairs", type=int, default=1000, help="micro: pairs per round")
    parser.add_argument("--micro-rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 small rounds")
    parser.add_argument(
        "--cases",
        default=",".join(CASES),
        help=f"the cases to run, comma-separated ({','.join(CASES)}; a is always run)",
    )
    parser.add_argument("--json", help="write every figure to this file")
    parser.add_argument("--report", help="print the tables of an earlier run's --json file")
    args = parser.parse_args(argv)
    if args.report:
        result = json.loads(Path(args.report).read_text())
        print(report(result))
        print(footer(result))
        return 0
    if args.quick:
        args.rounds, args.levels, args.pairs, args.micro_rounds = 2, "1:5,4:8", 50, 2
    result = run(args)
    print(report(result))
    print(footer(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
