"""Live per-target statistics: TTFT by prompt length, stream speed, outcomes, with priors.

Everything here is pure bookkeeping over sliding time windows: no I/O, no tasks. Time comes from
an injectable ``clock`` (``time.monotonic`` by default) so the behaviour is tested without sleeping.

With the journal on (``LiveStats(journal=True)``), every recorded sample is also kept as a plain
:data:`SampleEvent` in a bounded outbox, which :meth:`LiveStats.drain` takes, so that a fleet of
instances can exchange samples (``llmroute.routing.shared``); :meth:`LiveStats.apply` records
another instance's events without journaling them again. Prediction stays local.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, Final, Literal, TypeAlias, cast

from sortedcontainers import SortedList

from .tokens import TokenCounts

__all__ = [
    "BEYOND_SAMPLES",
    "CANCELLED",
    "ERROR",
    "FAILING_ALPHA",
    "FALSE_ALARM_RATE",
    "HEDGE_WIN_SHARE",
    "INTERRUPTED",
    "IN_FLIGHT_HISTORY",
    "IN_FLIGHT_HISTORY_MAX",
    "OK",
    "OUTBOX_MAXLEN",
    "OUTCOMES",
    "PRIOR_SIGMA",
    "RANK_CONFIDENCE",
    "RATE_LIMITED",
    "RETURN_ALPHA",
    "SAMPLE_KINDS",
    "STALL_STREAM_GAPS",
    "TIMEOUT",
    "ClassSnapshot",
    "LatencyWindow",
    "LiveStats",
    "Outcome",
    "OutcomeWindow",
    "SampleEvent",
    "SampleJournal",
    "ServerMetrics",
    "StatsReport",
    "StatsSettings",
    "TargetSnapshot",
    "TargetStats",
    "change_alpha",
    "class_label",
    "estimate_prompt_tokens",
    "fails_beyond",
    "first_token_deadline",
    "lower_bound_rank",
    "placement_p",
    "prompt_class",
    "stall_deadline",
    "stream_stall_deadline",
    "winning_delay",
]

IN_FLIGHT_HISTORY: Final = 60.0
"""Seconds of in-flight counts each target remembers, to add the requests sent since a
``/metrics`` reading was taken (readings older than that no longer count for load)."""
IN_FLIGHT_HISTORY_MAX: Final = 100_000
"""At most this many changes of the in-flight count are remembered per target."""

STALL_MULTIPLE = 4.0
"""The deadline between chunks is this many times a target's p99 longest pause per stream."""
STALL_FLOOR = 2.0
"""Seconds: the deadline between chunks is never shorter."""
STALL_PRIOR = 10.0
"""Seconds: the deadline between chunks of a target with too few streams measured."""


STALL_STREAM_GAPS = 4
"""Pauses between chunks a stream must have shown before its own deadline rule applies (while
its target has too few streams measured for :func:`stall_deadline`)."""
STALL_STREAM_MULTIPLE = 8.0
"""A stream's own deadline between chunks is this many times its longest pause so far."""
STALL_STREAM_FLOOR = 4.0
"""Seconds: a stream's own deadline between chunks is never shorter. Above the pauses seen
mid-answer from vendors under load and from a self-hosted server that prefills other requests
between decode steps (chunked prefill: well under a second a step), which are 1 to 3 s at worst."""


def stream_stall_deadline(
    longest_gap: float,
    first_token: float | None,
    *,
    prior: float,
    multiple: float = STALL_STREAM_MULTIPLE,
    floor: float = STALL_STREAM_FLOOR,
) -> float:
    """Seconds a stream whose target has no live pause statistics may send nothing, once it
    has shown :data:`STALL_STREAM_GAPS` pauses: ``multiple`` times its longest pause so far, at
    least ``floor`` and at least its own time to first token (a server that prefilled this
    prompt that long may pause as long to prefill another), at most ``prior`` (the deadline it
    had: the rule only shortens it)."""
    return min(prior, max(floor, multiple * longest_gap, first_token or 0.0))


def stall_deadline(
    gap_p99: float | None,
    *,
    cap: float,
    multiple: float = STALL_MULTIPLE,
    floor: float = STALL_FLOOR,
    prior: float = STALL_PRIOR,
) -> float:
    """Seconds a stream may send nothing before it counts as stalled: ``multiple`` times the
    target's p99 longest pause between chunks, at least ``floor``, at most ``cap``; ``prior``
    (capped) while there is no such statistic."""
    if gap_p99 is None:
        return min(prior, cap)
    return min(cap, max(floor, multiple * gap_p99))


EXPLORATIONS_KEPT = 16
"""The newest explorations of a target kept, for :meth:`TargetStats.unanswered_explorations`."""
SHIFT_MIN = 3
"""The fewest newest samples a change of regime is tested on (and a target that changed to
slower is known from: see :meth:`TargetStats.known`)."""
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
FAILING_RANK: Final = 1e6
"""Seconds added to the rank of a target that fails too often (:meth:`TargetStats.failing`):
behind every target that does not, in the order of their own quantiles."""
SMALL_WINDOW_MARGIN = 1.5
"""While a window holds few older samples, "below their range" (:attr:`TargetStats.improving`)
means below by this factor."""


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
(:meth:`TargetStats.hedge_delay`)."""
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


FIRST_TOKEN_MULTIPLE = 4.0
"""The live first-token deadline is this many times the target's p99 TTFT for the prompt's
length class."""
FIRST_TOKEN_FLOOR = 5.0
"""Seconds: the live first-token deadline is never shorter."""


def first_token_deadline(
    ttft_p99: float | None,
    *,
    cap: float,
    multiple: float = FIRST_TOKEN_MULTIPLE,
    floor: float = FIRST_TOKEN_FLOOR,
) -> float:
    """Seconds an attempt may wait for its first token: ``multiple`` times the target's live
    p99 TTFT for the prompt's class, at least ``floor``, at most ``cap`` (the route's
    ``first_token_timeout``); ``cap`` itself while the class has too few samples."""
    if ttft_p99 is None:
        return cap
    return min(cap, max(floor, multiple * ttft_p99))


Outcome = Literal["ok", "error", "timeout", "rate_limited", "cancelled", "interrupted"]

OK: Final = "ok"
ERROR: Final = "error"  # connection errors, 5xx, malformed responses
TIMEOUT: Final = "timeout"  # no first token by the deadline, read timeouts
RATE_LIMITED: Final = "rate_limited"  # 429
CANCELLED: Final = "cancelled"  # lost a hedge or a race
INTERRUPTED: Final = "interrupted"  # broke after tokens had arrived
OUTCOMES: Final[tuple[Outcome, ...]] = (OK, ERROR, TIMEOUT, RATE_LIMITED, CANCELLED, INTERRUPTED)
_FAILURES: Final = (ERROR, TIMEOUT, RATE_LIMITED)

PRIOR_SIGMA: Final = 0.5
"""The log-space spread of the lognormal TTFT assumed for a target without data."""

SampleEvent: TypeAlias = Sequence[str | float | None]
"""One recorded sample as plain JSON-ready data, ``(target, kind, *values)``, one of:
``(target, "t", seconds, prompt_tokens)`` a TTFT, ``(target, "c", elapsed, prompt_tokens)`` a
censored TTFT, ``(target, "s", itl, tokens_per_s)`` a stream's speed (either may be ``None``),
``(target, "l", seconds)`` a whole-response latency, ``(target, "o", outcome)`` an outcome.
"""
SAMPLE_KINDS: Final = ("t", "c", "s", "l", "o")
OUTBOX_MAXLEN: Final = 10_000

_NORMAL = NormalDist()
_LATENCY_PRIOR_FACTOR: Final = 4.0


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

        position = (total - 1) * q
        index = math.floor(position)
        low = nth(index)
        fraction = position - index
        if fraction == 0.0:
            return low
        high = nth(index + 1)
        return min(max(low + (high - low) * fraction, low), high)

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

        position = (n - 1) * q
        index = math.floor(position)
        low = nth(index)
        fraction = position - index
        if fraction == 0.0:
            return low
        return min(max(low + (nth(index + 1) - low) * fraction, low), nth(index + 1))

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


@dataclass(frozen=True, slots=True)
class StatsSettings:
    """How much history the stats keep and what they assume before there is any."""

    window: float = 300.0
    max_samples: int = 1024
    prompt_classes: tuple[int, ...] = (1024, 8192, 32768)
    """Upper bounds (exclusive) of the prompt-length classes, in tokens; one more class above."""
    prior_ttft: float = 1.0
    """The median TTFT, in seconds, assumed for a target without data."""
    prior_weight: float = 3.0
    """How many samples the prior counts for."""
    min_samples: int = 5
    """Samples a prompt-length class needs before its own quantiles are used."""
    recent: int = 10
    """The most newest samples a change of regime is tested on: the newest 3 to ``recent``
    against the whole window (see :meth:`TargetStats.shifted`)."""

    def __post_init__(self) -> None:
        if not self.window > 0:
            raise ValueError(f"window must be positive, got {self.window!r}")
        if self.max_samples < 1:
            raise ValueError(f"max_samples must be at least 1, got {self.max_samples!r}")
        bounds = self.prompt_classes
        if not bounds or bounds[0] < 1 or any(a >= b for a, b in itertools.pairwise(bounds)):
            raise ValueError(
                f"prompt_classes must be increasing positive token counts, got {bounds!r}"
            )
        if not self.prior_ttft > 0:
            raise ValueError(f"prior_ttft must be positive, got {self.prior_ttft!r}")
        if not self.prior_weight >= 0:
            raise ValueError(f"prior_weight must not be negative, got {self.prior_weight!r}")
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be at least 1, got {self.min_samples!r}")
        if self.recent < 2:
            raise ValueError(f"recent must be at least 2, got {self.recent!r}")


def prompt_class(tokens: int, bounds: Sequence[int]) -> int:
    """The index of the class a prompt of ``tokens`` falls in: the first bound it is under.

    A prompt of at least the last bound is in the last class, ``len(bounds)``.
    """
    return bisect.bisect_right(bounds, tokens)


def _tokens_label(tokens: int) -> str:
    for unit in (1024, 1000):
        if tokens >= unit and tokens % unit == 0:
            return f"{tokens // unit}k"
    return str(tokens)


def class_label(index: int, bounds: Sequence[int]) -> str:
    """A short name for class ``index``: ``"<1k"``, ``"1k-8k"``, ..., ``">=32k"``."""
    if not 0 <= index <= len(bounds):
        raise ValueError(f"class {index} is out of range for {len(bounds)} bounds")
    if index == 0:
        return f"<{_tokens_label(bounds[0])}"
    if index == len(bounds):
        return f">={_tokens_label(bounds[-1])}"
    return f"{_tokens_label(bounds[index - 1])}-{_tokens_label(bounds[index])}"


def estimate_prompt_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """A rough, fast token count of chat messages: text characters // 4, plus 4 per message.

    Text is string content or the ``text`` of ``{"type": "text"}`` parts; other parts, and
    messages that are not mappings, count nothing.
    """
    characters = 0
    count = 0
    for message in messages:
        count += 1
        if not isinstance(message, Mapping):
            continue
        content = message.get("content")
        if isinstance(content, str):
            characters += len(content)
        elif isinstance(content, Iterable):
            for part in content:
                if isinstance(part, Mapping) and part.get("type") == "text":
                    text = part.get("text")
                    if isinstance(text, str):
                        characters += len(text)
    return characters // 4 + 4 * count


@dataclass(frozen=True, slots=True)
class ClassSnapshot:
    """Observed TTFT of one prompt-length class, in seconds."""

    n: int
    ttft_p50: float | None
    ttft_p95: float | None
    ttft_p99: float | None


@dataclass(frozen=True, slots=True)
class ServerMetrics:
    """What a self-hosted server (SGLang) says of itself on ``/metrics``, read at ``read_at``.

    The TTFT and queue-time means are over the requests since the previous reading (from the
    histograms' sum and count), ``None`` when no request finished in between.
    """

    read_at: float
    """When it was read, on the stats' clock: when the scrape was sent, so that a request this
    client started later is not in it (one started while the scrape was on its way may be)."""
    queued: int
    running: int
    cache_hit_rate: float | None = None
    token_usage: float | None = None
    ttft_mean: float | None = None
    queue_time_mean: float | None = None
    ranks: tuple[int, ...] = ()
    """Queued + running requests per data-parallel rank (``--dp-size``), in rank order; empty
    when the server reports one queue. Each rank schedules its own requests."""

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks the load is spread over (1 without data parallelism)."""
        return max(1, len(self.ranks))


@dataclass(frozen=True, slots=True)
class TargetSnapshot:
    """What is known of one target right now. Latencies in seconds, ``None`` without data.

    The error, timeout and rate-limited rates are shares of the attempts that were not
    cancelled. ``breaker`` is filled in by the router.
    """

    name: str
    n: int
    ttft_p50: float | None
    ttft_p95: float | None
    ttft_p99: float | None
    ttft_mean: float | None
    itl_p50: float | None
    tokens_per_s: float | None
    latency_p50: float | None
    latency_p95: float | None
    error_rate: float
    timeout_rate: float
    rate_limited_rate: float
    in_flight: int
    outcomes: dict[str, int] = field(default_factory=dict)
    by_class: dict[str, ClassSnapshot] = field(default_factory=dict)
    breaker: str = "closed"
    server: ServerMetrics | None = None
    """A self-hosted server's own latest ``/metrics`` reading (queue, running, cache hit rate,
    server-side TTFT), if it has one."""

    def to_dict(self) -> dict[str, Any]:
        """Plain data, for JSON."""
        return dataclasses.asdict(self)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


class StatsReport(dict[str, TargetSnapshot]):
    """``client.stats()``: every target's :class:`TargetSnapshot` by name, a plain ``dict`` in
    every way, that prints as a table (``print(client.stats())``, or at a prompt)."""

    _COLUMNS = (
        "target",
        "n",
        "TTFT p50",
        "p95",
        "p99",
        "ITL p50",
        "tokens/s",
        "whole p50",
        "errors",
        "in flight",
        "circuit",
    )

    def table(self) -> str:
        """One line per target: TTFT samples (streamed requests), TTFT p50/p95/p99, inter-token
        latency p50, tokens/s, the whole-answer latency p50 of requests not streamed (their
        first token comes with the whole answer; kept apart so it does not skew the streamed
        TTFT routing relies on), the error rate (errors, timeouts and 429s), requests in flight
        and the circuit state."""
        if not self:
            return "no targets yet (a client without routes, or before its first request)"
        rows = [self._COLUMNS] + [
            (
                name,
                str(snap.n),
                _ms(snap.ttft_p50),
                _ms(snap.ttft_p95),
                _ms(snap.ttft_p99),
                _ms(snap.itl_p50),
                "-" if snap.tokens_per_s is None else f"{snap.tokens_per_s:.0f}",
                _ms(snap.latency_p50),
                f"{snap.error_rate:.0%}",
                str(snap.in_flight),
                snap.breaker,
            )
            for name, snap in self.items()
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(len(self._COLUMNS))]
        lines = [
            "  ".join(
                cell.ljust(width) if index == 0 else cell.rjust(width)
                for index, (cell, width) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
            for row in rows
        ]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain data, for JSON: each snapshot as a dict."""
        return {name: snap.to_dict() for name, snap in self.items()}

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return f"<StatsReport of {len(self)} target(s); as a table:\n{self.table()}\n>"


class SampleJournal:
    """A bounded outbox of recorded samples; when full, the oldest is dropped and counted."""

    __slots__ = ("dropped", "events")

    def __init__(self, maxlen: int = OUTBOX_MAXLEN) -> None:
        if maxlen < 1:
            raise ValueError(f"maxlen must be at least 1, got {maxlen!r}")
        self.events: deque[SampleEvent] = deque(maxlen=maxlen)
        self.dropped = 0

    def add(self, event: SampleEvent) -> None:
        """Keep one event."""
        events = self.events
        if len(events) == events.maxlen:
            self.dropped += 1
        events.append(event)

    def drain(self) -> list[SampleEvent]:
        """Take every event kept, oldest first."""
        taken = list(self.events)
        self.events.clear()
        return taken


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected seconds, got {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"expected finite non-negative seconds, got {value!r}")
    return float(value)


def _tokens(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a token count, got {value!r}")
    return value


def _optional(value: object) -> float | None:
    return None if value is None else _seconds(value)


class TargetStats:
    """Everything measured about one target, and its predicted TTFT for a prompt length."""

    def __init__(
        self,
        name: str,
        settings: StatsSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        journal: SampleJournal | None = None,
    ) -> None:
        self.name = name
        self._journal = journal
        self.settings = settings = settings if settings is not None else StatsSettings()
        self.in_flight = 0
        # (time, in_flight after the change) of the latest changes, for in_flight_at().
        self._flights: deque[tuple[float, int]] = deque()
        self._flights_before = 0  # in_flight before the oldest change kept

        def window() -> LatencyWindow:
            return LatencyWindow(settings.window, settings.max_samples, clock)

        self._ttft_by_class = [window() for _ in range(len(settings.prompt_classes) + 1)]
        self._ttft = window()
        self._itl = window()
        self._gap = window()
        self._tokens_per_s = window()
        self._latency = window()
        self._outcomes = OutcomeWindow(settings.window, clock)
        self._clock = clock
        self._waiting: dict[int, float] = {}
        self.server: ServerMetrics | None = None
        """The latest reading of the target's own ``/metrics`` (self-hosted servers only)."""
        self._next_wait = 0
        self.shifts = 0
        """Changes of regime seen (see :meth:`shifted`), for tests and reports."""
        self.improving = False
        """The newest TTFT sample is below the p5 of the ones before it (by the small-window
        margin while they are few): the target may have
        got faster (a slow one re-measured), so it is worth re-measuring again soon."""
        self._explorations: deque[float] = deque(maxlen=EXPLORATIONS_KEPT)
        self.probing = 0
        """Attempts in flight that run on to their first token whoever wins (the target was
        cold when they started): samples on their way, counted by :meth:`needs_samples`."""
        self.token_counts = TokenCounts()
        """Tokens per delta and bytes per token of its completed answers (:mod:`.tokens`)."""

    def _class_window(self, prompt_tokens: int) -> LatencyWindow:
        return self._ttft_by_class[prompt_class(prompt_tokens, self.settings.prompt_classes)]

    def started(self) -> None:
        """An attempt went out."""
        self.in_flight += 1
        self._flight_changed()

    def finished(self) -> None:
        """An attempt ended, however it ended."""
        self.in_flight = max(0, self.in_flight - 1)
        self._flight_changed()

    def _flight_changed(self) -> None:
        now, flights = self._clock(), self._flights
        flights.append((now, self.in_flight))
        horizon = now - IN_FLIGHT_HISTORY
        while flights and (flights[0][0] < horizon or len(flights) > IN_FLIGHT_HISTORY_MAX):
            self._flights_before = flights.popleft()[1]

    def in_flight_at(self, when: float) -> int:
        """This client's attempts in flight at time ``when`` (the stats' clock). Known for the
        last :data:`IN_FLIGHT_HISTORY` seconds; before that, the oldest count remembered."""
        flights = self._flights
        index = bisect.bisect_right(flights, when, key=lambda change: change[0])
        return flights[index - 1][1] if index else self._flights_before

    def observe_server(self, metrics: ServerMetrics) -> bool:
        """Take a ``/metrics`` reading unless a newer one is already held (readings may arrive
        out of order); returns whether it was taken."""
        if self.server is not None and metrics.read_at < self.server.read_at:
            return False
        self.server = metrics
        return True

    def server_load(self, max_age: float) -> float | None:
        """The requests the server is working on per data-parallel rank, from its latest
        reading if younger than ``max_age`` seconds (else ``None``): queued + running at the
        reading, plus the change in this client's attempts in flight since it was taken (those
        started since are not in it, those finished since were), each counted once."""
        server = self.server
        if server is None or self._clock() - server.read_at > max_age:
            return None
        since = self.in_flight - self.in_flight_at(server.read_at)
        return max(0.0, (server.queued + server.running + since) / server.dp_size)

    def waiting(self) -> int:
        """An attempt now waits for its first token; returns a handle for :meth:`done_waiting`.

        While it waits longer than the target's predicted quantile, it counts in
        :meth:`predict` as a sample at least that long: a stall shows in the prediction while
        it happens, not only when (or if) its first token finally arrives.
        """
        self._next_wait += 1
        self._waiting[self._next_wait] = self._clock()
        return self._next_wait

    def done_waiting(self, handle: int) -> None:
        """The attempt got its first token, failed or was cancelled."""
        self._waiting.pop(handle, None)

    def record_ttft(self, seconds: float, prompt_tokens: int) -> None:
        """A first token arrived ``seconds`` after the request for a prompt of that length."""
        if seconds < 0:
            raise ValueError(f"a TTFT cannot be negative, got {seconds!r}")
        self._add(self._class_window(prompt_tokens), seconds)
        self._add(self._ttft, seconds)
        if self._journal is not None:
            self._journal.add((self.name, "t", seconds, prompt_tokens))

    def record_censored(self, elapsed: float, prompt_tokens: int, *, raced: bool = False) -> bool:
        """An attempt was cancelled ``elapsed`` seconds in, before its first token.

        Its TTFT is only known to exceed ``elapsed``, so it is recorded (in each window it would
        go to) only where ``elapsed`` is above that window's predicted p95 (the prior's, blended,
        while the window has fewer than ``min_samples``): it can raise the tail estimate, never
        invent a fast sample. Returns whether it was recorded at all. ``raced``: it lost a race
        it started in at the same time as the winner; such losses are what a race is for, so
        they never count towards a change of regime (:meth:`shifted`).
        """
        if elapsed < 0:
            raise ValueError(f"elapsed cannot be negative, got {elapsed!r}")
        recorded = self._censor(elapsed, prompt_tokens, check=not raced)
        if recorded and self._journal is not None:
            self._journal.add((self.name, "c", elapsed, prompt_tokens))
        return recorded

    def _censor(self, elapsed: float, prompt_tokens: int, *, check: bool = True) -> bool:
        recorded = False
        for window in (self._class_window(prompt_tokens), self._ttft):
            if elapsed > self._blend(window, 0.95, self.settings.prior_ttft):
                self._add(window, elapsed, check=check, censored=True)
                recorded = True
        return recorded

    def _add(
        self, window: LatencyWindow, seconds: float, *, check: bool = True, censored: bool = False
    ) -> None:
        window.add(seconds, censored=censored)
        shift, slower = self._change(window) if check else (0, False)
        if shift:
            window.left_median = window.quantile_without(shift, 0.5) if slower else None
            window.slowed = slower
            window.changed = True
            window.keep_newest(shift)
            self.shifts += 1
        if window is self._ttft:
            self.improving = not shift and self._below_range(window, seconds)

    def _below_range(self, window: LatencyWindow, seconds: float) -> bool:
        """Whether ``seconds``, the newest sample, is below the p5 of the samples before it."""
        n = len(window)
        if n <= self.known(window):
            return False
        margin = self._margin(n - 1)
        if seconds >= window.nth(math.ceil((n - 2) * 0.05) + 1) / margin:  # a bound of that p5
            return False
        return seconds < cast(float, window.quantile_without(1, 0.05)) / margin

    def shifted(self, window: LatencyWindow) -> int:
        """How many of the window's newest samples belong to a new regime (0: none).

        A rank test of the ``k`` newest samples against the whole window, for each ``k`` from
        :data:`SHIFT_MIN` to ``recent`` (fewer while the window holds fewer samples): they are
        a new regime when they all lie so far at one end of it (above the others: slower; below
        them: faster) that a steady target would put them there with probability at most
        :func:`change_alpha` (:func:`placement_p`: exact for any distribution of a steady
        target's samples, heavy tails included). After a change to slower, a change back to
        faster is tested at :data:`RETURN_ALPHA`. Returns the largest such ``k``: the samples
        :meth:`_add` keeps. Censored samples (attempts cancelled past the p95 by hedges that
        beat them, first-token deadlines missed) count as samples of their time so far, a
        lower bound of their TTFT: that can only make a change to slower harder to show, never
        easier. So a steady target is declared changed after at most :data:`FALSE_ALARM_RATE`
        of its samples (a union bound; measured lower), and a target four times slower within
        its first 3 slow samples when it had no stalls (all above all the older ones), about 6
        when 10% of the older ones were stalls above the new regime."""
        return self._change(window)[0]

    def _change(self, window: LatencyWindow) -> tuple[int, bool]:
        """(the samples of the new regime, whether it is slower) by :meth:`shifted`'s test."""
        n = len(window)
        top = min(self.settings.recent, n - 1)
        if top < SHIFT_MIN:
            return 0, False
        alpha = change_alpha(self.settings.recent)
        thin = window.slowed or n < 2 * self.settings.recent
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
        maybe_slower = (
            placement_p(n, window.count_at_least(middle, censored_too=True), top) <= alpha
        )
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

    def _margin(self, older: int) -> float:
        """How far beyond the older samples' p95 (or below their p5, divided) a sample must lie
        to count as beyond their range: 1 once they are ``2 * recent``; before, their range is
        narrow and noisy (a p95 of 5 samples is about their maximum), so 1.5 times it."""
        return 1.0 if older >= 2 * self.settings.recent else SMALL_WINDOW_MARGIN

    def record_stream(self, itl: float | None, tokens_per_s: float | None) -> None:
        """A stream's mean inter-token latency and its tokens per second, where known."""
        if itl is not None:
            self._itl.add(itl)
        if tokens_per_s is not None:
            self._tokens_per_s.add(tokens_per_s)
        if self._journal is not None and (itl is not None or tokens_per_s is not None):
            self._journal.add((self.name, "s", itl, tokens_per_s))

    def record_gap(self, seconds: float) -> None:
        """The longest pause between two chunks of one stream that completed."""
        self._gap.add(seconds)

    def gap_quantile(self, q: float) -> float | None:
        """A quantile of the longest pause per stream, once ``min_samples`` streams have one."""
        if len(self._gap) < self.settings.min_samples:
            return None
        return self._gap.quantile(q)

    def record_latency(self, seconds: float) -> None:
        """A non-streamed request took ``seconds`` in all."""
        self._latency.add(seconds)
        if self._journal is not None:
            self._journal.add((self.name, "l", seconds))

    def record_outcome(self, outcome: Outcome | str) -> None:
        """How one attempt ended; one of :data:`OUTCOMES`, else ``ValueError``."""
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}; expected one of {OUTCOMES}")
        self._outcomes.add(outcome)
        if self._journal is not None:
            self._journal.add((self.name, "o", outcome))

    def apply(self, kind: str, values: Sequence[object]) -> None:
        """Record one event's sample (see :data:`SampleEvent`) from another instance, without
        journaling it. A censored TTFT goes through this target's own censoring rule.

        Raises ``ValueError`` or ``TypeError``, recording nothing, when the event is malformed.
        """
        if kind == "t":
            seconds, tokens = values
            seconds, tokens = _seconds(seconds), _tokens(tokens)
            self._add(self._class_window(tokens), seconds)
            self._add(self._ttft, seconds)
        elif kind == "c":
            elapsed, tokens = values
            self._censor(_seconds(elapsed), _tokens(tokens))
        elif kind == "s":
            itl, tokens_per_s = values
            itl, tokens_per_s = _optional(itl), _optional(tokens_per_s)
            if itl is not None:
                self._itl.add(itl)
            if tokens_per_s is not None:
                self._tokens_per_s.add(tokens_per_s)
        elif kind == "l":
            (seconds,) = values
            self._latency.add(_seconds(seconds))
        elif kind == "o":
            (outcome,) = values
            if outcome not in OUTCOMES:
                raise ValueError(f"unknown outcome {outcome!r}")
            self._outcomes.add(cast(str, outcome))
        else:
            raise ValueError(f"unknown sample kind {kind!r}")

    def _blend(self, window: LatencyWindow, q: float, prior_median: float) -> float:
        if not 0.0 < q < 1.0:
            raise ValueError(f"q must be strictly between 0 and 1, got {q!r}")
        prior = prior_median * math.exp(_NORMAL.inv_cdf(q) * PRIOR_SIGMA)
        observed, n = window._quantile_and_count(q)
        if observed is None:
            return prior
        if n >= self.known(window):
            return observed  # enough data: a prior would only bias a steady estimate
        weight = self.settings.prior_weight
        return (n * observed + weight * prior) / (n + weight)

    def _window_for(self, prompt_tokens: int) -> LatencyWindow:
        """The window a prediction for this prompt length uses: its class's once that holds
        enough samples (:meth:`known`), else the whole one."""
        window = self._class_window(prompt_tokens)
        return window if len(window) >= self.known(window) else self._ttft

    def _lower_bound(self, window: LatencyWindow, q: float, prompt_tokens: int) -> float | None:
        """The window's lower confidence bound of its ``q``-quantile (:func:`lower_bound_rank`)
        while it is a fresh one, known but holding fewer than ``1 / (1 - q)`` samples; else
        ``None``. Not in a window that was declared changed: its few samples passed a test
        that they are the new regime, and a target with a stall tail (A in
        ``benchmarks/routing.py``'s steady weather) re-measured after a change would otherwise
        rank by its body again, stalls already among its samples, and be the first choice
        until twenty samples came (timed, on a loaded machine, such windows came every few
        seconds and cost steady weather's p95 up to 1.5x)."""
        n = len(window)
        if window.changed or n < self.known(window) or n * (1.0 - q) >= 1.0:
            return None
        own = window.quantile(q)
        if own is None or self.predict(q, prompt_tokens) > own:  # raised by attempts waiting
            return None
        return window.order_statistic(lower_bound_rank(n, q))

    def rank(self, q: float, prompt_tokens: int) -> float:
        """What the target is ranked by for the ``q``-quantile: :meth:`predict`, except that
        while its window is fresh and holds fewer than ``1 / (1 - q)`` samples (but enough to
        be known), a lower bound of the quantile at :data:`RANK_CONFIDENCE`
        (:meth:`_lower_bound`): its samples are too few for the quantile to be more than their
        largest ones; and :data:`FAILING_RANK` more while it fails on more than ``1 - q`` of
        its attempts (:meth:`failing`): a request's ``q``-quantile of a first token from it is
        never."""
        predicted = self.predict(q, prompt_tokens)
        if self.failing(q):
            return FAILING_RANK + predicted
        bound = self._lower_bound(self._window_for(prompt_tokens), q, prompt_tokens)
        return predicted if bound is None else min(predicted, bound)

    def hedge_delay(self, q: float, backup: float, prompt_tokens: int) -> float:
        """When to hedge an attempt here that has no first token yet: at its ``q``-quantile,
        or later, once a hedge answering ``backup`` seconds after it would win at least
        :data:`HEDGE_WIN_SHARE` of the time (:func:`winning_delay` over the window's samples).
        The quantile is the sample at or just below its rank, not one interpolated towards
        the next: with a few stalls in a small window the next is a stall, and a point between
        is a wait no answer ever took. Attempts waiting past it do not raise it (they do raise
        :meth:`predict`, which ranks the target): one stalled attempt must not make the next
        requests wait longer for their hedge. While the target is ranked by a lower bound of
        the quantile (:meth:`rank`), from that bound. A delay at or past the largest sample is
        :data:`BEYOND_SAMPLES` times it: no answer ever took longer, so a hedge then only
        insures against a stall, and at the largest sample itself it would race a steady
        target's own answer (C in the long/short weather, whose prompts always take 0.7 s).
        :meth:`predict` while the target is cold."""
        window = self._window_for(prompt_tokens)
        n = len(window)
        if n < self.known(window):
            return self.predict(q, prompt_tokens)
        floor = window.order_statistic(math.floor((n - 1) * q) + 1)
        bound = self._lower_bound(window, q, prompt_tokens)
        if bound is not None:  # ranked by it: hedged from it too, not from a stall above it
            floor = min(floor, bound)
        values = window.sorted_values()
        delay = winning_delay(values, floor, backup, window.sorted_censored())
        if delay >= values[-1]:  # no answer took longer: insurance against a stall only
            delay *= BEYOND_SAMPLES
        return delay

    def predict(self, q: float, prompt_tokens: int) -> float:
        """The predicted ``q``-quantile TTFT, in seconds, for a prompt of ``prompt_tokens``.

        The prompt's class is used once it has ``min_samples`` samples, else all classes
        together. Below ``min_samples`` samples the observed quantile is blended with a
        lognormal prior (median ``prior_ttft``) weighted as ``prior_weight`` samples; without
        samples it is the prior alone; from ``min_samples`` on (:data:`SHIFT_MIN` after a
        change of regime: :meth:`known`), the observed quantile alone,
        with attempts still waiting longer than that counted as samples of their time so far.
        """
        window = self._class_window(prompt_tokens)
        if len(window) < self.known(window):
            window = self._ttft
        predicted = self._blend(window, q, self.settings.prior_ttft)
        if self._waiting and len(window) >= self.known(window):
            now = self._clock()
            overdue = [now - t for t in self._waiting.values() if now - t > predicted]
            if overdue:
                predicted = cast(float, window.quantile_with(overdue, q))
            predicted = max(predicted, self._waits_shift(window, now, q))
        return predicted

    def _waits_shift(self, window: LatencyWindow, now: float, q: float) -> float:
        """The ``q``-quantile of the attempts now waiting past the window's p95 (each a
        censored sample of its time so far), when the longest ``k`` of them show a change to
        slower by :meth:`shifted`'s test, else 0. The test is made as if they were the ``k``
        newest samples, and its level divided by the C(w, k) ways to pick ``k`` of the ``w``
        attempts waiting (a union bound: the longest waits are picked, not the newest), so a
        steady target shows such a change at most :func:`change_alpha` of the time. This is
        how a target that got slow shows within about one p95, before any of its slow attempts
        ends: three of three attempts waiting (four of eight) past every sample of a window of
        200 steady ones are a change, and become so while they wait; a stalled attempt of a
        target that stalls now and then is not, unless its stalls outlast what its window says
        they take."""
        p95 = cast(float, window.quantile(0.95))
        overdue = sorted((now - t for t in self._waiting.values() if now - t > p95), reverse=True)
        if len(overdue) < SHIFT_MIN:
            return 0.0
        alpha = change_alpha(self.settings.recent)
        waiting, n = len(self._waiting), len(window) + len(overdue)
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

    def class_quantile(self, q: float, prompt_tokens: int) -> float | None:
        """The observed ``q``-quantile TTFT of the prompt's own length class, once it holds
        ``min_samples`` samples (no prior, no pooling: ``None`` before)."""
        window = self._class_window(prompt_tokens)
        if len(window) < self.settings.min_samples:
            return None
        return window.quantile(q)

    def decode_speed(self) -> float | None:
        """The median tokens per second of the target's streams, once ``min_samples`` streams
        were measured (``None`` before)."""
        if len(self._tokens_per_s) < self.settings.min_samples:
            return None
        return self._tokens_per_s.quantile(0.5)

    def predict_latency(self, q: float) -> float:
        """The predicted ``q``-quantile whole-response latency of a non-streamed request.

        Blended as :meth:`predict` does, with a prior median of four times ``prior_ttft``.
        """
        return self._blend(self._latency, q, self.settings.prior_ttft * _LATENCY_PRIOR_FACTOR)

    def cold(self, *, streamed: bool = True) -> bool:
        """Whether the TTFT window (the whole-response latency window for requests that are
        not streamed) holds fewer than ``min_samples`` samples, so priors still count."""
        window = self._ttft if streamed else self._latency
        return len(window) < self.known(window)

    def needs_samples(self) -> bool:
        """Whether the TTFT window is cold even counting the samples on their way (attempts
        running on to their first token, :attr:`probing`): another probe would still teach."""
        return len(self._ttft) + self.probing < self.known(self._ttft)

    def known(self, window: LatencyWindow) -> int:
        """Samples that make a window's target known: ``min_samples``; :data:`SHIFT_MIN`
        after a change of regime (the samples that showed it are few, and they passed the test
        that they are the new regime). After a change to slower, new samples come only from
        re-measuring a target that lost its traffic, at a cost each; after a change back to
        faster, waiting for ``min_samples`` would keep a recovered target cold (explored, its
        prediction blended with the prior) for two more re-measures before it gets traffic."""
        if window.changed and len(window) >= SHIFT_MIN:
            return SHIFT_MIN
        return self.settings.min_samples

    def explored(self, now: float) -> None:
        """A request went to this target to re-measure it, at ``now`` (the router's clock)."""
        self._explorations.append(now)

    @property
    def explored_at(self) -> float | None:
        """When a request last went to this target to re-measure it (the router's clock)."""
        return self._explorations[-1] if self._explorations else None

    def unanswered_explorations(self, *, streamed: bool = True) -> int:
        """Explorations of this target since its newest sample (all those kept when it has
        none): those that taught nothing, such as a race it was explored in and lost, which
        leaves no sample below its p95."""
        newest = self.newest_at(streamed=streamed)
        if newest is None:
            return len(self._explorations)
        return sum(1 for when in self._explorations if when > newest)

    def newest_at(self, *, streamed: bool = True) -> float | None:
        """Clock time of the newest TTFT sample (whole-response latency sample for requests
        that are not streamed), or ``None`` when the window holds none."""
        return (self._ttft if streamed else self._latency).newest_at()

    def _failure_rates(self) -> tuple[dict[str, int], dict[str, float]]:
        counts = self._outcomes.counts()
        attempts = sum(counts.values()) - counts.get(CANCELLED, 0)
        rates = {name: counts.get(name, 0) / attempts if attempts else 0.0 for name in _FAILURES}
        return counts, rates

    def failing(self, q: float) -> bool:
        """Whether the target fails (an error, a timeout, a 429) on more than ``1 - q`` of its
        attempts in the window, by :func:`fails_beyond`: then a request's ``q``-quantile of a
        first token from it is never, and :meth:`rank` puts it after every target that does
        not fail that often."""
        counts = self._outcomes.counts()
        attempts = sum(counts.values()) - counts.get(CANCELLED, 0)
        failures = sum(counts.get(name, 0) for name in _FAILURES)
        return attempts > 0 and fails_beyond(attempts, failures, 1.0 - q)

    def error_rate(self) -> float:
        """The share of errors, timeouts and 429s among attempts not cancelled; 0.0 if none."""
        return sum(self._failure_rates()[1].values())

    def snapshot(self) -> TargetSnapshot:
        """The observed figures (no priors) as they stand now."""
        counts, rates = self._failure_rates()
        bounds = self.settings.prompt_classes
        by_class = {
            class_label(index, bounds): ClassSnapshot(
                n=len(window),
                ttft_p50=window.quantile(0.5),
                ttft_p95=window.quantile(0.95),
                ttft_p99=window.quantile(0.99),
            )
            for index, window in enumerate(self._ttft_by_class)
            if len(window)
        }
        return TargetSnapshot(
            name=self.name,
            n=len(self._ttft),
            ttft_p50=self._ttft.quantile(0.5),
            ttft_p95=self._ttft.quantile(0.95),
            ttft_p99=self._ttft.quantile(0.99),
            ttft_mean=self._ttft.mean(),
            itl_p50=self._itl.quantile(0.5),
            tokens_per_s=self._tokens_per_s.quantile(0.5),
            latency_p50=self._latency.quantile(0.5),
            latency_p95=self._latency.quantile(0.95),
            error_rate=sum(rates.values()),
            timeout_rate=rates[TIMEOUT],
            rate_limited_rate=rates[RATE_LIMITED],
            in_flight=self.in_flight,
            outcomes={name: counts.get(name, 0) for name in OUTCOMES},
            by_class=by_class,
            server=self.server,
        )

    def saved_samples(self) -> list[tuple[float, SampleEvent]]:
        """What a stats file keeps of this target (:mod:`.snapshot`), as ``(clock time,
        event)``, oldest first: every TTFT sample of each prompt-length class (a censored one as
        ``"c"``), each at the class's smallest prompt length; each stream's inter-token latency
        and tokens per second; each whole-response latency. Outcomes, pauses between chunks,
        requests in flight and server readings are not kept: they describe the moment."""
        bounds = self.settings.prompt_classes
        timed: list[tuple[float, SampleEvent]] = []
        for index, window in enumerate(self._ttft_by_class):
            tokens = bounds[index - 1] if index else 0
            for when, value, censored in window.timed():
                timed.append((when, (self.name, "c" if censored else "t", value, tokens)))
        timed += [(when, (self.name, "s", v, None)) for when, v, _ in self._itl.timed()]
        timed += [(when, (self.name, "s", None, v)) for when, v, _ in self._tokens_per_s.timed()]
        timed += [(when, (self.name, "l", v)) for when, v, _ in self._latency.timed()]
        timed.sort(key=lambda item: item[0])
        return timed

    def mark_seeded(self) -> None:
        """Count every sample held now as read from a stats file (``LatencyWindow.mark_seeded``):
        live samples replace them one for one."""
        windows = (*self._ttft_by_class, self._ttft, self._itl, self._tokens_per_s, self._latency)
        for window in windows:
            window.mark_seeded()


class LiveStats:
    """The stats of every target, each created on first use.

    With ``journal=True`` (or after :meth:`enable_journal`), recorded samples are also kept
    for :meth:`drain`, to be shared with other instances.
    """

    def __init__(
        self,
        settings: StatsSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        journal: bool = False,
    ) -> None:
        self.settings = settings if settings is not None else StatsSettings()
        self._clock = clock
        self._targets: dict[str, TargetStats] = {}
        self._journal: SampleJournal | None = None
        if journal:
            self.enable_journal()

    def target(self, name: str) -> TargetStats:
        """The stats of target ``name``."""
        stats = self._targets.get(name)
        if stats is None:
            stats = self._targets[name] = TargetStats(
                name, self.settings, self._clock, journal=self._journal
            )
        return stats

    def enable_journal(self, maxlen: int = OUTBOX_MAXLEN) -> None:
        """Keep every sample recorded from now on, at most ``maxlen`` not yet drained."""
        journal = SampleJournal(maxlen)
        if self._journal is not None:
            journal.dropped = self._journal.dropped
            for event in self._journal.events:
                journal.add(event)
        self._journal = journal
        for stats in self._targets.values():
            stats._journal = journal

    @property
    def journal_dropped(self) -> int:
        """Samples dropped, oldest first, because the outbox was full; 0 without a journal."""
        return self._journal.dropped if self._journal is not None else 0

    def drain(self) -> list[SampleEvent]:
        """Take the samples recorded since the last drain, oldest first; ``[]`` without a
        journal."""
        return self._journal.drain() if self._journal is not None else []

    def apply(self, events: Iterable[SampleEvent], targets: Collection[str] | None = None) -> int:
        """Record samples from other instances (as :meth:`drain` gave them there), without
        journaling them; returns how many were recorded.

        Malformed events, and events for targets not in ``targets`` (when given), are skipped.
        """
        applied = 0
        for event in events:
            try:
                name, kind, *values = event
            except (TypeError, ValueError):
                continue
            if not isinstance(name, str) or kind not in SAMPLE_KINDS:
                continue
            if targets is not None and name not in targets:
                continue
            created = name not in self._targets
            try:
                self.target(name).apply(kind, values)
            except (TypeError, ValueError):
                if created:
                    del self._targets[name]
                continue
            applied += 1
        return applied

    def names(self) -> list[str]:
        """The targets seen so far, in order of first use."""
        return list(self._targets)

    def snapshot(self) -> StatsReport:
        """A snapshot of every target, by name (a dict that prints as a table)."""
        return StatsReport((name, stats.snapshot()) for name, stats in self._targets.items())

    def seed(self, events: Iterable[SampleEvent], targets: Collection[str] | None = None) -> int:
        """Record a stats file's samples (oldest first, before any live sample) as older
        evidence: as :meth:`apply`, then every sample held counts as seeded
        (``LatencyWindow.mark_seeded``). Returns how many were recorded."""
        applied = self.apply(events, targets)
        for stats in self._targets.values():
            stats.mark_seeded()
        return applied

    def saved_samples(self) -> dict[str, list[tuple[float, SampleEvent]]]:
        """Every target's :meth:`TargetStats.saved_samples`, by name (those with none left out)."""
        saved = {name: stats.saved_samples() for name, stats in self._targets.items()}
        return {name: samples for name, samples in saved.items() if samples}
