"""The first request of a fresh app instance: alone (local priors) against a fleet that shares
its statistics through Redis, side by side in one run.

Two simulators in separate processes: a slow target (``--slow`` seconds to the first token,
listed first in the route, so an instance that knows nothing tries it first) and a fast one. A
teacher process sends a few requests to each and publishes its samples to a private
redis-server. Then ``--instances`` fresh processes per mode, interleaved, each time its first
routed request (from ``create()`` to the first chunk, wall clock, Redis read included) and the
part of it before the engine started (that minus the route report's TTFT: openai's request
machinery, and in ``fleet`` mode the Redis read):

``alone``   ``stats_backend = "memory"``: what an instance knew before fleet-warm routing
``fleet``   ``stats_backend = "redis"``: the first request reads the fleet's stats first

    .venv/bin/python benchmarks/fleet_warm.py            # needs redis-server on the PATH
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import _machine  # benchmarks/_machine.py, beside this script

from llmroute.testing import Profile, SimulatorProcess

INSTANCE = """
import json, sys, time, anyio
from llmroute import AsyncOpenAI

async def main() -> None:
    config, mode = json.loads(sys.argv[1]), sys.argv[2]
    async with AsyncOpenAI(config=config) as client:
        if mode == "teach":
            for route in ("slow_only", "fast_only"):
                for i in range(6):
                    stream = await client.chat.completions.create(
                        model=route, messages=[{"role": "user", "content": f"lesson {i}"}],
                        stream=True,
                    )
                    async for _ in stream:
                        pass
            await client._stats_sync.sync()
            print(json.dumps({"published": client._stats_sync.sent}))
            return
        started = time.perf_counter()
        stream = await client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "first"}], stream=True
        )
        first = None
        async for _ in stream:
            if first is None:
                first = time.perf_counter() - started
        print(json.dumps({"winner": stream.route.winner, "first_chunk": first,
                          "routed_ttft": stream.route.ttft}))

anyio.run(main)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_redis(workdir: str) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on the PATH")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", workdir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(500):  # up to ~10 s
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.02)
    proc.terminate()
    raise SystemExit("redis-server did not start")


def config(
    sims: tuple[SimulatorProcess, SimulatorProcess], redis: str, prefix: str, backend: str
) -> dict[str, Any]:
    slow, fast = sims  # separate processes: each its own CA
    return {
        "providers": {
            name: {"base_url": sim.base_url, "api_key": "sk-bench", "verify": str(sim.ca_pem_path)}
            for name, sim in (("slow", slow), ("fast", fast))
        },
        "models": {
            "chat": {"targets": ["slow:sim-small", "fast:sim-small"], "policy": "fastest"},
            "slow_only": {"targets": ["slow:sim-small"]},
            "fast_only": {"targets": ["fast:sim-small"]},
        },
        "routing": {"explore": 0, "stats_backend": backend},
        "redis": {"url": redis, "prefix": prefix},  # the default timeout, 0.25 s
    }


def run(cfg: dict[str, Any], mode: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "LLMROUTE_CONFIG"}
    done = subprocess.run(
        [sys.executable, "-c", INSTANCE, json.dumps(cfg), mode],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--instances", type=int, default=8, help="fresh instances per mode (8)")
    p.add_argument("--slow", type=float, default=0.4, help="the slow target's TTFT (0.4 s)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    prefix = f"llmroute-bench-{uuid.uuid4().hex[:8]}"
    results: dict[str, list[dict[str, Any]]] = {"alone": [], "fleet": []}
    with (
        tempfile.TemporaryDirectory() as workdir,
        SimulatorProcess(profile=Profile(reply_tokens=4, ttft_median=args.slow), tls=True) as slow,
        SimulatorProcess(profile=Profile(reply_tokens=4), tls=True) as fast,
    ):
        redis, url = start_redis(workdir)
        try:
            sims = (slow, fast)
            taught = run(config(sims, url, prefix, "redis"), "teach")
            for i in range(args.instances):
                for mode in ("alone", "fleet") if i % 2 == 0 else ("fleet", "alone"):
                    backend = "memory" if mode == "alone" else "redis"
                    results[mode].append(run(config(sims, url, prefix, backend), "first"))
        finally:
            redis.terminate()
            redis.wait(10)
    summary = {
        mode: {
            "to_fast": sum(r["winner"] == "fast:sim-small" for r in rows),
            "instances": len(rows),
            "first_chunk_median_s": statistics.median(r["first_chunk"] for r in rows),
            "first_chunk_max_s": max(r["first_chunk"] for r in rows),
            "before_routing_median_s": statistics.median(
                r["first_chunk"] - r["routed_ttft"] for r in rows
            ),
        }
        for mode, rows in results.items()
    }
    out = {
        "summary": summary,
        "published_by_teacher": taught["published"],
        "config": vars(args),
        "load_average": os.getloadavg(),
        "machine": _machine.machine(("llmroute", "redis", "openai", "anyio", "hypercorn")),
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for mode, s in summary.items():
        print(
            f"{mode:<6} first request to the fast target: {s['to_fast']}/{s['instances']}; "
            f"create() to first chunk: median {s['first_chunk_median_s'] * 1000:.0f} ms, "
            f"max {s['first_chunk_max_s'] * 1000:.0f} ms; before the engine started: median "
            f"{s['before_routing_median_s'] * 1000:.1f} ms"
        )
    print(f"load average {out['load_average'][0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
