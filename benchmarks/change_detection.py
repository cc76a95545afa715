"""Change detection's error rates, measured (issue 26 item 2): no server, no sleep.

Seeded TTFT samples go into a target's live stats (``llmroute.routing.stats.TargetStats``) on an
injectable clock, 50 ms apart (a target serving a route at concurrency 8). Printed:

* **false alarms** on steady targets: changes declared over ``--samples`` samples per seed and
  ``--seeds`` seeds, by kind (to slower, the one that takes a target's traffic away; to faster
  at ``FALSE_ALARM_RATE``; to faster in a thin window at ``RETURN_ALPHA``), per window (the
  window of all prompt classes; the prompt's class window sees the same). Profiles: the issue's A
  (median 250 ms, lognormal sigma 0.2, 10% stalls of +1.5..3 s: 6-12x the median), the same
  hedged at its live p95 by a target answering 0.4 s later (its stalls are then cancelled:
  censored samples), B (400 ms, 1% stalls of 1 s), C (700 ms, sigma 0.05);
* **detection delay**: samples of the new regime before a change is declared, over 200
  seeds: 4x slower after 200 steady samples (without stalls, and with A's stalls in both
  regimes), and 4x faster again after a change to slower, re-measured every 10 s.

    .venv/bin/python benchmarks/change_detection.py            # ~1 minute
    .venv/bin/python benchmarks/change_detection.py --seeds 20
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Callable

from llmroute.routing.stats import (
    FALSE_ALARM_RATE,
    RETURN_ALPHA,
    StatsSettings,
    TargetStats,
    change_alpha,
)

Sampler = Callable[[random.Random], float]
SPACING = 0.05


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stalling(median: float, sigma: float, stall: float = 0.0, low: float = 0.0, high: float = 0.0):
    def draw(rng: random.Random) -> float:
        value = rng.lognormvariate(math.log(median), sigma)
        if stall and rng.random() < stall:
            value += rng.uniform(low, high)
        return value

    return draw


PROFILES: dict[str, tuple[Sampler, float | None]] = {
    "A: 250 ms, 10% stalls +1.5..3 s": (stalling(0.25, 0.2, 0.1, 1.5, 3.0), None),
    "A, hedged at its p95 (+0.4 s)": (stalling(0.25, 0.2, 0.1, 1.5, 3.0), 0.4),
    "A, sigma 0.1": (stalling(0.25, 0.1, 0.1, 1.5, 3.0), None),
    "B: 400 ms, 1% stalls +1 s": (stalling(0.40, 0.2, 0.01, 1.0, 1.0), None),
    "C: 700 ms, sigma 0.05": (stalling(0.70, 0.05), None),
}


def steady(sampler: Sampler, hedge: float | None, count: int, seed: int) -> Counter[str]:
    clock = Clock()
    target = TargetStats("t", StatsSettings(), clock)
    rng = random.Random(seed)
    kinds: Counter[str] = Counter()
    for _ in range(count):
        clock.now += SPACING
        value = sampler(rng)
        window = target._ttft
        before, n = target.shifts, len(window)
        thin = window.slowed or n < 2 * target.settings.recent
        if hedge is not None and value > (delay := target.predict(0.95, 100)) + hedge:
            target.record_censored(delay + hedge, 100)
        else:
            target.record_ttft(value, 100)
        if target.shifts > before:
            kinds["slower" if window.slowed else "faster, thin" if thin else "faster"] += 1
    return kinds


def delay_to_detect(before: Sampler, after: Sampler, seed: int, *, back: bool = False) -> int:
    clock = Clock()
    target = TargetStats("t", StatsSettings(), clock)
    rng = random.Random(seed)
    for _ in range(200):
        clock.now += SPACING
        target.record_ttft(before(rng), 100)
    if back:  # slow now: a change to slower, then 3 more slow samples; then fast again
        for _ in range(30):
            clock.now += SPACING
            target.record_ttft(after(rng), 100)
            if target._ttft.slowed:
                break
        for _ in range(3):
            clock.now += SPACING
            target.record_ttft(after(rng), 100)
        before, after = after, before
    shifts = target.shifts
    for count in range(1, 101):
        clock.now += 10.0 if back else SPACING
        target.record_ttft(after(rng), 100)
        if target.shifts > shifts:
            return count
    return 101


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--samples", type=int, default=20_000, help="steady samples per seed")
    p.add_argument("--seeds", type=int, default=5, help="seeds per steady profile (5)")
    args = p.parse_args(argv)
    began = time.perf_counter()
    print(
        f"FALSE_ALARM_RATE {FALSE_ALARM_RATE:g} per sample and window "
        f"({change_alpha(StatsSettings().recent):.2g} per test), RETURN_ALPHA {RETURN_ALPHA:g}"
    )
    print(f"\nsteady targets: {args.seeds} x {args.samples:,} samples each, per window")
    print("| profile | to slower | to faster | to faster, thin | all | samples per alarm |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, (sampler, hedge) in PROFILES.items():
        kinds: Counter[str] = Counter()
        for seed in range(args.seeds):
            kinds += steady(sampler, hedge, args.samples, 1 + 7 * seed)
        total = sum(kinds.values())
        per = f"{args.seeds * args.samples / total:,.0f}" if total else "-"
        print(
            f"| {name} | {kinds['slower']} | {kinds['faster']} | {kinds['faster, thin']} "
            f"| {total} | {per} |"
        )
    cases = {
        "4x slower (250 ms -> 1 s), no stalls": (stalling(0.25, 0.2), stalling(1.0, 0.2), False),
        "4x slower, 10% stalls in both": (
            stalling(0.25, 0.2, 0.1, 1.5, 3.0),
            stalling(1.0, 0.2, 0.1, 1.5, 3.0),
            False,
        ),
        "4x faster again (after a change to slower)": (
            stalling(0.25, 0.2),
            stalling(1.0, 0.2),
            True,
        ),
    }
    print("\ndetection: samples of the new regime until the change is declared (200 seeds)")
    print("| shift | median | p90 | max |")
    print("| --- | ---: | ---: | ---: |")
    for name, (before, after, back) in cases.items():
        counts = sorted(delay_to_detect(before, after, seed, back=back) for seed in range(200))
        print(f"| {name} | {counts[100]} | {counts[180]} | {counts[-1]} |")
    print(f"\nwall {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
