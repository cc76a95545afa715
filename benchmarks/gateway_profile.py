"""Where the gateway's CPU goes: cProfile of one gateway process per kind of request.

One zero-latency simulator (``SimulatorProcess``, TLS + HTTP/2, ``--tokens`` per reply) and one
gateway (the same ``GatewayApp`` and hypercorn settings as ``llmroute serve``, HTTPS, HTTP/2 by
ALPN) in child processes, as in ``benchmarks/gateway.py``. The gateway's child runs a
``cProfile.Profile`` that this script switches on (SIGUSR1) and off (SIGUSR2, which also writes
the stats) around each measured batch, so warm-up, start and shutdown are left out. For each
kind (a streamed and a non-streamed chat completion) it sends ``--requests`` requests at
``--concurrency`` from an ``llmroute.AsyncOpenAI`` in this process, and prints the gateway's
own CPU time (self time, cProfile on ``time.process_time``) per request by part (HTTP
server, TLS and sockets, auth and validation, the upstream client's machinery, routing,
transport, decoding, metrics, logging),
then the functions with the most self time, with their calls per request.

cProfile slows small functions most (here ~3-4x in all), so its shares lean towards code with
many small calls; the calls per request are exact. ``--py-spy`` samples the gateway with py-spy
instead (``pip install py-spy``; 1000 Hz, only samples that hold the CPU), which barely slows
it: its shares are the faithful ones, and it shows inclusive shares of the main stages too.
Without a profiler the gateway's CPU per request is also measured (``/proc``), over the same
kind of batch.

    .venv/bin/python benchmarks/gateway_profile.py                  # ~30 s
    .venv/bin/python benchmarks/gateway_profile.py --requests 400 --top 30 --concurrency 8
    .venv/bin/python benchmarks/gateway_profile.py --py-spy --requests 1000
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import signal
import socket
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gateway import (
    GATEWAY_KEY,
    MESSAGES,
    UPSTREAM_KEY,
    child,
    cpu_seconds,
    gateway_files,
    wait_ready,
)

from llmroute import AsyncOpenAI
from llmroute.testing import Profile, SimulatorProcess

ROOT = Path(__file__).resolve().parents[1]

# Where a function's self time is counted: the first pattern its file name contains. A
# builtin's (C functions: isinstance, len, socket.send, ...) goes to its callers' parts, in
# proportion to the time each caller spent in it.
PARTS: list[tuple[str, tuple[str, ...]]] = [
    ("HTTP server: hypercorn (+ llmroute/server/_h2)", ("hypercorn/", "llmroute/server/_h2")),
    ("gateway app (llmroute/server/_app, auth, validation, slots)", ("llmroute/server/_",)),
    ("HTTP/2 framing: h2, hpack, hyperframe (both sides)", ("/h2/", "/hpack/", "/hyperframe/")),
    ("HTTP/2 framing: h2, hpack, hyperframe (both sides)", ("/priority/",)),
    ("TLS and sockets: asyncio's TLS and socket transports, ssl", ("asyncio/sslproto.py",)),
    ("TLS and sockets: asyncio's TLS and socket transports, ssl", ("asyncio/selector_events",)),
    ("TLS and sockets: asyncio's TLS and socket transports, ssl", ("/ssl.py", "/socket.py")),
    ("event loop: asyncio (tasks, handles, futures, epoll)", ("asyncio/", "/selectors.py")),
    ("upstream client: openai's machinery", ("/openai/",)),
    ("upstream client: llmroute seam (_client, _dispatch, _upstream, ...)", ("llmroute/_",)),
    ("routing engine and stats", ("llmroute/routing/", "sortedcontainers/")),
    ("upstream transport: llmroute/transport + httpx", ("llmroute/transport/", "/httpx/")),
    ("decoding: protocols (SSE -> chunk objects)", ("llmroute/protocols/", "<string>")),
    ("encoding: pydantic (model_dump_json), json", ("/pydantic/", "/pydantic_core/", "/json/")),
    ("metrics: llmroute/metrics, prometheus_client", ("llmroute/metrics/", "prometheus")),
    ("metrics: llmroute/metrics, prometheus_client", ("opentelemetry",)),
    ("cache", ("llmroute/cache/",)),
    ("anyio (task groups, cancel scopes), sniffio", ("/anyio/", "/sniffio/")),
    ("logging (hpack's per-header debug calls, mostly)", ("/logging/",)),
]
BUILTIN = "~"


def part_of(filename: str, name: str) -> str:
    for part, patterns in PARTS:
        if any(p in filename for p in patterns):
            return part
    if filename == BUILTIN:
        return "builtins"
    return "other (stdlib: copy, enum, weakref, uuid, contextlib, ...)"


# Who a py-spy sample's CPU is for: the deepest of these its stack passes through
# (name, a file part, a function name or None for any function of that file).
STAGES: list[tuple[str, str, str | None]] = [
    ("HTTP server: hypercorn's connection tasks (TLS, h2 parsing, send task)", "hypercorn/", None),
    ("gateway app: its own code", "server/_app.py", None),
    ("gateway app: its own code", "server/_relay.py", None),
    ("gateway app: its own code", "server/_calls.py", None),
    ("gateway app: its own code", "server/_exchange.py", None),
    ("gateway app: its own code", "server/_tally.py", None),
    ("gateway app: its own code", "server/_errors.py", None),
    ("gateway app: auth, validation, per-key slots", "server/_auth.py", None),
    ("gateway app: auth, validation, per-key slots", "server/_validate.py", None),
    ("gateway app: auth, validation, per-key slots", "server/_slots.py", None),
    ("gateway app: auth, validation, per-key slots", "server/_exchange.py", "read_json"),
    ("gateway app: auth, validation, per-key slots", "server/_checks.py", None),
    ("gateway app: auth, validation, per-key slots", "server/_gate.py", None),
    ("gateway app: auth, validation, per-key slots", "server/_admission.py", None),
    ("gateway app: auth, validation, per-key slots", "server/_limits/", None),
    ("upstream client: openai's request machinery", "openai/", None),
    ("upstream client: llmroute's seam and dispatch", "llmroute/_client.py", None),
    ("upstream client: llmroute's seam and dispatch", "llmroute/_dispatch.py", None),
    ("upstream client: llmroute's seam and dispatch", "llmroute/_upstream.py", None),
    ("upstream client: llmroute's seam and dispatch", "llmroute/_streaming.py", None),
    ("routing engine", "routing/", None),
    ("upstream transport: httpx, llmroute's h2 client, TLS", "httpx/", None),
    ("upstream transport: httpx, llmroute's h2 client, TLS", "llmroute/transport/", None),
    ("decoding: SSE -> chunk objects", "protocols/", None),
    ("metrics", "metrics/", None),
    ("metrics", "prometheus_client/", None),
    (
        "gateway app: writing to the client (ASGI send -> hypercorn -> h2 -> TLS)",
        "hypercorn/",
        "app_send",
    ),
    ("encoding: chunk -> JSON (dump_json)", "server/_exchange.py", "dump_json"),
    ("logging", "logging/", None),
]


def stage_of(frames: list[str]) -> str:
    found = "event loop (asyncio) and other"
    for frame in frames:
        name, _, where = frame.partition(" (")
        for stage, part, function in STAGES:
            if part in where and (function is None or name == function):
                found = stage
    return found


def spy_summary(path: str, requests: int, rate: int, top: int) -> str:
    """Shares of a py-spy raw profile: by stage (inclusive, the deepest stage a sample is
    in) and by the leaf function's part (self)."""
    by_stage: dict[str, int] = defaultdict(int)
    by_part: dict[str, int] = defaultdict(int)
    leaves: dict[str, int] = defaultdict(int)
    total = 0
    for line in Path(path).read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")[1:]  # the first names the process
        total += count
        by_stage[stage_of(frames)] += count
        leaf = frames[-1] if frames else "?"
        name, _, where = leaf.partition(" (")
        by_part[part_of(where.rstrip(")").rsplit(":", 1)[0], name)] += count
        leaves[leaf] += count
    ms = 1000 / rate / requests
    lines = [f"py-spy: {total} samples at {rate} Hz, {total * ms:.2f} ms per request", ""]
    lines += ["| stage (inclusive) | per request | share |", "| --- | ---: | ---: |"]
    for stage, count in sorted(by_stage.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {stage} | {count * ms * 1000:.0f} µs | {count / total:.1%} |")
    lines += ["", "| part (self) | per request | share |", "| --- | ---: | ---: |"]
    for part, count in sorted(by_part.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {part} | {count * ms * 1000:.0f} µs | {count / total:.1%} |")
    lines += ["", "| function (self) | share |", "| --- | ---: |"]
    for leaf, count in sorted(leaves.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"| `{leaf}` | {count / total:.1%} |")
    return "\n".join(lines)


def run_child(config: str, out: str) -> None:
    """The gateway, with a profiler that SIGUSR1 starts and SIGUSR2 stops and writes."""
    from llmroute.server import GatewayApp
    from llmroute.server._run import base_url, listen, serve

    certfile, keyfile = os.environ["PROFILE_CERT"], os.environ["PROFILE_KEY"]
    app = GatewayApp(config)
    sock = listen("127.0.0.1", 0)
    print("listening on " + base_url(sock, tls=True), flush=True)
    profiler = cProfile.Profile(time.process_time)  # CPU time: waits are not work
    written = [0]

    def start(signum: int, frame: object) -> None:
        profiler.enable()

    def stop(signum: int, frame: object) -> None:
        profiler.disable()
        written[0] += 1
        profiler.dump_stats(f"{out}.{written[0]}")
        profiler.clear()  # pyright: ignore[reportAttributeAccessIssue]

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)

    async def main() -> None:
        shutdown = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, shutdown.set)
        await serve(app, sock, certfile=certfile, keyfile=keyfile, shutdown_trigger=shutdown.wait)

    asyncio.run(main())


@contextmanager
def profiled_gateway(sim: SimulatorProcess, folder: str) -> Iterator[tuple[str, Any, int, str]]:
    import ssl

    ca, cert, key, config = gateway_files(sim, folder)
    out = os.path.join(folder, "gateway.prof")
    env = {
        **os.environ,
        "BENCH_UPSTREAM_KEY": UPSTREAM_KEY,
        "BENCH_GATEWAY_KEY": GATEWAY_KEY,
        "SSL_CERT_FILE": sim.ca_pem_path or "",
        "PROFILE_CERT": cert,
        "PROFILE_KEY": key,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    command = [sys.executable, __file__, "--child", config, out]
    import subprocess

    with child(command, stdout=subprocess.PIPE, text=True, env=env) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening on " not in line:
            raise RuntimeError(f"the gateway did not start: {line!r}")
        url = line.split("listening on ", 1)[1].split()[0]
        port = int(url.rsplit(":", 1)[1].split("/")[0])

        def listening() -> bool:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True

        wait_ready(proc, "the gateway", listening, 30)
        yield url, ctx, proc.pid, out


async def one(client: AsyncOpenAI, stream: bool) -> None:
    messages: Any = MESSAGES
    if stream:
        chunks = await client.chat.completions.create(model="chat", messages=messages, stream=True)
        async with chunks:
            async for _ in chunks:
                pass
    else:
        await client.chat.completions.create(model="chat", messages=messages)


async def batch(client: AsyncOpenAI, stream: bool, requests: int, concurrency: int) -> None:
    share, extra = divmod(requests, concurrency)

    async def worker(count: int) -> None:
        for _ in range(count):
            await one(client, stream)

    await asyncio.gather(*(worker(share + (i < extra)) for i in range(concurrency)))


def wait_for(path: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gateway wrote no profile {path}")
        time.sleep(0.05)
    time.sleep(0.2)  # the write may still be going on


def summary(path: str, requests: int, top: int) -> str:
    stats = pstats.Stats(path)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    by_part: dict[str, float] = defaultdict(float)
    total = 0.0
    rows = []
    for (filename, line, name), (_cc, ncalls, tottime, cumtime, callers) in raw.items():
        total += tottime
        if filename == BUILTIN and callers:
            spent = sum(c[2] for c in callers.values()) or 1.0
            for (c_file, _, c_name), c in callers.items():
                by_part[part_of(c_file, c_name)] += tottime * c[2] / spent
        else:
            by_part[part_of(filename, name)] += tottime
        short = filename.rsplit("site-packages/", 1)[-1].replace(str(ROOT) + "/", "")
        if "/lib/python3." in short:  # the standard library: asyncio/..., ssl.py
            short = short.rsplit("/lib/python3.", 1)[-1].split("/", 1)[-1]
        rows.append((tottime, ncalls, cumtime, f"{short}:{line}({name})"))
    lines = [f"profiled self time: {total / requests * 1000:.3f} ms per request", ""]
    lines += ["| part | self time per request | share |", "| --- | ---: | ---: |"]
    for part, seconds in sorted(by_part.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {part} | {seconds / requests * 1e6:.0f} µs | {seconds / total:.1%} |")
    lines += ["", "| function | self µs / req | calls / req | cumulative µs / req |"]
    lines += ["| --- | ---: | ---: | ---: |"]
    for tottime, ncalls, cumtime, where in sorted(rows, reverse=True)[:top]:
        lines.append(
            f"| `{where}` | {tottime / requests * 1e6:.1f} | {ncalls / requests:.1f} "
            f"| {cumtime / requests * 1e6:.0f} |"
        )
    return "\n".join(lines)


@contextmanager
def spying(pid: int, out: str, rate: int) -> Iterator[None]:
    """py-spy recording ``pid`` into ``out`` (raw, collapsed stacks) while the block runs."""
    import shutil
    import subprocess

    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    command = [spy, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw"]
    command += ["--output", out]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)  # attached
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def measure(args: argparse.Namespace, url: str, ctx: Any, pid: int, out: str) -> None:
    client = AsyncOpenAI(api_key=GATEWAY_KEY, base_url=url, verify=ctx, max_retries=0)
    n = args.requests
    try:
        for stream in (True, False):
            await batch(client, stream, 50, args.concurrency)  # warm
        written = 0
        for stream in (True, False):
            kind = "streamed" if stream else "non-streamed"
            before = cpu_seconds(pid)
            await batch(client, stream, n, args.concurrency)
            plain = (cpu_seconds(pid) - before) / n
            title = f"## {kind} chat completion, {n} requests at concurrency {args.concurrency}"
            cpu = f"gateway CPU per request without a profiler: {plain * 1000:.2f} ms (/proc)"
            if args.py_spy:
                path = f"{out}.spy.{int(stream)}"
                with spying(pid, path, args.rate):
                    await batch(client, stream, n, args.concurrency)
                wait_for(path)
                print(f"\n{title}\n\n{cpu}")
                print(spy_summary(path, n, args.rate, args.top))
                continue
            os.kill(pid, signal.SIGUSR1)
            await asyncio.sleep(0.2)
            await batch(client, stream, n, args.concurrency)
            os.kill(pid, signal.SIGUSR2)
            written += 1
            wait_for(f"{out}.{written}")
            print(f"\n{title}\n\n{cpu}")
            print(summary(f"{out}.{written}", n, args.top))
            if args.save:
                import shutil

                os.makedirs(args.save, exist_ok=True)
                shutil.copy(f"{out}.{written}", os.path.join(args.save, f"gateway-{kind}.prof"))
    finally:
        await client.close()


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        run_child(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=20, help="reply length (SSE chunks)")
    parser.add_argument("--top", type=int, default=25, help="functions listed")
    parser.add_argument("--save", help="a folder to keep the cProfile files in (pstats)")
    parser.add_argument("--py-spy", action="store_true", help="sample with py-spy, not cProfile")
    parser.add_argument("--rate", type=int, default=1000, help="py-spy's samples per second")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with (
        tempfile.TemporaryDirectory() as folder,
        SimulatorProcess(Profile(reply_tokens=args.tokens), tls=True) as sim,
        profiled_gateway(sim, folder) as (url, ctx, pid, out),
    ):
        asyncio.run(measure(args, url, ctx, pid, out))
    print(f"\nload average (1 min): {load:.1f} before, {os.getloadavg()[0]:.1f} after")


if __name__ == "__main__":
    main()
