"""What one key's large body costs every other key on the gateway's event loop: its longest
stall while the body is read, checked, routed and sent upstream.

A ticker on the gateway's loop (every 2 ms) records the longest gap between two of its ticks,
in the loop thread's CPU time (steady on a loaded machine) and in wall time (what another key's
stream waits, load included). The gateway runs in the measuring process over TLS + HTTP/2, the
simulator in its own process. Bodies, each just under the default ``max_body_bytes`` (4 MiB):
a chat message of 130,000 content parts, 90,000 short chat messages, one 4 MB chat message, a
legacy completion of 1.3 million token ids. Medians of ``--reps`` bodies each.

    .venv/bin/python benchmarks/gateway_loop_stall.py
    .venv/bin/python benchmarks/gateway_loop_stall.py --baseline /tmp/before --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

_KEY = "gw-loop-stall-bench-0123456789"
_UPSTREAM_KEY = "sk-loop-stall-bench-0123456789"


def bodies(scale: float = 1.0) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each body's name: its path and JSON (``scale`` 1: about 4 MB each)."""

    def n(count: int) -> int:
        return max(1, int(count * scale))

    part = {"type": "text", "text": "a"}
    return {
        "chat, 130,000 parts": (
            "/chat/completions",
            {"model": "sim", "messages": [{"role": "user", "content": [part] * n(130_000)}]},
        ),
        "chat, 90,000 messages": (
            "/chat/completions",
            {"model": "sim", "messages": [{"role": "user", "content": "hello there"}] * n(90_000)},
        ),
        "chat, one 4 MB message": (
            "/chat/completions",
            {"model": "sim", "messages": [{"role": "user", "content": "word " * n(800_000)}]},
        ),
        "completion, 1.3 million ids": (
            "/completions",
            {"model": "sim", "prompt": [1] * n(1_300_000)},
        ),
    }


class _Ticker:
    """The longest gap between two ticks on ``loop``, in wall time and the loop thread's CPU."""

    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self.wall = self.cpu = 0.0
        self._last: tuple[float, float] | None = None
        self.on = True

    def tick(self) -> None:
        now = (time.monotonic(), time.thread_time())
        if self._last is not None:
            self.wall = max(self.wall, now[0] - self._last[0])
            self.cpu = max(self.cpu, now[1] - self._last[1])
        self._last = now
        if self.on:
            self.loop.call_later(0.002, self.tick)


def measure(reps: int, scale: float) -> dict[str, dict[str, float]]:
    """Each body's median longest stall over ``reps`` requests (this process's llmroute)."""
    import httpx

    from llmroute.server import Gateway
    from llmroute.testing import Profile, SimulatorProcess

    sim = SimulatorProcess(profile=Profile(reply_tokens=20)).start()
    try:
        config = {
            "providers": {"sim": {"base_url": sim.base_url, "api_key": _UPSTREAM_KEY}},
            "models": {"sim": {"targets": ["sim:sim-small"]}},
            "routing": {"explore": 0},
            "gateway": {"keys": {"bench": "BENCH_KEY"}},
        }
        environ = {"BENCH_KEY": _KEY}
        out: dict[str, dict[str, float]] = {}
        with (
            Gateway(config, environ=environ, verify=sim.ssl_context(), max_retries=0) as gateway,
            httpx.Client(timeout=120) as client,
        ):
            loop = gateway._loop
            assert loop is not None
            for name, (path, body) in bodies(scale).items():
                content = json.dumps(body).encode()
                walls, cpus = [], []
                for _ in range(reps):
                    ticker = _Ticker(loop)
                    loop.call_soon_threadsafe(ticker.tick)
                    time.sleep(0.05)
                    reply = client.post(
                        gateway.base_url + path,
                        content=content,
                        headers={"authorization": f"Bearer {_KEY}"},
                    )
                    time.sleep(0.05)
                    ticker.on = False
                    if reply.status_code != 200:
                        raise SystemExit(f"{name}: {reply.status_code} {reply.text[:300]}")
                    walls.append(ticker.wall)
                    cpus.append(ticker.cpu)
                out[name] = {
                    "bytes": len(content),
                    "cpu_ms": statistics.median(cpus) * 1e3,
                    "wall_s": statistics.median(walls),
                }
        return out
    finally:
        sim.stop()


def _table(rows: dict[str, dict[str, dict[str, float]]]) -> str:
    """One line a body; one column pair a tree (its loop CPU and wall time)."""
    trees = list(rows)
    head = "| body | " + " | ".join(f"{t}: loop CPU | {t}: wall" for t in trees) + " |"
    lines = [head, "|" + " --- |" * (1 + 2 * len(trees))]
    for name in rows[trees[0]]:
        cells = [
            f"{rows[t][name]['cpu_ms']:.0f} ms | {rows[t][name]['wall_s']:.3f} s" for t in trees
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7, help="requests per body (medians)")
    parser.add_argument("--scale", type=float, default=1.0, help="body size (1: about 4 MB)")
    parser.add_argument(
        "--baseline",
        help="another llmroute checkout (e.g. from git archive) measured beside this one, "
        "one child process per tree each round, in rotated order",
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds with --baseline")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.reps, args.scale)))
        return
    if not args.baseline:
        result = {"this": measure(args.reps, args.scale)}
        print(json.dumps(result) if args.json else _table(result))
        return
    from _trees import interleaved, tree_child

    root = Path(__file__).resolve().parents[1]
    argv = [str(Path(__file__).resolve()), "--child", "--reps", str(args.reps)]
    argv += ["--scale", str(args.scale)]
    trees = {"this": root, "baseline": Path(args.baseline).resolve()}

    def ordered(row: dict[str, Any]) -> dict[str, Any]:  # this, then baseline, every round
        return {name: row[name] for name in trees}

    rounds = [
        ordered(row)
        for row in interleaved(
            trees,
            args.rounds,
            lambda tree: tree_child(tree, argv),
            lambda r, row: print(f"round {r + 1} done", file=sys.stderr, flush=True),
        )
    ]
    if args.json:
        print(json.dumps(rounds))
        return
    for r, row in enumerate(rounds):
        print(f"round {r + 1}:\n{_table(row)}\n")


if __name__ == "__main__":
    main()
