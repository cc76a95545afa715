"""Latency windows and their quantile maths: sliding windows of samples (censored ones too) and
of outcomes; quantiles blended with a lognormal prior while a window is thin; lower confidence
bounds of a quantile; when a hedge would win; whether a target fails beyond a share. Pure
bookkeeping: no I/O, no tasks; time comes from an injectable ``clock``."""

from __future__ import annotations

import bisect
import functools
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from statistics import NormalDist
from typing import Final, cast

from sortedcontainers import SortedList

__all__ = [
    "BEYOND_SAMPLES",
    "FAILING_ALPHA",
    "HEDGE_WIN_SHARE",
    "PRIOR_SIGMA",
    "RANK_CONFIDENCE",
    "LatencyWindow",
    "OutcomeWindow",
    "blend",
    "fails_beyond",
    "fresh_lower_bound",
    "hedge_wait",
    "lower_bound_rank",
    "winning_delay",
]

RANK_CONFIDENCE: Final = 0.9
"""While a window holds fewer than ``1 / (1 - q)`` samples (20 for the p95), a target is ranked
by a lower bound of its ``q``-quantile at this confidence (:func:`lower_bound_rank`), not by its
estimate: so few samples put the estimate at their largest one or two, and one early stall of
a steady target (B's 1% of 1 s in ``benchmarks/routing.py``) would rank it below a slower one
until twenty samples had come, which, out of traffic, it waits for. The bound is optimistic by
design: a target is ranked as good as its samples allow with this confidence until it has
enough of them (each as a first choice, at no extra request), and a target with a real tail
shows it within about twenty (the p95 of a target stalling on 10% of its requests is then in
its stalls)."""
HEDGE_WIN_SHARE: Final = 0.5
"""A hedge on a quantile (``hedge_after = "p95"``) waits, past that quantile, until at least
this share of the samples beyond the wait so far are beyond it by the hedge target's median
too (:func:`winning_delay`): until a hedge started then would answer first at least as often
as not. Beyond a target's thin lognormal tail (B at its p95 in steady weather) a hedge almost
always lost: it cost a request and saved nothing."""


BEYOND_SAMPLES: Final = 1.05
"""A hedge delay at or past a target's largest sample waits this many times it
(:func:`hedge_wait`)."""
FAILING_ALPHA: Final = 0.01
"""The level of the test that a target fails on more than ``1 - q`` of its attempts
(:func:`fails_beyond`), so that its ``q``-quantile of a first token is never: a target that
fails on at most that share is taken for one that fails beyond it at most this often per test."""


@functools.lru_cache(maxsize=4096)
def fails_beyond(attempts: int, failures: int, share: float, alpha: float = FAILING_ALPHA) -> bool:
    """Whether ``failures`` of ``attempts`` (each independently failing with probability at
    most ``share``) show that it fails more often than that: an exact binomial test,
    P(Binomial(attempts, share) >= failures) <= ``alpha``."""
    if failures <= share * attempts:
        return False
    if share <= 0.0:
        return True
    log_p, log_q, n = math.log(share), math.log1p(-share), attempts
    log_n = math.lgamma(n + 1)
    tail = 0.0
    for k in range(failures, n + 1):  # in logs: the counts of a long window overflow floats
        log_pmf = log_n - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p
        tail += math.exp(log_pmf + (n - k) * log_q)
        if tail > alpha:
            return False
    return True


@functools.lru_cache(maxsize=4096)
def lower_bound_rank(n: int, q: float, confidence: float = RANK_CONFIDENCE) -> int:
    """The rank ``r`` (1-based) of the order statistic of ``n`` exchangeable samples that is
    below their distribution's ``q``-quantile with probability at least ``confidence``: the
    largest ``r`` with P(Binomial(n, q) >= r) >= ``confidence`` (at least r samples fall below
    the quantile), whatever the distribution; 1 when none is (then the smallest sample)."""
    if n < 1 or not 0.0 < q < 1.0:
        raise ValueError(f"need n >= 1 and 0 < q < 1, got n={n!r}, q={q!r}")
    tail = 0.0
    for r in range(n, 0, -1):
        tail += math.comb(n, r) * q**r * (1.0 - q) ** (n - r)
        if tail >= confidence:
            return r
    return 1


def winning_delay(
    values: Sequence[float],
    floor: float,
    backup: float,
    censored: Sequence[float] = (),
    share: float = HEDGE_WIN_SHARE,
) -> float:
    """The earliest wait ``d`` >= ``floor`` (``floor`` itself or one of the sorted ``values``
    above it) after which a hedge answering ``backup`` seconds later would beat the first
    attempt at least ``share`` of the time: of the samples beyond ``d``, at least that share
    are beyond ``d + backup`` too. A ``censored`` sample (also among ``values``: an attempt
    abandoned then, its TTFT unknown beyond it) that is beyond ``d`` counts as beyond
    ``d + backup``. The largest sample when none is (a hedge then waits for what the samples
    never showed: a change, or a stall beyond them); ``floor`` when no sample is beyond it."""
    n, m = len(values), len(censored)

    def right(seq: Sequence[float], t: float) -> int:
        own = getattr(seq, "bisect_right", None)  # a SortedList's own: O(log n)
        return own(t) if own is not None else bisect.bisect_right(seq, t)

    d = floor
    for i in range(right(values, floor), n + 1):
        later = n - right(values, d)
        if later == 0:
            return d
        unknown = m - right(censored, d) - (m - right(censored, d + backup))
        if n - right(values, d + backup) + unknown >= share * later or i == n:
            return d
        d = values[i]
    return d


PRIOR_SIGMA: Final = 0.5
"""The log-space spread of the lognormal TTFT assumed for a target without data."""

_NORMAL = NormalDist()


def _interpolated(nth: Callable[[int], float], count: int, q: float) -> float:
    """The ``q``-quantile of ``count`` values whose ``i``-th smallest (0-based) is ``nth(i)``,
    interpolating linearly between closest ranks (as :meth:`LatencyWindow.quantile`)."""
    position = (count - 1) * q
    index = math.floor(position)
    low = nth(index)
    fraction = position - index
    if fraction == 0.0:
        return low
    high = nth(index + 1)
    return min(max(low + (high - low) * fraction, low), high)


class LatencyWindow:
    """Samples of one latency over the last ``window`` seconds, at most ``max_samples`` of them.

    ``add`` costs O(log n). Samples older than ``window`` (or beyond the count, oldest first) are
    dropped lazily, on every add and query.
    """

    __slots__ = (
        "_censored",
        "_clock",
        "_max_samples",
        "_samples",
        "_seeded",
        "_values",
        "_window",
        "changed",
        "left_median",
        "slowed",
    )

    def __init__(
        self,
        window: float = 300.0,
        max_samples: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not window > 0:
            raise ValueError(f"window must be positive, got {window!r}")
        if max_samples < 1:
            raise ValueError(f"max_samples must be at least 1, got {max_samples!r}")
        self._window = float(window)
        self._max_samples = max_samples
        self._clock = clock
        self._values = SortedList()
        self._censored = SortedList()
        self._samples: deque[tuple[float, float, bool]] = deque()
        self.slowed = False
        """Kept by ``TargetStats``: the newest change of regime it saw in this window was to
        slower, so the few samples it kept are enough to know the target is slow."""
        self.changed = False
        """Kept by ``TargetStats``: a change of regime (either way) was declared in this window,
        so the samples it kept passed a test that they are the target's new regime."""
        self.left_median: float | None = None
        """Kept by ``TargetStats``: after a change to slower, the median of the regime the
        window left; a change back is to samples nearer that than the slow regime's median."""
        self._seeded = 0  # the oldest samples that came from a stats file (:meth:`mark_seeded`)

    def _expire(self, now: float) -> None:
        cutoff = now - self._window
        samples = self._samples
        while samples and samples[0][0] <= cutoff:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        _, value, censored = self._samples.popleft()
        self._seeded = max(0, self._seeded - 1)
        self._values.remove(value)
        if censored:
            self._censored.remove(value)

    def add(self, value: float, *, censored: bool = False) -> None:
        """Record one sample, taken now. It must be a finite number. ``censored``: only known
        to be at least ``value`` (an attempt cancelled before its first token)."""
        if not math.isfinite(value):
            raise ValueError(f"a latency sample must be finite, got {value!r}")
        value = float(value)
        now = self._clock()
        self._expire(now)
        if len(self._samples) >= self._max_samples or self._seeded:
            self._drop_oldest()  # beyond the count, or a sample from a stats file it replaces
        self._samples.append((now, value, censored))
        self._values.add(value)
        if censored:
            self._censored.add(value)

    def _quantile_and_count(self, q: float) -> tuple[float | None, int]:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be in [0, 1], got {q!r}")
        self._expire(self._clock())
        values = self._values
        n = len(values)
        if n == 0:
            return None, 0
        position = (n - 1) * q
        index = math.floor(position)
        low = cast(float, values[index])
        fraction = position - index
        if fraction == 0.0:
            return low, n
        high = cast(float, values[index + 1])
        return min(max(low + (high - low) * fraction, low), high), n

    def quantile_with(self, extra: list[float], q: float) -> float | None:
        """The ``q``-quantile of the live samples together with ``extra`` values (a few).

        Costs O(k log n) for k extra values; the same interpolation as :meth:`quantile`.
        """
        if not extra:
            return self.quantile(q)
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be in [0, 1], got {q!r}")
        self._expire(self._clock())
        values, extra = self._values, sorted(extra)
        total = len(values) + len(extra)

        def nth(i: int) -> float:
            # The i-th smallest of the union is among values[i - j] and extra[j], j <= len(extra).
            n, k = len(values), len(extra)
            candidates = [extra[j] for j in range(min(k, i + 1))]
            candidates += [cast(float, values[i - j]) for j in range(k + 1) if 0 <= i - j < n]
            for x in sorted(candidates):
                if values.bisect_right(x) + bisect.bisect_right(extra, x) >= i + 1:
                    return x
            raise AssertionError("unreachable")  # pragma: no cover

        return _interpolated(nth, total, q)

    def quantile(self, q: float) -> float | None:
        """The ``q``-quantile of the live samples, interpolating linearly between closest ranks.

        ``None`` when there are none.
        """
        return self._quantile_and_count(q)[0]

    def mean(self) -> float | None:
        """The mean of the live samples, or ``None`` when there are none."""
        self._expire(self._clock())
        if not self._values:
            return None
        return math.fsum(self._values) / len(self._values)

    def newest_at(self) -> float | None:
        """Clock time of the newest live sample, or ``None`` when there are none."""
        self._expire(self._clock())
        return self._samples[-1][0] if self._samples else None

    def newest(self, k: int) -> list[float]:
        """The values of the ``k`` newest live samples (fewer if there are fewer), oldest first."""
        self._expire(self._clock())
        samples = self._samples
        start = max(0, len(samples) - k)
        return [samples[i][1] for i in range(start, len(samples))]

    def quantile_without(self, newest: int, q: float) -> float | None:
        """The ``q``-quantile of the live samples other than the ``newest`` ones (``None`` if
        there are no others): what the window said before its latest samples came."""
        self._expire(self._clock())
        recent = sorted(self.newest(newest))
        values, n = self._values, len(self._values) - len(recent)
        if n <= 0:
            return None

        def nth(i: int) -> float:
            # The i-th smallest of values minus recent is values[i + j] for some j <= k.
            for j in range(len(recent) + 1):
                x = cast(float, values[i + j])
                if values.bisect_right(x) - bisect.bisect_right(recent, x) >= i + 1:
                    return x
            raise AssertionError("unreachable")  # pragma: no cover

        return _interpolated(nth, n, q)

    def order_statistic(self, rank: int) -> float:
        """The ``rank``-th smallest live sample (1-based; ``IndexError`` out of range)."""
        self._expire(self._clock())
        if not 1 <= rank <= len(self._values):
            raise IndexError(f"rank {rank} of {len(self._values)} samples")
        return cast(float, self._values[rank - 1])

    def sorted_values(self) -> Sequence[float]:
        """The live samples, smallest first (a view: do not keep it across adds)."""
        self._expire(self._clock())
        return cast(Sequence[float], self._values)

    def sorted_censored(self) -> Sequence[float]:
        """The live censored samples (also in :meth:`sorted_values`), smallest first."""
        self._expire(self._clock())
        return cast(Sequence[float], self._censored)

    def count_at_least(self, value: float, *, censored_too: bool = False) -> int:
        """How many live samples are ``value`` or more (O(log n); expired ones must be gone:
        call after an add or a query). ``censored_too``: also the censored samples below
        ``value``, whose TTFT, only known to be above what they recorded, may be more."""
        count = len(self._values) - self._values.bisect_left(value)
        if censored_too:
            count += self._censored.bisect_left(value)
        return count

    def count_at_most(self, value: float) -> int:
        """How many live samples are ``value`` or less (as :meth:`count_at_least`)."""
        return self._values.bisect_right(value)

    def nth(self, index: int) -> float:
        """The ``index``-th smallest live sample (0 is the smallest; clamped to the range)."""
        values = self._values
        return cast(float, values[max(0, min(index, len(values) - 1))])

    def keep_newest(self, k: int) -> None:
        """Forget every live sample but the ``k`` newest (a change of regime: the older ones
        describe a target that no longer exists)."""
        while len(self._samples) > k:
            self._drop_oldest()

    def __len__(self) -> int:
        self._expire(self._clock())
        return len(self._samples)

    def timed(self) -> list[tuple[float, float, bool]]:
        """The live samples as ``(clock time, value, censored)``, oldest first."""
        self._expire(self._clock())
        return list(self._samples)

    def mark_seeded(self) -> None:
        """Count every sample held now as older evidence (read from a stats file, before any
        live sample): each sample added from now on replaces the oldest of them, so after as
        many live samples as there were seeded ones, none is left."""
        self._expire(self._clock())
        self._seeded = len(self._samples)

    @property
    def seeded(self) -> int:
        """Samples from a stats file still held (:meth:`mark_seeded`)."""
        self._expire(self._clock())
        return self._seeded


class OutcomeWindow:
    """Counts of outcomes over the last ``window`` seconds, in ``buckets`` time buckets.

    Memory is bounded by the bucket count; an outcome counts for at least ``window`` seconds and
    less than ``window`` plus one bucket (``window / buckets``).
    """

    __slots__ = ("_buckets", "_clock", "_total", "_totals", "_width", "_window")

    def __init__(
        self,
        window: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        buckets: int = 60,
    ) -> None:
        if not window > 0:
            raise ValueError(f"window must be positive, got {window!r}")
        if buckets < 1:
            raise ValueError(f"buckets must be at least 1, got {buckets!r}")
        self._window = float(window)
        self._width = self._window / buckets
        self._clock = clock
        self._buckets: deque[tuple[int, dict[str, int]]] = deque()
        self._totals: dict[str, int] = {}
        self._total = 0

    def _expire(self, now: float) -> None:
        first_kept = math.floor((now - self._window) / self._width)
        buckets = self._buckets
        while buckets and buckets[0][0] < first_kept:
            for outcome, count in buckets.popleft()[1].items():
                left = self._totals[outcome] - count
                if left:
                    self._totals[outcome] = left
                else:
                    del self._totals[outcome]
                self._total -= count

    def add(self, outcome: str) -> None:
        """Count one outcome, now."""
        now = self._clock()
        self._expire(now)
        index = math.floor(now / self._width)
        if self._buckets and self._buckets[-1][0] >= index:
            counts = self._buckets[-1][1]
        else:
            counts = {}
            self._buckets.append((index, counts))
        counts[outcome] = counts.get(outcome, 0) + 1
        self._totals[outcome] = self._totals.get(outcome, 0) + 1
        self._total += 1

    def count(self, outcome: str | None = None) -> int:
        """How many of ``outcome`` are in the window; all outcomes when it is ``None``."""
        self._expire(self._clock())
        return self._total if outcome is None else self._totals.get(outcome, 0)

    def rate(self, outcome: str) -> float:
        """The share of ``outcome`` among all outcomes in the window; 0.0 when there are none."""
        self._expire(self._clock())
        return self._totals.get(outcome, 0) / self._total if self._total else 0.0

    def counts(self) -> dict[str, int]:
        """Each outcome seen in the window, with its count."""
        self._expire(self._clock())
        return dict(self._totals)


def blend(
    window: LatencyWindow, q: float, prior_median: float, *, known: int, prior_weight: float
) -> float:
    """The window's ``q``-quantile, blended with a lognormal prior (median ``prior_median``,
    log spread :data:`PRIOR_SIGMA`) weighted as ``prior_weight`` samples while the window holds
    fewer than ``known``; the prior alone while it holds none, its own quantile from ``known``
    on (a prior would only bias a steady estimate)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be strictly between 0 and 1, got {q!r}")
    prior = prior_median * math.exp(_NORMAL.inv_cdf(q) * PRIOR_SIGMA)
    observed, n = window._quantile_and_count(q)
    if observed is None:
        return prior
    if n >= known:
        return observed  # enough data: a prior would only bias a steady estimate
    return (n * observed + prior_weight * prior) / (n + prior_weight)


def fresh_lower_bound(
    window: LatencyWindow, q: float, *, known: int, predicted: Callable[[], float]
) -> float | None:
    """The window's lower confidence bound of its ``q``-quantile (:func:`lower_bound_rank`)
    while it is a fresh one, known (``known`` samples) but holding fewer than ``1 / (1 - q)``
    samples, and its prediction (``predicted()``, raised by attempts waiting) is not above its
    own quantile; else ``None``. Not in a window that was declared changed: its few samples
    passed a test that they are the new regime, and a target with a stall tail (A in
    ``benchmarks/routing.py``'s steady weather) re-measured after a change would otherwise
    rank by its body again, stalls already among its samples, and be the first choice until
    twenty samples came (timed, on a loaded machine, such windows came every few seconds and
    cost steady weather's p95 up to 1.5x)."""
    n = len(window)
    if window.changed or n < known or n * (1.0 - q) >= 1.0:
        return None
    own = window.quantile(q)
    if own is None or predicted() > own:  # raised by attempts waiting
        return None
    return window.order_statistic(lower_bound_rank(n, q))


def hedge_wait(window: LatencyWindow, q: float, backup: float, bound: float | None) -> float:
    """When to hedge an attempt that has no first token yet, from a known window: at its
    ``q``-quantile, or later, once a hedge answering ``backup`` seconds after it would win at
    least :data:`HEDGE_WIN_SHARE` of the time (:func:`winning_delay` over the window's
    samples). The quantile is the sample at or just below its rank, not one interpolated
    towards the next: with a few stalls in a small window the next is a stall, and a point
    between is a wait no answer ever took. From ``bound`` when it is lower (the target is
    ranked by that lower bound of the quantile: hedged from it too, not from a stall above
    it). A delay at or past the largest sample is :data:`BEYOND_SAMPLES` times it: no answer
    ever took longer, so a hedge then only insures against a stall, and at the largest sample
    itself it would race a steady target's own answer (C in the long/short weather, whose
    prompts always take 0.7 s)."""
    n = len(window)
    floor = window.order_statistic(math.floor((n - 1) * q) + 1)
    if bound is not None:
        floor = min(floor, bound)
    values = window.sorted_values()
    delay = winning_delay(values, floor, backup, window.sorted_censored())
    if delay >= values[-1]:  # no answer took longer: insurance against a stall only
        delay *= BEYOND_SAMPLES
    return delay
