"""Change detection: whether a latency window's newest samples (or the attempts waiting past its
p95) are a new regime of the target, by an exact rank test against the window, and whether the
newest sample is below the range of the ones before it. Pure functions over a
:class:`~.quantiles.LatencyWindow`; :class:`~.target_stats.TargetStats` acts on their
answers."""

from __future__ import annotations

import bisect
import math
from collections.abc import Collection
from typing import Final, cast

from .quantiles import LatencyWindow

__all__ = [
    "FALSE_ALARM_RATE",
    "RETURN_ALPHA",
    "SHIFT_MIN",
    "SMALL_WINDOW_MARGIN",
    "below_range",
    "change_alpha",
    "known_samples",
    "placement_p",
    "range_margin",
    "regime_change",
    "waits_shift",
]

SHIFT_MIN = 3
"""The fewest newest samples a change of regime is tested on (and a target that changed to
slower is known from: see :func:`known_samples`)."""
FALSE_ALARM_RATE: Final = 1e-4
"""Change detection's bound on false alarms: on a steady target (its samples exchangeable: any
distribution, heavy stall tails included), a window is declared changed after a sample with
probability at most this, so at most about once per 10,000 samples. It is split evenly over the
tests made after each sample (:func:`change_alpha`); the bound is a union bound, so the rate
measured is lower (``tests/routing/test_change_detection.py``)."""
RETURN_ALPHA: Final = 0.02
"""The level of each test for a change to faster in a thin window: one whose newest change was
to slower (it holds only the few samples of the slow regime), or that holds fewer than
``2 * recent`` samples (a target measured only a few times, such as one that was slow when it
was first explored). Such a window holds too few samples for a test at
:data:`FALSE_ALARM_RATE` (no test of k new samples against m older ones can reach a level below
1 / C(m + k, k)), and a change to faster declared wrongly costs little: it forgets a few slow
samples of a target that then gets traffic, whose next samples say what it is. A change to
slower, which takes a target's traffic away, is always tested at :func:`change_alpha`. With 3
to 6 slow samples kept, 3 to 5 fast ones below all of them are a change back, when they are
also nearer (in log) the median of the regime the window left than the slow one's: within a
slow regime, its own faster samples are not a change back."""
SMALL_WINDOW_MARGIN = 1.5
"""While a window holds few older samples, "below their range"
(:attr:`~.target_stats.TargetStats.improving`, :func:`below_range`) means below by this factor."""


def change_alpha(recent: int) -> float:
    """The level of each change test: :data:`FALSE_ALARM_RATE` split over the tests made after
    a sample: for each size ``k`` of the newest samples from :data:`SHIFT_MIN` to ``recent``,
    all ``k`` beyond, and all but one (from ``SHIFT_MIN + 1`` on), each in two directions."""
    sizes = max(1, recent - SHIFT_MIN + 1)
    return FALSE_ALARM_RATE / (2 * (2 * sizes - 1))


def placement_p(n: int, beyond: int, k: int, r: int | None = None) -> float:
    """The exact probability, for ``n`` exchangeable samples (a steady target, whatever its
    distribution), that at least ``r`` (default: all; at least ``k - 1``) of the ``k`` newest
    lie among the ``beyond`` samples at one end of the window: a hypergeometric tail,
    C(beyond, k) / C(n, k) for all of them. A rank test, so the window's own tail is in the
    null: a target that stalls 10% of the time puts its newest k among its top 10% about
    0.1^k of the time, and that is what the test expects of it."""
    r = k if r is None else r
    if not 0 < r <= k <= n or r < k - 1:
        raise ValueError(f"need k - 1 <= r <= k <= n, r > 0; got r={r!r}, k={k!r}, n={n!r}")
    b = max(0, min(beyond, n))
    # C(b, k - 1) / C(n, k) as a product, then C(b, k) = C(b, k - 1) (b - k + 1) / k.
    part = k / (n - k + 1)
    for i in range(k - 1):
        part *= (b - i) / (n - i)
    if part <= 0.0:
        return 0.0
    every = part * max(0, b - k + 1) / k
    return every if r == k else every + part * (n - b)


def known_samples(window: LatencyWindow, min_samples: int) -> int:
    """Samples that make a window's target known: ``min_samples``; :data:`SHIFT_MIN` after a
    change of regime (the samples that showed it are few, and they passed the test that they
    are the new regime). After a change to slower, new samples come only from re-measuring a
    target that lost its traffic, at a cost each; after a change back to faster, waiting for
    ``min_samples`` would keep a recovered target cold (explored, its prediction blended with
    the prior) for two more re-measures before it gets traffic."""
    if window.changed and len(window) >= SHIFT_MIN:
        return SHIFT_MIN
    return min_samples


def range_margin(older: int, recent: int) -> float:
    """How far beyond the older samples' p95 (or below their p5, divided) a sample must lie
    to count as beyond their range: 1 once they are ``2 * recent``; before, their range is
    narrow and noisy (a p95 of 5 samples is about their maximum), so
    :data:`SMALL_WINDOW_MARGIN` times it."""
    return 1.0 if older >= 2 * recent else SMALL_WINDOW_MARGIN


def below_range(window: LatencyWindow, seconds: float, *, known: int, recent: int) -> bool:
    """Whether ``seconds``, the window's newest sample, is below the p5 of the samples before
    it (by :func:`range_margin`), once the window holds more than ``known`` samples."""
    n = len(window)
    if n <= known:
        return False
    margin = range_margin(n - 1, recent)
    if seconds >= window.nth(math.ceil((n - 2) * 0.05) + 1) / margin:  # a bound of that p5
        return False
    return seconds < cast(float, window.quantile_without(1, 0.05)) / margin


def regime_change(window: LatencyWindow, recent: int) -> tuple[int, bool]:
    """How many of the window's newest samples belong to a new regime (0: none), and whether
    it is slower.

    A rank test of the ``k`` newest samples against the whole window, for each ``k`` from
    :data:`SHIFT_MIN` to ``recent`` (fewer while the window holds fewer samples): they are
    a new regime when they all lie so far at one end of it (above the others: slower; below
    them: faster) that a steady target would put them there with probability at most
    :func:`change_alpha` (:func:`placement_p`: exact for any distribution of a steady
    target's samples, heavy tails included). After a change to slower, a change back to
    faster is tested at :data:`RETURN_ALPHA`. Returns the largest such ``k``: the samples
    the window keeps. Censored samples (attempts cancelled past the p95 by hedges that
    beat them, first-token deadlines missed) count as samples of their time so far, a
    lower bound of their TTFT: that can only make a change to slower harder to show, never
    easier. So a steady target is declared changed after at most :data:`FALSE_ALARM_RATE`
    of its samples (a union bound; measured lower), and a target four times slower within
    its first 3 slow samples when it had no stalls (all above all the older ones), about 6
    when 10% of the older ones were stalls above the new regime."""
    n = len(window)
    top = min(recent, n - 1)
    if top < SHIFT_MIN:
        return 0, False
    alpha = change_alpha(recent)
    thin = window.slowed or n < 2 * recent
    back = RETURN_ALPHA if thin else alpha
    newest = window.newest(top)
    left_median = window.left_median if window.slowed else None

    def left(k: int) -> float:
        """Below this, the k newest are nearer the median of the regime the window left
        than that of the older samples, in log: the bound of a likelihood ratio between
        two lognormal regimes of the same spread."""
        if left_median is None:
            return math.inf
        return math.sqrt(left_median * cast(float, window.quantile_without(k, 0.5)))

    # A cheap bound first: every test's bound lies at or beyond the median of the three
    # newest samples (they are among its k, and at most one is left out), and the test of
    # all of the most samples at a given bound has the lowest probability.
    middle = sorted(newest[-3:])[1]
    maybe_slower = placement_p(n, window.count_at_least(middle, censored_too=True), top) <= alpha
    maybe_faster = placement_p(n, window.count_at_most(middle), top) <= back
    if not (maybe_slower or maybe_faster):
        return 0, False
    ordered: list[float] = [newest[-1]]
    found, slower = 0, False
    for k in range(2, top + 1):
        bisect.insort(ordered, newest[-k])
        if k < SHIFT_MIN:
            continue
        # All k beyond, or all but one (a fast answer among slow ones, say): the lowest
        # (the second lowest) of the k newest bounds the end of the window they lie in.
        # Older censored samples below that bound may be above it: counted as beyond.
        for r, low, high in ((k, ordered[0], ordered[-1]), (k - 1, ordered[1], ordered[-2])):
            if r < SHIFT_MIN:
                continue
            if maybe_slower:
                beyond = window.count_at_least(low, censored_too=True)
                if placement_p(n, beyond, k, r) <= alpha:
                    # From the oldest of them that is beyond on: the one that is not may
                    # be the old regime's.
                    found = next(i for i in range(k, 0, -1) if newest[-i] >= low)
                    slower = True
                    continue
            if maybe_faster and high <= left(k):
                if placement_p(n, window.count_at_most(high), k, r) <= back:
                    found = next(i for i in range(k, 0, -1) if newest[-i] <= high)
                    slower = False
    return found, slower


def waits_shift(
    window: LatencyWindow, starts: Collection[float], now: float, q: float, recent: int
) -> float:
    """The ``q``-quantile of the attempts now waiting (started at ``starts``) past the
    window's p95, each a censored sample of its time so far, when the longest ``k`` of them
    show a change to slower by :func:`regime_change`'s test, else 0. The test is made as if
    they were the ``k`` newest samples, and its level divided by the C(w, k) ways to pick
    ``k`` of the ``w`` attempts waiting (a union bound: the longest waits are picked, not the
    newest), so a steady target shows such a change at most :func:`change_alpha` of the time.
    This is how a target that got slow shows within about one p95, before any of its slow
    attempts ends: three of three attempts waiting (four of eight) past every sample of a
    window of 200 steady ones are a change, and become so while they wait; a stalled attempt
    of a target that stalls now and then is not, unless its stalls outlast what its window
    says they take."""
    p95 = cast(float, window.quantile(0.95))
    overdue = sorted((now - t for t in starts if now - t > p95), reverse=True)
    if len(overdue) < SHIFT_MIN:
        return 0.0
    alpha = change_alpha(recent)
    waiting, n = len(starts), len(window) + len(overdue)
    found = 0
    for k in range(SHIFT_MIN, len(overdue) + 1):
        low = overdue[k - 1]
        beyond = window.count_at_least(low, censored_too=True)
        beyond += sum(1 for w in overdue if w >= low)
        if placement_p(n, beyond, k) * math.comb(waiting, k) <= alpha:
            found = k
    if not found:
        return 0.0
    values = sorted(overdue[:found])
    position = (len(values) - 1) * q
    index = math.floor(position)
    upper = values[min(index + 1, len(values) - 1)]
    return values[index] + (upper - values[index]) * (position - index)
