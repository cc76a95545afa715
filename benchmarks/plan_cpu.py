"""CPU of planning one routed request, per policy: what routing adds before anything is sent.

A router built from a config of three targets (never contacted) whose live stats hold 200 TTFT
samples each (medians 250, 400 and 700 ms, as in ``benchmarks/routing.py``) and whose prices are
2 / 8, 0.5 / 2 and 0.1 / 0.4 USD per million input / output tokens. Each case times, in
``time.process_time()``, the engine's start of a request (``Router._begin``: the prompt's
estimate, the report, the goal, the budget) and its plan (the policy, the goal, exploration, the
money budget), ``--calls`` times a round; the median over ``--rounds`` rounds, in µs.

    .venv/bin/python benchmarks/plan_cpu.py
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from llmroute._routes import build_router
from llmroute.config import load_config, resolve
from llmroute.routing.engine import Router

PRICES = {"a": 2.0, "b": 0.5, "c": 0.1}
MEDIANS = {"a": 0.25, "b": 0.40, "c": 0.70}
BODY: dict[str, Any] = {
    "model": "chat",
    "messages": [{"role": "user", "content": "What does the cheapest target cost?"}],
    "stream": True,
}
CASES: dict[str, dict[str, Any]] = {
    "hedge": {"policy": "hedge"},
    "hedge, ttft_target 800ms": {"policy": "hedge", "ttft_target": "800ms"},
    "hedge, hedge_budget_cost 0.1": {"policy": "hedge", "hedge_budget_cost": 0.1},
    "cheapest, ttft_target 800ms": {"policy": "cheapest", "ttft_target": "800ms"},
    "cheapest, hedge_budget_cost 0.1": {
        "policy": "cheapest",
        "ttft_target": "800ms",
        "hedge_budget_cost": 0.1,
    },
}


def router_for(route: dict[str, Any]) -> Router:
    config = load_config(
        {
            "providers": {
                name: {
                    "base_url": f"https://{name}.invalid/v1",
                    "api_key": "sk-bench",
                    "prices": {"*": {"input": usd, "output": 4 * usd}},
                }
                for name, usd in PRICES.items()
            },
            "models": {"chat": {"targets": [f"{n}:m" for n in PRICES], **route}},
            "routing": {"explore": 0},
        }
    )
    assert config is not None
    router = build_router(resolve(config), max_retries=0)
    rng = random.Random(1)
    for name, median in MEDIANS.items():
        stats = router.stats.target(f"{name}:m")
        for _ in range(200):
            stats.record_ttft(median * rng.lognormvariate(0.0, 0.2), 10)
    return router


def never(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("nothing is sent")


def per_request(route: dict[str, Any], calls: int, rounds: int) -> float:
    router = router_for(route)
    chat = router.routes["chat"]
    medians = []
    for _ in range(rounds):
        began = time.process_time()
        for _ in range(calls):
            router._begin(chat, BODY, never, stream=True).plan()
        medians.append((time.process_time() - began) / calls * 1e6)
    return statistics.median(medians)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    for name, route in CASES.items():
        us = per_request(route, args.calls, args.rounds)
        print(f"{name:34s} {us:6.1f} µs per request (begin + plan)", flush=True)


if __name__ == "__main__":
    main()
