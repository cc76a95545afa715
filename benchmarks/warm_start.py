"""A fresh client's first requests: cold, after ``warmup(probe=True)``, and started from the
stats file the last client left, side by side in one run.

Three targets, each a simulator in its own process over TLS + HTTP/2, with the steady weather
of ``benchmarks/routing.py``: A 250 ms median (sigma ``--sigma``) with 10% stalls of 1.5-3 s,
B 400 ms with 1% stalls of 1 s, C 700 ms steady; a route over them (policy ``--policy``,
listed C, B, A: a client that knows nothing tries the slowest first). A teacher client sends
``--teach`` requests and closes, leaving its stats file. Then ``--runs`` rounds, the three modes
in rotated order, each a fresh client sending ``--requests`` requests at ``--concurrency``:

``cold``    nothing known: the priors, exploration of cold targets
``probe``   ``await client.warmup(probe=True)`` first: one one-token request to each target
``file``    ``[routing] stats_file``: a copy of the teacher's file (so every run reads the same)

For each: the callers' TTFT (``create()`` to the first content chunk) p50 and p95 over the
first 50 requests and over all, the attempts per request (amplification; a probe's requests
counted apart), and the share of first attempts that went to C, the slow target.

    .venv/bin/python benchmarks/warm_start.py     # ~2 minutes on 2 cores; --json for the data
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _machine  # benchmarks/_machine.py, beside this script
from routing import target_profiles  # benchmarks/routing.py's steady weather

import llmroute
from llmroute.testing import SimulatorProcess

MODES = ("cold", "probe", "file")
ROUTE, MODEL = "chat", "sim-small"


def config(sims: dict[str, SimulatorProcess], policy: str, stats_file: Path | None) -> Any:
    routing: dict[str, Any] = {"explore": 0.02}
    if stats_file is not None:
        routing["stats_file"] = str(stats_file)
    return {
        "providers": {
            name: {"base_url": sim.base_url, "api_key": "sk-bench", "verify": str(sim.ca_pem_path)}
            for name, sim in sims.items()
        },
        "models": {ROUTE: {"targets": [f"{n}:{MODEL}" for n in ("c", "b", "a")], "policy": policy}},
        "routing": routing,
    }


async def one(client: llmroute.AsyncOpenAI, i: int) -> dict[str, Any]:
    messages: Any = [{"role": "user", "content": f"request {i}: tell me something"}]
    began = time.perf_counter()
    ttft = None
    stream = await client.chat.completions.create(model=ROUTE, messages=messages, stream=True)
    async with stream:
        async for chunk in stream:
            if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                ttft = time.perf_counter() - began
    report = stream.route
    assert report is not None
    return {"ttft": ttft, "attempts": len(report.attempts), "first": report.attempts[0].target}


async def run(cfg: Any, mode: str, requests: int, concurrency: int) -> dict[str, Any]:
    """A fresh client's first ``requests`` requests, in order, ``concurrency`` at a time."""
    results: list[dict[str, Any]] = [{} for _ in range(requests)]
    async with llmroute.AsyncOpenAI(config=cfg) as client:
        await client.warmup(probe=mode == "probe")
        attempts = client.metrics.counts()["attempts"]
        probed = int(sum(v for (_, reason, _), v in attempts.items() if reason == "probe"))
        next_index = 0

        async def worker() -> None:
            nonlocal next_index
            while next_index < requests:
                i = next_index
                next_index += 1
                results[i] = await one(client, i)

        async with asyncio.TaskGroup() as tg:
            for _ in range(concurrency):
                tg.create_task(worker())
    return {"mode": mode, "probe_requests": probed, "requests": results}


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary(rows: list[dict[str, Any]], first: int) -> dict[str, float]:
    requests = [r for row in rows for r in row["requests"][:first]]
    ttfts = [r["ttft"] for r in requests if r["ttft"] is not None]
    return {
        "p50_ms": 1000 * statistics.median(ttfts),
        "p95_ms": 1000 * pct(ttfts, 0.95),
        "amplification": sum(r["attempts"] for r in requests) / len(requests),
        "first_to_c": sum(r["first"] == f"c:{MODEL}" for r in requests) / len(requests),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="llmroute-warm-"))
    taught = workdir / "taught.json"
    rows: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    try:
        for round_ in range(args.runs):
            order = MODES[round_ % 3 :] + MODES[: round_ % 3]
            for mode in order:  # fresh simulators (same seeded draws) for every run
                with _simulators(args.sigma) as sims:
                    if not taught.exists():  # the teacher leaves its file when it closes
                        await run(config(sims, args.policy, taught), "teach", args.teach, 8)
                    path = None
                    if mode == "file":
                        path = workdir / f"run-{round_}.json"
                        shutil.copy(taught, path)
                    cfg = config(sims, args.policy, path)
                    rows[mode].append(await run(cfg, mode, args.requests, args.concurrency))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "summary": {
            mode: {
                "first_50": summary(found, 50),
                "all": summary(found, args.requests),
                "probe_requests": found[0]["probe_requests"],
            }
            for mode, found in rows.items()
        },
        "config": vars(args),
        "load_average": os.getloadavg(),
        "machine": _machine.machine(("llmroute", "openai", "anyio", "hypercorn")),
    }


class _simulators:
    """Three simulator processes, started and stopped together."""

    def __init__(self, sigma: float) -> None:
        self.procs = {
            name: SimulatorProcess(profile=p, tls=True)
            for name, p in target_profiles(sigma).items()
        }

    def __enter__(self) -> dict[str, SimulatorProcess]:
        for proc in self.procs.values():
            proc.__enter__()
        return self.procs

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs.values():
            proc.__exit__(None, None, None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="rounds of the three modes (3)")
    p.add_argument("--requests", type=int, default=100, help="requests per fresh client (100)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--teach", type=int, default=200, help="the teacher's requests (200)")
    p.add_argument("--policy", default="hedge")
    p.add_argument("--sigma", type=float, default=0.25)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    out = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(
        f"policy {args.policy}, {args.runs} fresh clients per mode, {args.requests} requests each"
    )
    print(
        "| mode | first 50: p50 | p95 | all: p50 | p95 | attempts/request | first to C | probes |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for mode, s in out["summary"].items():
        f, a = s["first_50"], s["all"]
        print(
            f"| {mode} | {f['p50_ms']:.0f} ms | {f['p95_ms']:.0f} ms | {a['p50_ms']:.0f} ms | "
            f"{a['p95_ms']:.0f} ms | {a['amplification']:.2f} | {a['first_to_c']:.0%} | "
            f"{s['probe_requests']} |"
        )
    print(f"load average {out['load_average'][0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
