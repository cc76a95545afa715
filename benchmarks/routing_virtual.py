"""Every weather of ``routing.py --scenarios`` counted in virtual time: the same judge, exact.

A fresh client of the same route (``hedge``, the defaults) runs the weather's phases over
targets that answer with the simulators' own seeded ``Profile`` draws, in trio's virtual time
(``llmroute/testing/_virtual.py``: the engine's own code, no sockets, every wait jumps ahead);
a probe draws each target's own TTFT for every request, and its samples give the weather's best
fixed one-hedge schedule (amplification <= 1.10, ``routing.py``'s bound). Printed per weather
and seed of the router's choices: the whole run's p95 and the p95 after its first 50 requests
against that schedule, and the amplification (what the targets received per request). No
machine and no load in the figures: the same command gives the same numbers (it runs with
``PYTHONHASHSEED=0``: the engine visits some sets of names in their hash order). Not modelled: the
transport and the client's CPU (the timed ``--scenarios`` run is for those). ``price`` is left
out (its goal is cost, not the fastest schedule).

    .venv/bin/python benchmarks/routing_virtual.py              # every weather, seeds 0-2, ~1 min
    .venv/bin/python benchmarks/routing_virtual.py --only steady --seeds 5
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import routing_scenarios as rs  # benchmarks/, beside this script
from routing import hedging_bound, pct

from llmroute.testing._virtual import Phase, probe, run_fresh_client

WEATHERS = [name for name in rs.SCENARIOS if name != "price"]


def config(names: list[str]) -> dict[str, Any]:
    return {
        "providers": {
            n: {"base_url": f"https://{n}.test/v1", "api_key": "sk-virtual", "continuation": {}}
            for n in names
        },
        "models": {rs.ROUTE: {"targets": [f"{n}:{rs.MODEL}" for n in names], "policy": "hedge"}},
    }


def judge(scenario: rs.Scenario, seed: int) -> dict[str, float]:
    """One fresh client's run of ``scenario`` with router seed ``seed``, judged."""
    profiles = {}
    for name, profile in rs.profiles().items():
        for key, value in scenario.initial.get(name, {}).items():
            profile = rs._replace(profile, key, value)
        profiles[name] = profile
    phases = [Phase(seconds, changes) for seconds, changes in scenario.phases]

    def prompt(i: int) -> Any:
        return rs.prompt(i, scenario)

    run = run_fresh_client(
        config(list(profiles)), profiles, prompt, seed=seed, route=rs.ROUTE, phases=phases
    )
    each = probe(profiles, run.requests, prompt, seed=seed, phases=phases)
    best = hedging_bound(each, max_amplification=rs.BOUND_AMPLIFICATION).p95
    ttfts = run.ttfts()
    return {
        "requests": len(ttfts),
        "best_ms": 1000 * best,
        "whole": pct(ttfts, 0.95) / best,
        "after50": pct(ttfts[rs.COLD_REQUESTS :], 0.95) / best,
        "amplification": run.amplification,
    }


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":
        # The engine visits some sets of names in their hash order, which Python seeds per
        # process: fixed, a run's figures are the same on every run and machine.
        os.execve(
            sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"}
        )
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--only", nargs="*", choices=WEATHERS, help="weathers (all but price)")
    p.add_argument("--seeds", type=int, default=3, help="router seeds 0..N-1 (3)")
    args = p.parse_args(argv)
    whole, after50, amp = rs.FROM_COLD
    print(
        "| weather | seed | requests | best schedule p95 ms | whole-run p95 / schedule "
        f"| after {rs.COLD_REQUESTS} / schedule | amplification | goals |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name in args.only or WEATHERS:
        for seed in range(args.seeds):
            r = judge(rs.SCENARIOS[name], seed)
            ok = r["whole"] <= whole and r["after50"] <= after50 and r["amplification"] <= amp
            verdict = "met" if ok else "NOT MET"
            print(
                f"| {name} | {seed} | {r['requests']} | {r['best_ms']:.0f} | {r['whole']:.2f}x "
                f"| {r['after50']:.2f}x | {r['amplification']:.3f} | {verdict} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
