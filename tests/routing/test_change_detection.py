"""Issue 26 item 2: change detection with a known false-alarm rate, measured.

Seeded samples and an injectable clock, no server, no sleep. Steady targets with heavy stall
tails (the issue's A: median 250 ms, 10% of requests stalling 1.5-3 s more, 6-12x the median)
must rarely be declared changed: :data:`~llmroute.routing.stats.FALSE_ALARM_RATE` per sample and
window at most (a union bound of exact rank tests); counted here over 20,000 samples per target,
with and without hedges cancelling (censoring) the stalls. A real shift (four times slower, or
four times faster again) must still be seen within a few samples, about one p95 at the traffic a
target that serves a route gets. The figures are in docs/routing.md and docs/benchmarks.md.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from llmroute.routing.stats import (
    FALSE_ALARM_RATE,
    RETURN_ALPHA,
    SHIFT_MIN,
    StatsSettings,
    TargetStats,
    change_alpha,
    placement_p,
)

from ..clock import FakeClock

STEADY_SAMPLES = 20_000
SPACING = 0.05  # seconds between samples: 20 a second, a target serving concurrency 8


def stalling(median: float, sigma: float, stall: float, low: float, high: float) -> Sampler:
    def draw(rng: random.Random) -> float:
        value = rng.lognormvariate(math.log(median), sigma)
        if rng.random() < stall:
            value += rng.uniform(low, high)
        return value

    return draw


Sampler = Callable[[random.Random], float]
A_HEAVY = stalling(0.25, 0.2, 0.10, 1.5, 3.0)  # the A: 10% stalls at 6-12x the median
A_HEAVY_TIGHT = stalling(0.25, 0.1, 0.10, 1.5, 3.0)
B_STEADY = stalling(0.40, 0.2, 0.01, 1.0, 1.0)
C_STEADY = stalling(0.70, 0.05, 0.0, 0.0, 0.0)


@dataclass
class Fed:
    target: TargetStats
    clock: FakeClock
    alarms: int = 0
    """Changes declared in the window of all prompt classes (the class window sees the same)."""
    slower: int = 0
    """Of those, changes to slower: the ones that take a target's traffic away."""
    samples: int = 0


def feed(
    sampler: Sampler,
    count: int,
    seed: int,
    *,
    hedge: float | None = None,
    fed: Fed | None = None,
) -> Fed:
    """``count`` samples of ``sampler``, ``SPACING`` apart. With ``hedge`` (the hedge target's
    TTFT), an attempt with no first token by the target's live p95 is hedged, and when the hedge
    answers first this attempt is cancelled: recorded as censored at that moment, as the engine
    does."""
    if fed is None:
        clock = FakeClock()
        fed = Fed(TargetStats("a", StatsSettings(), clock), clock)
    rng = random.Random(seed)
    target, clock = fed.target, fed.clock
    for _ in range(count):
        clock.advance(SPACING)
        value = sampler(rng)
        before, window = target.shifts, target._ttft
        if hedge is not None:
            delay = target.predict(0.95, 100)
            if value > delay + hedge:
                target.record_censored(delay + hedge, 100)
            else:
                target.record_ttft(value, 100)
        else:
            target.record_ttft(value, 100)
        if target.shifts > before:
            fed.alarms += 1
            fed.slower += window.slowed
        fed.samples += 1
    return fed


def test_placement_p_is_the_hypergeometric_tail() -> None:
    assert placement_p(10, 3, 3) == pytest.approx(1 / math.comb(10, 3))
    assert placement_p(10, 10, 3) == pytest.approx(1.0)
    assert placement_p(100, 10, 3) == pytest.approx(10 * 9 * 8 / (100 * 99 * 98))
    # at least 3 of 4 among 5 of 20
    tail = (math.comb(5, 3) * math.comb(15, 1) + math.comb(5, 4)) / math.comb(20, 4)
    assert placement_p(20, 5, 4, 3) == pytest.approx(tail)
    with pytest.raises(ValueError, match="r <= k <= n"):
        placement_p(3, 1, 4)


def test_a_rank_test_is_exact_on_any_steady_distribution() -> None:
    # The chance that the 3 newest of 40 exchangeable samples are the 3 largest is what
    # placement_p says, whatever the distribution: checked on the heavy-tailed A.
    rng = random.Random(1)
    trials, hits = 20_000, 0
    for _ in range(trials):
        values = [A_HEAVY(rng) for _ in range(40)]
        hits += min(values[-3:]) > max(values[:-3])
    expected = placement_p(40, 3, 3)  # 1 / 9880
    assert hits <= 3 * expected * trials + 3


STEADY = {
    "A heavy tails": (A_HEAVY, None),
    "A heavy tails, hedged at its p95": (A_HEAVY, 0.4),
    "B steady": (B_STEADY, None),
    "C steady": (C_STEADY, None),
}


@pytest.mark.parametrize("name", list(STEADY))
def test_steady_targets_are_rarely_declared_changed(name: str) -> None:
    sampler, hedge = STEADY[name]
    fed = feed(sampler, STEADY_SAMPLES, seed=1, hedge=hedge)
    # The bound: FALSE_ALARM_RATE per sample and window, two in 20,000 samples. Changes to
    # faster in a thin window (RETURN_ALPHA) come on top: a window's first 20 samples, or
    # the few kept after a change, each a cheap correction (docs/routing.md).
    bound = STEADY_SAMPLES * FALSE_ALARM_RATE
    assert fed.slower <= bound / 2, name
    assert fed.alarms <= 3 * bound, name
    # The regression: the fast target written off as "changed to slower" and left
    # there. Whatever alarms there were, at the end it is predicted as what it is.
    rng = random.Random(9)
    median = statistics.median(sampler(rng) for _ in range(999))
    assert fed.target.predict(0.5, 100) == pytest.approx(median, rel=0.15), name
    assert not fed.target._ttft.slowed


def test_a_fresh_heavy_tailed_target_is_not_written_off_by_its_first_stalls() -> None:
    # The regression: early stalls on A read as "changed to slower" (before, in 500
    # fresh targets' first 200 samples: 55 changes to slower, 30 still "slowed" at the end; 76
    # and 45 when hedges cancelled the stalls). Here over 100 fresh targets.
    slower = written_off = 0
    for seed in range(100):
        fed = feed(A_HEAVY, 200, seed, hedge=0.4)
        slower += fed.slower
        written_off += fed.target._ttft.slowed
    assert slower <= 2  # measured: 0 here, 3 in 500 (docs/benchmarks-history.md, change detection)
    assert written_off == 0


def samples_to_detect(
    before: Sampler, after: Sampler, seed: int, *, history: int = 200, slowed_first: bool = False
) -> int | None:
    """Samples of the new regime until a change is declared (``None``: not within 30)."""
    fed = feed(before, history, seed)
    target = fed.target
    if slowed_first:
        assert target._ttft.slowed
    rng = random.Random(seed + 1)
    shifts = target.shifts
    for count in range(1, 31):
        fed.clock.advance(SPACING)
        target.record_ttft(after(rng), 100)
        if target.shifts > shifts:
            return count
    return None


def test_a_target_four_times_slower_is_seen_within_three_to_six_samples() -> None:
    plain_slow = stalling(1.0, 0.2, 0.0, 0.0, 0.0)
    plain = [samples_to_detect(stalling(0.25, 0.2, 0.0, 0, 0), plain_slow, s) for s in range(50)]
    assert all(n is not None for n in plain)
    counts = sorted(n for n in plain if n is not None)
    assert counts[-1] <= 4  # above every older sample: 3 (4 when one of them is a tail sample)
    # With 10% of the older samples stalls above the new regime: about six.
    heavy = [samples_to_detect(A_HEAVY, stalling(1.0, 0.2, 0.1, 1.5, 3.0), s) for s in range(50)]
    assert all(n is not None for n in heavy)
    counts = sorted(n for n in heavy if n is not None)
    assert counts[len(counts) // 2] <= 7 and counts[-1] <= 12


def test_a_target_four_times_faster_again_is_seen_within_a_few_samples() -> None:
    fast = stalling(0.25, 0.2, 0.0, 0.0, 0.0)
    slow = stalling(1.0, 0.2, 0.0, 0.0, 0.0)
    counts = []
    for seed in range(50):
        fed = feed(fast, 200, seed)
        fed = feed(slow, 4, seed + 1000, fed=fed)  # a change to slower, then a few slow ones
        assert fed.target._ttft.slowed
        feed(slow, 3, seed + 2000, fed=fed)
        rng, target = random.Random(seed + 3000), fed.target
        shifts = target.shifts
        for count in range(1, 31):
            fed.clock.advance(10.0)  # re-measured every 10 s: the slow regime is thin
            target.record_ttft(fast(rng), 100)
            if target.shifts > shifts:
                counts.append(count)
                assert not target._ttft.slowed
                break
    assert len(counts) == 50
    assert sorted(counts)[25] <= 3 and max(counts) <= 5  # 3 fast re-measures, at most 5


def test_a_change_within_one_p95_by_the_attempts_waiting() -> None:
    # Eight attempts in flight on a target that got four times slower: before any ends, the
    # prediction says so once four of them wait past every sample of its window.
    fed = feed(stalling(0.25, 0.2, 0.0, 0.0, 0.0), 200, 7)
    target, clock = fed.target, fed.clock
    p95 = target.predict(0.95, 100)
    handles = []
    for _ in range(8):  # one every 50 ms, each slow now
        handles.append(target.waiting())
        clock.advance(SPACING)
    waited = 0.0
    while target.predict(0.95, 100) < 2 * p95 and waited < 5.0:
        clock.advance(0.01)
        waited += 0.01
    assert waited + 8 * SPACING <= 1.6 * p95 + 8 * SPACING  # within about one p95 of the last
    for handle in handles:
        target.done_waiting(handle)


def test_stalls_waiting_on_a_steady_heavy_tailed_target_are_no_change() -> None:
    fed = feed(A_HEAVY, 2000, 11)
    target, clock = fed.target, fed.clock
    p95 = target.predict(0.95, 100)
    handles = [target.waiting() for _ in range(3)]  # three stalls at once
    clock.advance(2.5)  # as long as its stalls usually take
    assert target.predict(0.95, 100) == pytest.approx(p95, rel=0.25)
    for handle in handles:
        target.done_waiting(handle)


def test_the_tuning_is_in_one_place() -> None:
    recent = StatsSettings().recent
    tests = 2 * (2 * (recent - SHIFT_MIN + 1) - 1)
    assert change_alpha(recent) * tests == pytest.approx(FALSE_ALARM_RATE)
    assert 0 < RETURN_ALPHA < 0.05
