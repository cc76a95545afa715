"""Client CPU per chunk of a *routed* stream (the engine's loop), this tree against a baseline
tree, side by side in one run.

A zero-latency simulator in a separate process streams ``--tokens``-token replies over TLS +
HTTP/2 (``--chunk-tokens`` tokens per delta). Each round runs one child process per tree, in
rotated order, with ``PYTHONPATH`` set to that tree: the child opens a routed client (a route of
one target), streams ``--warmup`` replies, then measures its own CPU time (``process_time``) over
``--streams`` replies. Reported: the median CPU seconds per 1000 chunks of each tree and the
median of the per-round ratios this/baseline (measurements seconds apart, since absolute times
drift on a shared machine).

    git archive <commit> llmroute providers | tar -x -C /tmp/base   # the baseline tree
    .venv/bin/python benchmarks/routed_stream.py --baseline /tmp/base
    .venv/bin/python benchmarks/routed_stream.py --baseline /tmp/base --usage   # with usage
    .venv/bin/python benchmarks/routed_stream.py --baseline /tmp/base --frame-per-event
    .venv/bin/python benchmarks/routed_stream.py --baseline /tmp/base --inter-token 0.005

``--inter-token`` paces the reply as a real vendor does (one token every that many seconds;
replies then default to 200 tokens, 1 s each), so every chunk is a read that waits: what each
such read costs (its deadline, the wake-up) is measured, not just the decoding of buffered
frames. The CPU is still the client's own (``process_time``; idle waiting costs none).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

import _machine  # benchmarks/_machine.py, beside this script
from _trees import interleaved, tree_child
from _trees import ratio as ratio_of

from llmroute.testing import Profile, SimulatorProcess

HERE = Path(__file__).resolve().parent.parent

CHILD = """
import json, sys, time, anyio
from llmroute import AsyncOpenAI

async def main() -> None:
    base_url, ca, streams, warmup, usage = sys.argv[1:6]
    config = {
        "providers": {"sim": {"base_url": base_url, "api_key": "sk-bench"}},
        "models": {"chat": {"targets": ["sim:sim-small"]}},
    }
    extra = {"stream_options": {"include_usage": True}} if usage == "1" else {}
    messages = [{"role": "user", "content": "Tell me a long story."}]
    async with AsyncOpenAI(config=config, verify=ca) as client:
        async def once() -> int:
            stream = await client.chat.completions.create(
                model="chat", messages=messages, stream=True, **extra
            )
            n = 0
            async for _ in stream:
                n += 1
            return n
        for _ in range(int(warmup)):
            await once()
        cpu = time.process_time()
        chunks = 0
        for _ in range(int(streams)):
            chunks += await once()
        cpu = time.process_time() - cpu
    print(json.dumps({"cpu": cpu, "chunks": chunks}))

anyio.run(main)
"""


def child(tree: Path, sim: SimulatorProcess, args: argparse.Namespace) -> dict[str, Any]:
    argv = [sim.base_url, str(sim.ca_pem_path), str(args.streams), str(args.warmup)]
    argv.append("1" if args.usage else "0")
    return tree_child(tree, ["-c", CHILD, *argv])


def per_1000(out: dict[str, Any]) -> float:
    """A child's CPU seconds per 1000 chunks."""
    return out["cpu"] / out["chunks"] * 1000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--baseline", required=True, type=Path, help="a tree holding llmroute/")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--streams", type=int, default=5, help="measured streams per child (5)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--tokens", type=int, help="reply length (1000; 200 with --inter-token)")
    p.add_argument("--chunk-tokens", type=int, default=1)
    p.add_argument("--usage", action="store_true", help="ask for stream_options.include_usage")
    p.add_argument(
        "--frame-per-event",
        action="store_true",
        help="one SSE event per HTTP/2 DATA frame and TLS record, as vendors flush",
    )
    p.add_argument(
        "--inter-token",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="pace the reply: this long between tokens, so every read waits (0: unpaced)",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.tokens is None:
        args.tokens = 200 if args.inter_token > 0 else 1000
    trees = {"this": HERE, "baseline": args.baseline.resolve()}
    profile = Profile(
        reply_tokens=args.tokens,
        tokens_per_chunk=args.chunk_tokens,
        frame_per_event=args.frame_per_event,
        inter_token=args.inter_token,
    )

    def show(r: int, row: dict[str, dict[str, Any]]) -> None:
        if not args.json:
            this, base = per_1000(row["this"]), per_1000(row["baseline"])
            print(
                f"round {r + 1}: this {this:.4f}  baseline {base:.4f}  ratio {this / base:.3f}",
                flush=True,
            )

    with SimulatorProcess(profile=profile, tls=True) as sim:
        runs = interleaved(trees, args.rounds, lambda tree: child(tree, sim, args), show)
    rounds = [{name: per_1000(out) for name, out in row.items()} for row in runs]
    result = {
        "cpu_s_per_1000_chunks": {n: statistics.median(r[n] for r in rounds) for n in trees},
        "ratio_this_over_baseline": ratio_of(
            [r["this"] for r in rounds], [r["baseline"] for r in rounds]
        ),
        "rounds": rounds,
        "config": vars(args) | {"baseline": str(args.baseline)},
        "load_average": os.getloadavg(),
        "machine": _machine.machine(("llmroute", "httpx", "h2", "openai", "anyio", "hypercorn")),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        cpu = result["cpu_s_per_1000_chunks"]
        ratio = result["ratio_this_over_baseline"]
        print(
            f"CPU s/1000 chunks: this {cpu['this']:.4f}, baseline {cpu['baseline']:.4f}; "
            f"this/baseline {ratio['median']:.3f} (rounds {ratio['min']:.3f}..{ratio['max']:.3f}); "
            f"load average {result['load_average'][0]:.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
