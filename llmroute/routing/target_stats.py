"""One target's live statistics (:class:`TargetStats`): TTFT by prompt length, stream speed,
pauses, whole-answer latency and outcomes over sliding windows; what it predicts and ranks by
for a quantile, and when to hedge it. The window maths lives in :mod:`.quantiles`, change
detection in :mod:`.change`, its load (attempts in flight, its server's readings) in
:mod:`.load`; this class holds the windows and acts on their answers. No I/O, no tasks."""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Final, cast

from .change import SHIFT_MIN, below_range, known_samples, regime_change, waits_shift
from .load import TargetLoad
from .quantiles import (
    LatencyWindow,
    OutcomeWindow,
    blend,
    fails_beyond,
    fresh_lower_bound,
    hedge_wait,
)
from .samples import (
    CANCELLED,
    FAILURES,
    OUTCOMES,
    RATE_LIMITED,
    TIMEOUT,
    Outcome,
    SampleEvent,
    SampleJournal,
    class_label,
    event_values,
    prompt_class,
)
from .stats_report import ClassSnapshot, TargetSnapshot
from .tokens import TokenCounts

__all__ = [
    "EXPLORATIONS_KEPT",
    "FAILING_RANK",
    "StatsSettings",
    "TargetStats",
    "class_snapshots",
    "saved_events",
]

EXPLORATIONS_KEPT = 16
"""The newest explorations of a target kept, for :meth:`TargetStats.unanswered_explorations`."""
FAILING_RANK: Final = 1e6
"""Seconds added to the rank of a target that fails too often (:meth:`TargetStats.failing`):
behind every target that does not, in the order of their own quantiles."""
_LATENCY_PRIOR_FACTOR: Final = 4.0


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


def class_snapshots(
    windows: Sequence[LatencyWindow], bounds: Sequence[int]
) -> dict[str, ClassSnapshot]:
    """The observed TTFT of each prompt-length class's window that holds samples, by label."""
    return {
        class_label(index, bounds): ClassSnapshot(
            n=len(window),
            ttft_p50=window.quantile(0.5),
            ttft_p95=window.quantile(0.95),
            ttft_p99=window.quantile(0.99),
        )
        for index, window in enumerate(windows)
        if len(window)
    }


def saved_events(
    name: str,
    by_class: Sequence[LatencyWindow],
    bounds: Sequence[int],
    itl: LatencyWindow,
    tokens_per_s: LatencyWindow,
    latency: LatencyWindow,
) -> list[tuple[float, SampleEvent]]:
    """What a stats file keeps of target ``name`` (:mod:`.snapshot`), as ``(clock time,
    event)``, oldest first: every TTFT sample of each prompt-length class (a censored one as
    ``"c"``), each at the class's smallest prompt length; each stream's inter-token latency
    and tokens per second; each whole-response latency. Outcomes, pauses between chunks,
    requests in flight and server readings are not kept: they describe the moment."""
    timed: list[tuple[float, SampleEvent]] = []
    for index, window in enumerate(by_class):
        tokens = bounds[index - 1] if index else 0
        for when, value, censored in window.timed():
            timed.append((when, (name, "c" if censored else "t", value, tokens)))
    timed += [(when, (name, "s", v, None)) for when, v, _ in itl.timed()]
    timed += [(when, (name, "s", None, v)) for when, v, _ in tokens_per_s.timed()]
    timed += [(when, (name, "l", v)) for when, v, _ in latency.timed()]
    timed.sort(key=lambda item: item[0])
    return timed


def with_waiting(
    window: LatencyWindow,
    waiting: Collection[float],
    now: float,
    predicted: float,
    q: float,
    recent: int,
) -> float:
    """``predicted`` with the attempts still waiting (their start times ``waiting``) counted:
    those waiting longer than it as samples of their time so far, and a shift of the waits as
    a whole (:func:`~.change.waits_shift`) as its floor."""
    overdue = [now - t for t in waiting if now - t > predicted]
    if overdue:
        predicted = cast(float, window.quantile_with(overdue, q))
    shift = waits_shift(window, waiting, now, q, recent)
    return max(predicted, shift)


def weigh_own(own: LatencyWindow, predicted: float, q: float) -> float:
    """``predicted`` (all classes') with the class's own few samples (``n``) weighed against
    it as ``n`` to 1: a 2,000-word prompt on a target fast on short ones (1.0 s against
    0.25 s) counts as slow from its first sample or two, not after min_samples of them were
    each sent there first."""
    observed, n = own._quantile_and_count(q)
    if observed is None:
        return predicted
    return (n * observed + predicted) / (n + 1)


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
        self.load = TargetLoad(clock)
        """Its attempts in flight from this client and its server's latest ``/metrics``
        reading (:mod:`.load`): what ``least-loaded`` and ``prefix`` rank by."""

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
        self._next_wait = 0
        self.shifts = 0
        """Changes of regime seen (see :meth:`shifted`), for tests and reports."""
        self._below_range = False  # the newest TTFT sample is below the older ones' range
        self._explorations: deque[float] = deque(maxlen=EXPLORATIONS_KEPT)
        self.probing = 0
        """Attempts in flight that run on to their first token whoever wins (the target was
        cold when they started): samples on their way, counted by :meth:`needs_samples`."""
        self.token_counts = TokenCounts()
        """Tokens per delta and bytes per token of its completed answers (:mod:`.tokens`)."""

    def _class_window(self, prompt_tokens: int) -> LatencyWindow:
        return self._ttft_by_class[prompt_class(prompt_tokens, self.settings.prompt_classes)]

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
        shift, slower = regime_change(window, self.settings.recent) if check else (0, False)
        if shift:
            window.left_median = window.quantile_without(shift, 0.5) if slower else None
            window.slowed = slower
            window.changed = True
            window.keep_newest(shift)
            self.shifts += 1
        if window is self._ttft:
            self._below_range = not shift and below_range(
                window, seconds, known=self.known(window), recent=self.settings.recent
            )

    @property
    def improving(self) -> bool:
        """Whether the target is worth re-measuring soon, at the improving share of requests
        rather than when stale: its newest TTFT sample is below the p5 of the ones before it
        (by the small-window margin while they are few), so it may have got faster (a slow one
        re-measured); or it changed to slower and holds fewer than ``min_samples`` samples
        more than the :data:`~.change.SHIFT_MIN` that can show a change: the change may be a
        burst of the client's own lag (a busy event loop delays every first token it reads,
        and only the target that gets the traffic shows it), and the few re-measures that
        confirm it or take it back (up to five fast ones against three slow) come within a
        second instead of a stale target's seconds each."""
        window = self._ttft
        thin = window.changed and window.slowed
        return self._below_range or (thin and len(window) < SHIFT_MIN + self.settings.min_samples)

    def shifted(self, window: LatencyWindow) -> int:
        """How many of the window's newest samples belong to a new regime (0: none), by
        :func:`~.change.regime_change`'s test; :meth:`_add` keeps them."""
        return regime_change(window, self.settings.recent)[0]

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
        checked = event_values(kind, values)
        if kind == "t":
            seconds, tokens = checked
            self._add(self._class_window(tokens), seconds)
            self._add(self._ttft, seconds)
        elif kind == "c":
            self._censor(*checked)
        elif kind == "s":
            itl, tokens_per_s = checked
            if itl is not None:
                self._itl.add(itl)
            if tokens_per_s is not None:
                self._tokens_per_s.add(tokens_per_s)
        elif kind == "l":
            self._latency.add(checked[0])
        else:
            self._outcomes.add(checked[0])

    def _blend(self, window: LatencyWindow, q: float, prior_median: float) -> float:
        known, weight = self.known(window), self.settings.prior_weight
        return blend(window, q, prior_median, known=known, prior_weight=weight)

    def _window_for(self, prompt_tokens: int) -> LatencyWindow:
        """The window a prediction for this prompt length uses: its class's once that holds
        enough samples (:meth:`known`), else the whole one."""
        window = self._class_window(prompt_tokens)
        return window if len(window) >= self.known(window) else self._ttft

    def _lower_bound(self, window: LatencyWindow, q: float, prompt_tokens: int) -> float | None:
        """:func:`~.quantiles.fresh_lower_bound` of the window, against :meth:`predict`."""
        known = self.known(window)
        return fresh_lower_bound(
            window, q, known=known, predicted=lambda: self.predict(q, prompt_tokens)
        )

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
        window = self._window_for(prompt_tokens)
        if window is self._ttft and len(self._class_window(prompt_tokens)):
            return predicted  # all classes' bound says nothing of this one's first samples
        bound = self._lower_bound(window, q, prompt_tokens)
        return predicted if bound is None else min(predicted, bound)

    def hedge_delay(self, q: float, backup: float, prompt_tokens: int) -> float:
        """When to hedge an attempt here that has no first token yet (:func:`~.quantiles.hedge_wait`
        over the prompt's window): at its ``q``-quantile or later, once a hedge answering
        ``backup`` seconds after it would win often enough; from the lower bound the target is
        ranked by (:meth:`rank`) while it is; :meth:`predict` while the target is cold. Attempts
        waiting past it do not raise it (they do raise :meth:`predict`, which ranks the
        target): one stalled attempt must not make the next requests wait longer for their
        hedge."""
        window = self._window_for(prompt_tokens)
        if len(window) < self.known(window):
            return self.predict(q, prompt_tokens)
        return hedge_wait(window, q, backup, self._lower_bound(window, q, prompt_tokens))

    def predict(self, q: float, prompt_tokens: int) -> float:
        """The predicted ``q``-quantile TTFT, in seconds, for a prompt of ``prompt_tokens``.

        The prompt's class is used once it has ``min_samples`` samples, else all classes
        together, with the class's own few samples (``n``) weighed against that as ``n`` to 1
        once all classes together are known: a long prompt on a target fast on short ones
        counts as slow from its first sample or two. Below ``min_samples`` samples the
        observed quantile is blended with a lognormal prior (median ``prior_ttft``) weighted
        as ``prior_weight`` samples; without samples it is the prior alone; from
        ``min_samples`` on (:data:`SHIFT_MIN` after a change of regime: :meth:`known`), the
        observed quantile alone, with attempts still waiting longer than that counted as
        samples of their time so far.
        """
        own = window = self._class_window(prompt_tokens)
        if len(window) < self.known(window):
            window = self._ttft
        predicted = self._blend(window, q, self.settings.prior_ttft)
        if self._waiting and len(window) >= self.known(window):
            waiting, now, recent = self._waiting.values(), self._clock(), self.settings.recent
            predicted = with_waiting(window, waiting, now, predicted, q, recent)
        if own is not window and len(own) and len(window) >= self.known(window):
            predicted = weigh_own(own, predicted, q)
        return predicted

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
        """Samples that make a window's target known (:func:`~.change.known_samples`):
        ``min_samples``, or :data:`~.change.SHIFT_MIN` after a change of regime."""
        return known_samples(window, self.settings.min_samples)

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
        rates = {name: counts.get(name, 0) / attempts if attempts else 0.0 for name in FAILURES}
        return counts, rates

    def failing(self, q: float) -> bool:
        """Whether the target fails (an error, a timeout, a 429) on more than ``1 - q`` of its
        attempts in the window, by :func:`fails_beyond`: then a request's ``q``-quantile of a
        first token from it is never, and :meth:`rank` puts it after every target that does
        not fail that often."""
        counts = self._outcomes.counts()
        attempts = sum(counts.values()) - counts.get(CANCELLED, 0)
        failures = sum(counts.get(name, 0) for name in FAILURES)
        return attempts > 0 and fails_beyond(attempts, failures, 1.0 - q)

    def error_rate(self) -> float:
        """The share of errors, timeouts and 429s among attempts not cancelled; 0.0 if none."""
        return sum(self._failure_rates()[1].values())

    def snapshot(self) -> TargetSnapshot:
        """The observed figures (no priors) as they stand now."""
        counts, rates = self._failure_rates()
        by_class = class_snapshots(self._ttft_by_class, self.settings.prompt_classes)
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
            in_flight=self.load.in_flight,
            outcomes={name: counts.get(name, 0) for name in OUTCOMES},
            by_class=by_class,
            server=self.load.server,
        )

    def saved_samples(self) -> list[tuple[float, SampleEvent]]:
        """What a stats file keeps of this target (:mod:`.snapshot`): :func:`saved_events`."""
        by_class, bounds = self._ttft_by_class, self.settings.prompt_classes
        return saved_events(
            self.name, by_class, bounds, self._itl, self._tokens_per_s, self._latency
        )

    def mark_seeded(self) -> None:
        """Count every sample held now as read from a stats file (``LatencyWindow.mark_seeded``):
        live samples replace them one for one."""
        windows = (*self._ttft_by_class, self._ttft, self._itl, self._tokens_per_s, self._latency)
        for window in windows:
            window.mark_seeded()
