"""Live per-target statistics: TTFT by prompt length, stream speed, outcomes, with priors.

Everything here is pure bookkeeping over sliding time windows: no I/O, no tasks. Time comes from
an injectable ``clock`` (``time.monotonic`` by default) so the behaviour is tested without sleeping.

With the journal on (``LiveStats(journal=True)``), every recorded sample is also kept as a plain
:data:`SampleEvent` in a bounded outbox, which :meth:`LiveStats.drain` takes, so that a fleet of
instances can exchange samples (``llmroute.routing.shared``); :meth:`LiveStats.apply` records
another instance's events without journaling them again. Prediction stays local.

This module holds :class:`LiveStats`, the stats of every target, and names the rest, which lives
by concern: one target's stats in :mod:`.target_stats` and its load in :mod:`.load`, the
latency windows and their quantile maths in :mod:`.quantiles`, change detection in
:mod:`.change`, deadlines in :mod:`.deadlines`, samples, outcomes and prompt-length classes in
:mod:`.samples`, what the stats report in :mod:`.stats_report`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable

from .change import (
    FALSE_ALARM_RATE,
    RETURN_ALPHA,
    SHIFT_MIN,
    SMALL_WINDOW_MARGIN,
    change_alpha,
    placement_p,
)
from .deadlines import (
    FIRST_TOKEN_FLOOR,
    FIRST_TOKEN_MULTIPLE,
    STALL_FLOOR,
    STALL_MULTIPLE,
    STALL_PRIOR,
    STALL_STREAM_FLOOR,
    STALL_STREAM_GAPS,
    STALL_STREAM_MULTIPLE,
    first_token_deadline,
    stall_deadline,
    stream_stall_deadline,
)
from .load import IN_FLIGHT_HISTORY, IN_FLIGHT_HISTORY_MAX
from .quantiles import (
    BEYOND_SAMPLES,
    FAILING_ALPHA,
    HEDGE_WIN_SHARE,
    PRIOR_SIGMA,
    RANK_CONFIDENCE,
    LatencyWindow,
    OutcomeWindow,
    fails_beyond,
    lower_bound_rank,
    winning_delay,
)
from .samples import (
    CANCELLED,
    ERROR,
    INTERRUPTED,
    OK,
    OUTBOX_MAXLEN,
    OUTCOMES,
    RATE_LIMITED,
    SAMPLE_KINDS,
    TIMEOUT,
    Outcome,
    SampleEvent,
    SampleJournal,
    class_label,
    estimate_prompt_tokens,
    prompt_class,
)
from .stats_report import ClassSnapshot, ServerMetrics, StatsReport, TargetSnapshot
from .target_stats import EXPLORATIONS_KEPT, FAILING_RANK, StatsSettings, TargetStats

__all__ = [
    "BEYOND_SAMPLES",
    "CANCELLED",
    "ERROR",
    "EXPLORATIONS_KEPT",
    "FAILING_ALPHA",
    "FAILING_RANK",
    "FALSE_ALARM_RATE",
    "FIRST_TOKEN_FLOOR",
    "FIRST_TOKEN_MULTIPLE",
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
    "SHIFT_MIN",
    "SMALL_WINDOW_MARGIN",
    "STALL_FLOOR",
    "STALL_MULTIPLE",
    "STALL_PRIOR",
    "STALL_STREAM_FLOOR",
    "STALL_STREAM_GAPS",
    "STALL_STREAM_MULTIPLE",
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
