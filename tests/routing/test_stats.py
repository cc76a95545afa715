from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmroute.routing.stats import (
    CANCELLED,
    ERROR,
    INTERRUPTED,
    OK,
    OUTCOMES,
    RATE_LIMITED,
    TIMEOUT,
    ClassSnapshot,
    LatencyWindow,
    LiveStats,
    Outcome,
    OutcomeWindow,
    StatsSettings,
    TargetStats,
    class_label,
    estimate_prompt_tokens,
    prompt_class,
)

from ..clock import FakeClock


def reference_quantile(values: list[float], q: float) -> float:
    data = sorted(values)
    position = (len(data) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (position - low)


def prior(q: float, median: float = 1.0) -> float:
    return median * math.exp(statistics.NormalDist().inv_cdf(q) * 0.5)


# LatencyWindow


def test_quantiles_match_statistics_inclusive() -> None:
    rng = random.Random(7)
    values = [rng.lognormvariate(0, 0.7) for _ in range(500)]
    window = LatencyWindow(clock=FakeClock())
    for value in values:
        window.add(value)
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    for percent, expected in enumerate(cuts, start=1):
        assert window.quantile(percent / 100) == pytest.approx(expected, rel=1e-12)
    assert window.quantile(0.0) == min(values)
    assert window.quantile(1.0) == max(values)
    assert window.mean() == pytest.approx(statistics.fmean(values), rel=1e-12)
    assert len(window) == 500


@given(
    st.lists(st.floats(min_value=0.0, max_value=1e4), min_size=1, max_size=60),
    st.floats(min_value=0.0, max_value=1.0),
)
def test_quantile_matches_sorted_reference(values: list[float], q: float) -> None:
    window = LatencyWindow(clock=FakeClock())
    for value in values:
        window.add(value)
    result = window.quantile(q)
    assert result is not None
    assert result == pytest.approx(reference_quantile(values, q), rel=1e-9, abs=1e-9)
    assert min(values) <= result <= max(values)


def test_empty_window_answers_none() -> None:
    window = LatencyWindow(clock=FakeClock())
    assert window.quantile(0.5) is None
    assert window.mean() is None
    assert window.newest_at() is None
    assert len(window) == 0


def test_single_sample_is_every_quantile() -> None:
    window = LatencyWindow(clock=FakeClock())
    window.add(0.25)
    assert [window.quantile(q) for q in (0.0, 0.5, 0.99, 1.0)] == [0.25] * 4


def test_samples_age_out_of_the_window() -> None:
    clock = FakeClock()
    window = LatencyWindow(window=10.0, clock=clock)
    window.add(5.0)
    clock.advance(6.0)
    window.add(1.0)
    assert len(window) == 2
    assert window.quantile(1.0) == 5.0
    clock.advance(4.0)  # the first sample is now exactly 10 s old
    assert len(window) == 1
    assert window.quantile(1.0) == 1.0
    assert window.newest_at() == clock.now - 4.0
    clock.advance(6.0)
    assert len(window) == 0
    assert window.quantile(0.5) is None


def test_count_bound_drops_the_oldest() -> None:
    clock = FakeClock()
    window = LatencyWindow(max_samples=3, clock=clock)
    for value in (9.0, 1.0, 2.0, 3.0):
        window.add(value)
        clock.advance(1.0)
    assert len(window) == 3
    assert window.quantile(1.0) == 3.0  # 9.0, the oldest, is gone
    assert window.mean() == pytest.approx(2.0)


def test_duplicate_values_leave_one_at_a_time() -> None:
    window = LatencyWindow(max_samples=2, clock=FakeClock())
    for value in (1.0, 1.0, 2.0):
        window.add(value)
    assert len(window) == 2
    assert (window.quantile(0.0), window.quantile(1.0)) == (1.0, 2.0)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_samples_are_refused(bad: float) -> None:
    window = LatencyWindow(clock=FakeClock())
    with pytest.raises(ValueError, match="finite"):
        window.add(bad)
    assert len(window) == 0


def test_window_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="window"):
        LatencyWindow(window=0.0)
    with pytest.raises(ValueError, match="max_samples"):
        LatencyWindow(max_samples=0)
    with pytest.raises(ValueError, match="q must be"):
        LatencyWindow().quantile(1.5)


# OutcomeWindow


def test_outcome_counts_and_rates() -> None:
    outcomes = OutcomeWindow(clock=FakeClock())
    assert outcomes.rate(OK) == 0.0
    assert outcomes.count() == 0
    for outcome in [OK] * 6 + [ERROR] * 3 + [TIMEOUT]:
        outcomes.add(outcome)
    assert outcomes.count() == 10
    assert outcomes.count(ERROR) == 3
    assert outcomes.count(RATE_LIMITED) == 0
    assert outcomes.rate(OK) == pytest.approx(0.6)
    assert outcomes.counts() == {OK: 6, ERROR: 3, TIMEOUT: 1}


def test_outcomes_age_out() -> None:
    clock = FakeClock(0.0)
    outcomes = OutcomeWindow(window=60.0, clock=clock)  # 1 s buckets
    outcomes.add(ERROR)
    clock.advance(30.0)
    outcomes.add(OK)
    clock.advance(29.9)
    assert outcomes.count() == 2  # everything younger than the window counts
    clock.advance(1.2)  # the error is over a window plus a bucket old
    assert outcomes.count() == 1
    assert outcomes.rate(OK) == 1.0
    assert outcomes.count(ERROR) == 0
    clock.advance(31.0)
    assert outcomes.count() == 0
    assert outcomes.rate(OK) == 0.0


def test_outcome_memory_is_bounded_by_buckets() -> None:
    clock = FakeClock(0.0)
    outcomes = OutcomeWindow(window=60.0, clock=clock, buckets=60)
    for _ in range(10_000):
        outcomes.add(OK)
        clock.advance(0.05)
    assert len(outcomes._buckets) <= 61
    assert 1190 <= outcomes.count() <= 1220  # 60 s to 61 s of outcomes at 20 a second


# prompt classes and token estimates


def test_prompt_classes() -> None:
    bounds = (1024, 8192, 32768)
    assert [prompt_class(t, bounds) for t in (0, 1023, 1024, 8191, 8192, 32767)] == [
        0,
        0,
        1,
        1,
        2,
        2,
    ]
    assert prompt_class(32768, bounds) == 3
    assert prompt_class(10**7, bounds) == 3
    assert [class_label(i, bounds) for i in range(4)] == ["<1k", "1k-8k", "8k-32k", ">=32k"]
    assert class_label(1, (500, 2000)) == "500-2k"
    with pytest.raises(ValueError):
        class_label(4, bounds)


def test_estimate_prompt_tokens() -> None:
    messages = [
        {"role": "system", "content": "x" * 40},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "y" * 20},
                {"type": "image_url", "image_url": {"url": "data:" + "z" * 9999}},
            ],
        },
        {"role": "assistant", "content": None, "tool_calls": []},
    ]
    assert estimate_prompt_tokens(messages) == 60 // 4 + 3 * 4
    assert estimate_prompt_tokens([]) == 0


# StatsSettings


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"window": 0.0}, "window"),
        ({"max_samples": 0}, "max_samples"),
        ({"prompt_classes": ()}, "prompt_classes"),
        ({"prompt_classes": (8192, 1024)}, "prompt_classes"),
        ({"prior_ttft": 0.0}, "prior_ttft"),
        ({"prior_weight": -1.0}, "prior_weight"),
        ({"min_samples": 0}, "min_samples"),
    ],
)
def test_settings_are_checked(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        StatsSettings(**kwargs)


# TargetStats


def make_target(**settings: Any) -> tuple[TargetStats, FakeClock]:
    clock = FakeClock()
    return TargetStats("a", StatsSettings(**settings), clock), clock


def test_cold_target_predicts_the_prior() -> None:
    target, _ = make_target()
    assert target.predict(0.5, 100) == pytest.approx(1.0)
    assert target.predict(0.95, 100) == pytest.approx(prior(0.95))
    assert target.predict(0.95, 100) > target.predict(0.5, 100)
    assert target.predict_latency(0.5) == pytest.approx(4.0)
    assert target.predict_latency(0.9) == pytest.approx(prior(0.9, 4.0))


def test_prediction_blends_and_converges_to_observed() -> None:
    target, _ = make_target(max_samples=4096)
    target.record_ttft(0.2, 100)
    assert target.predict(0.5, 100) == pytest.approx((1 * 0.2 + 3 * 1.0) / 4)
    for _ in range(3):  # 4 samples: still below min_samples, so still blended
        target.record_ttft(0.2, 100)
    assert target.predict(0.5, 100) == pytest.approx((4 * 0.2 + 3 * 1.0) / 7)
    target.record_ttft(0.2, 100)  # min_samples reached: the observed value alone
    assert target.predict(0.5, 100) == pytest.approx(0.2)


def test_prediction_without_prior_weight_is_observed() -> None:
    target, _ = make_target(prior_weight=0.0)
    for value in (0.1, 0.2, 0.3):
        target.record_ttft(value, 100)
    assert target.predict(0.5, 100) == pytest.approx(0.2)


def test_classes_are_separate_and_fall_back_to_all() -> None:
    target, _ = make_target(min_samples=5, prior_weight=0.0)
    for _ in range(10):
        target.record_ttft(0.1, 100)  # short prompts are fast
    target.record_ttft(2.0, 20_000)  # long ones are slow: one counts as much as the rest
    assert target.predict(0.5, 20_000) == pytest.approx((2.0 + 0.1) / 2)
    for _ in range(3):  # four, still too few to trust alone: the median of all 14 as one more
        target.record_ttft(2.0, 20_000)
    assert target.predict(0.5, 20_000) == pytest.approx((4 * 2.0 + 0.1) / 5)
    target.record_ttft(2.0, 20_000)
    assert target.predict(0.5, 20_000) == pytest.approx(2.0)
    assert target.predict(0.5, 100) == pytest.approx(0.1)
    assert target.predict(0.5, 5000) == pytest.approx(target.snapshot().ttft_p50)  # empty class
    snapshot = target.snapshot()
    assert snapshot.by_class == {
        "<1k": ClassSnapshot(n=10, ttft_p50=0.1, ttft_p95=0.1, ttft_p99=0.1),
        "8k-32k": ClassSnapshot(n=5, ttft_p50=2.0, ttft_p95=2.0, ttft_p99=2.0),
    }
    # the other way round: a fast class of a slow target is believed as soon
    for _ in range(5):
        target.record_ttft(2.0, 5000)
    assert target.predict(0.95, 40_000) == pytest.approx(2.0)  # an empty class: all of them
    target.record_ttft(0.3, 40_000)
    assert target.predict(0.95, 40_000) == pytest.approx((0.3 + 2.0) / 2)


def test_predict_checks_q() -> None:
    target, _ = make_target()
    for q in (0.0, 1.0):
        with pytest.raises(ValueError, match="q must be"):
            target.predict(q, 100)


def test_ttft_ages_out_back_to_the_prior() -> None:
    target, clock = make_target(window=60.0)
    for _ in range(20):
        target.record_ttft(0.1, 100)
    assert target.newest_at() == clock.now
    assert target.predict(0.5, 100) < 0.3
    clock.advance(60.0)
    assert target.newest_at() is None
    assert target.predict(0.5, 100) == pytest.approx(1.0)


def test_censored_samples_never_lower_p95() -> None:
    target, _ = make_target(max_samples=100_000)
    rng = random.Random(3)
    for _ in range(200):
        target.record_ttft(rng.lognormvariate(-1, 0.5), 100)
    p95 = target.snapshot().ttft_p95
    assert p95 is not None
    recorded = 0
    for _ in range(300):
        elapsed = rng.uniform(0.0, 2 * p95)
        shifts, held = target.shifts, target.snapshot().n
        recorded += target.record_censored(elapsed, 100)
        now = target.snapshot()
        assert now.ttft_p95 is not None
        # A run of them is a change of regime: the window restarts, and while it holds fewer
        # than min_samples the rule is about the prediction, blended with the prior.
        if target.shifts == shifts and held >= 5:
            assert now.ttft_p95 >= p95
        assert now.by_class["<1k"].ttft_p95 == now.ttft_p95
        p95 = now.ttft_p95
    assert 0 < recorded < 300


def test_censored_fast_cancellation_is_ignored() -> None:
    target, _ = make_target()
    for value in (0.5, 0.6, 0.7, 0.8, 0.9):
        target.record_ttft(value, 100)
    before = target.snapshot()
    assert target.record_censored(0.05, 100) is False
    after = target.snapshot()
    assert after.n == before.n == 5
    assert after.ttft_p50 == before.ttft_p50


def test_censored_sample_in_an_empty_class_must_beat_the_prior() -> None:
    target, _ = make_target()
    for _ in range(5):
        target.record_ttft(3.0, 100)
    # An empty class has the prior's p95 (about 2.3 s): a short cancellation says nothing.
    assert target.record_censored(0.05, 50_000) is False
    assert target.record_censored(2.5, 50_000) is True
    snapshot = target.snapshot()
    assert snapshot.by_class[">=32k"].n == 1
    assert snapshot.n == 5  # 2.5 s is under the pooled p95, so it stays out of the pool


def test_outcome_rates() -> None:
    target, _ = make_target()
    counts: dict[Outcome, int] = {
        OK: 5,
        ERROR: 1,
        TIMEOUT: 1,
        RATE_LIMITED: 1,
        CANCELLED: 10,
        INTERRUPTED: 1,
    }
    for outcome, times in counts.items():
        for _ in range(times):
            target.record_outcome(outcome)
    assert target.error_rate() == pytest.approx(3 / 9)
    snapshot = target.snapshot()
    assert snapshot.error_rate == pytest.approx(3 / 9)
    assert snapshot.timeout_rate == pytest.approx(1 / 9)
    assert snapshot.rate_limited_rate == pytest.approx(1 / 9)
    assert snapshot.outcomes == counts
    with pytest.raises(ValueError, match="unknown outcome"):
        target.record_outcome("boom")


def test_only_cancellations_is_no_error() -> None:
    target, _ = make_target()
    target.record_outcome(CANCELLED)
    assert target.error_rate() == 0.0
    assert set(OUTCOMES) == set(target.snapshot().outcomes)


def test_in_flight_counts_and_never_goes_negative() -> None:
    target, _ = make_target()
    target.load.started()
    target.load.started()
    target.load.finished()
    assert target.snapshot().in_flight == 1
    target.load.finished()
    target.load.finished()
    assert target.load.in_flight == 0


def test_snapshot_of_a_busy_target() -> None:
    target, _ = make_target()
    assert target.snapshot().ttft_p50 is None
    for value in (0.1, 0.2, 0.3, 0.4):
        target.record_ttft(value, 100)
    target.record_stream(0.02, 50.0)
    target.record_stream(None, 70.0)
    target.record_latency(2.0)
    snapshot = target.snapshot()
    assert snapshot.n == 4
    assert snapshot.ttft_p50 == pytest.approx(0.25)
    assert snapshot.ttft_mean == pytest.approx(0.25)
    assert snapshot.itl_p50 == 0.02
    assert snapshot.tokens_per_s == pytest.approx(60.0)
    assert snapshot.latency_p50 == snapshot.latency_p95 == 2.0
    assert snapshot.breaker == "closed"
    data = snapshot.to_dict()
    assert data["by_class"]["<1k"]["n"] == 4
    assert data["name"] == "a"


# LiveStats


def test_live_stats_creates_targets_on_first_use() -> None:
    clock = FakeClock()
    live = LiveStats(StatsSettings(prior_ttft=0.5), clock)
    assert live.names() == []
    a = live.target("a")
    assert live.target("a") is a
    live.target("b").record_ttft(0.3, 10)
    assert live.names() == ["a", "b"]
    snapshots = live.snapshot()
    assert snapshots["b"].n == 1
    assert snapshots["a"].n == 0
    assert a.predict(0.5, 10) == pytest.approx(0.5)


@given(
    st.lists(st.floats(0.0, 10.0), min_size=0, max_size=40),
    st.lists(st.floats(0.0, 10.0), min_size=1, max_size=6),
    st.floats(0.0, 1.0),
)
def test_quantile_with_extra_values_matches_a_merged_reference(
    values: list[float], extra: list[float], q: float
) -> None:
    window = LatencyWindow(clock=lambda: 0.0)
    for value in values:
        window.add(value)
    reference = LatencyWindow(clock=lambda: 0.0)
    for value in values + extra:
        reference.add(value)
    assert window.quantile_with(extra, q) == pytest.approx(reference.quantile(q))


def test_a_stall_in_progress_raises_the_prediction() -> None:
    target, clock = make_target()
    for value in [0.25] * 40:
        target.record_ttft(value, 100)
    assert target.predict(0.95, 100) == pytest.approx(0.25)
    handles = [target.waiting() for _ in range(4)]  # four attempts wait for a first token
    clock.advance(0.2)
    assert target.predict(0.95, 100) == pytest.approx(0.25)  # not overdue yet
    clock.advance(2.0)  # 2.2 s: four stalls in progress out of 44 is more than 5%
    assert target.predict(0.95, 100) > 2.0
    assert target.predict(0.5, 100) == pytest.approx(0.25)
    for handle in handles:
        target.done_waiting(handle)
    assert target.predict(0.95, 100) == pytest.approx(0.25)
    assert target.snapshot().n == 40  # waiting attempts are never recorded as samples


def test_the_stats_report_is_a_dict_that_prints_as_a_table() -> None:
    from llmroute.routing.stats import LiveStats, StatsReport, TargetSnapshot

    clock = FakeClock()
    stats = LiveStats(clock=clock)
    fast = stats.target("openai:gpt-6-luna")
    for ttft in (0.1, 0.2, 0.3):
        fast.record_ttft(ttft, 100)
        fast.record_outcome("ok")
    fast.record_stream(0.02, 50.0)
    slow = stats.target("deepseek:deepseek-v4-flash")
    slow.record_outcome("error")
    slow.record_latency(1.5)  # a request not streamed: its whole answer
    report = stats.snapshot()
    # Existing callers keep a dict of TargetSnapshot.
    assert isinstance(report, StatsReport) and isinstance(report, dict)
    assert list(report) == ["openai:gpt-6-luna", "deepseek:deepseek-v4-flash"]
    assert isinstance(report["openai:gpt-6-luna"], TargetSnapshot)
    assert report["openai:gpt-6-luna"].n == 3
    assert report == dict(report)
    assert report.to_dict()["openai:gpt-6-luna"]["ttft_p50"] == pytest.approx(0.2)
    lines = str(report).splitlines()
    assert lines[0].split() == [
        "target", "n", "TTFT", "p50", "p95", "p99", "ITL", "p50", "tokens/s", "whole", "p50",
        "errors", "in", "flight", "circuit",
    ]  # fmt: skip
    assert lines[1].split() == [
        "openai:gpt-6-luna", "3", "200", "ms", "290", "ms", "298", "ms", "20", "ms", "50", "-",
        "0%", "0", "closed",
    ]  # fmt: skip
    assert lines[2].split() == [
        "deepseek:deepseek-v4-flash", "0", "-", "-", "-", "-", "-", "1500", "ms", "100%", "0",
        "closed",
    ]  # fmt: skip
    assert str(report) in repr(report)
    assert str(StatsReport()).startswith("no targets yet")


def test_a_streams_own_stall_deadline_follows_its_longest_pause_floored_and_capped() -> None:
    from llmroute.routing.stats import STALL_STREAM_FLOOR, stream_stall_deadline

    gaps = [0.012, 0.009, 0.031, 0.011]  # recorded pauses of a vendor streaming every ~10 ms
    assert stream_stall_deadline(max(gaps), 0.3, prior=10.0) == STALL_STREAM_FLOOR
    assert stream_stall_deadline(0.75, 0.3, prior=10.0) == 6.0  # 8x its longest pause
    assert stream_stall_deadline(0.01, 7.5, prior=10.0) == 7.5  # its own first-token time
    assert stream_stall_deadline(2.0, 0.3, prior=10.0) == 10.0  # never longer than before
    assert stream_stall_deadline(0.01, None, prior=3.0) == 3.0  # only ever shortens


def test_the_stall_deadline_is_a_multiple_of_the_longest_pauses_floored_and_capped() -> None:
    from llmroute.routing.stats import stall_deadline

    assert stall_deadline(None, cap=30.0) == 10.0  # no statistic: the prior
    assert stall_deadline(None, cap=5.0) == 5.0
    assert stall_deadline(0.05, cap=30.0) == 2.0  # the floor
    assert stall_deadline(1.5, cap=30.0) == 6.0  # 4x the p99 longest pause
    assert stall_deadline(20.0, cap=30.0) == 30.0  # the cap


def test_longest_pauses_count_once_there_are_enough_streams() -> None:
    from llmroute.routing.stats import TargetStats

    stats = TargetStats("a:m", clock=FakeClock())
    for gap in (0.1, 0.2, 0.1, 0.3):
        stats.record_gap(gap)
    assert stats.gap_quantile(0.99) is None
    stats.record_gap(0.2)
    quantile = stats.gap_quantile(0.99)
    assert quantile is not None and 0.2 <= quantile <= 0.3


# -- item 1 of issue 16: a change of regime shows within about one p95 -----------------------


def steady_samples(seed: int, n: int, median: float, sigma: float = 0.2) -> list[float]:
    rng = random.Random(seed)
    return [rng.lognormvariate(math.log(median), sigma) for _ in range(n)]


def record_every_50ms(target: TargetStats, clock: FakeClock, values: Iterable[float]) -> None:
    """Record ``values`` as first tokens of 100-token prompts, 50 ms apart."""
    for value in values:
        clock.advance(0.05)
        target.record_ttft(value, 100)


def steady_target(seed: int, n: int, median: float) -> tuple[TargetStats, FakeClock]:
    """A target that has seen ``n`` steady samples around ``median``, 50 ms apart."""
    target, clock = make_target()
    record_every_50ms(target, clock, steady_samples(seed, n, median))
    return target, clock


def test_quantile_without_the_newest_matches_a_window_of_the_older_ones() -> None:
    values = steady_samples(1, 60, 0.3)
    window = LatencyWindow(clock=lambda: 0.0)
    older = LatencyWindow(clock=lambda: 0.0)
    for index, value in enumerate(values):
        window.add(value)
        if index < 50:
            older.add(value)
    for q in (0.05, 0.5, 0.95):
        assert window.quantile_without(10, q) == pytest.approx(older.quantile(q))
    assert window.newest(3) == values[-3:]
    assert window.quantile_without(60, 0.5) is None
    window.keep_newest(4)
    assert len(window) == 4
    assert window.quantile(0.0) == min(values[-4:])


def test_a_target_that_got_slow_is_predicted_slow_after_half_the_short_view() -> None:
    target, clock = steady_target(2, 200, 0.25)
    before = target.predict(0.95, 100)
    assert before < 0.4
    shifts = target.shifts  # a few while the windows were small: their range was narrow
    slow = steady_samples(3, 5, 1.0)  # four times slower: five samples of the new regime
    for count, value in enumerate(slow, 1):
        clock.advance(0.05)
        target.record_ttft(value, 100)
        if count < 2:  # (by the second, with an older tail sample: three at the window's top)
            assert target.shifts == shifts
    assert target.shifts == shifts + 2  # the class window and the pooled one
    assert target.predict(0.95, 100) > 0.9  # the 200 older samples no longer count
    assert target.predict(0.5, 100) > 0.5
    assert target.snapshot().n <= 10


def test_a_steady_heavy_tailed_target_does_not_shift() -> None:
    # A's profile in benchmarks/routing.py: 10% stalls of +1.5..3 s.
    target, clock = make_target()
    rng = random.Random(4)
    shifts = 0
    for index in range(3100):
        if index == 100:
            shifts = target.shifts
        clock.advance(0.05)
        value = rng.lognormvariate(math.log(0.25), 0.2)
        if rng.random() < 0.1:
            value += rng.uniform(1.5, 3.0)
        target.record_ttft(value, 100)
    assert target.shifts - shifts <= 4  # about one check in 8,000 per window when steady


def test_hedges_that_keep_beating_a_target_make_it_slow() -> None:
    # Each hedge that answered first cancels this target's attempt past its p95: a censored
    # sample of at least that long. Four of them in a row are a change (five of the ten
    # newest samples are too, below).
    target, clock = steady_target(5, 100, 0.25)
    p95 = target.predict(0.95, 100)
    shifts = target.shifts
    for count in range(1, 5):
        clock.advance(0.05)
        assert target.record_censored(p95 * 1.5, 100)
        assert target.shifts == (shifts if count < 4 else shifts + 2)
    assert target.predict(0.95, 100) >= p95 * 1.5 * 0.99
    assert not target.cold()  # four samples that say it is slow: known, not cold


def test_a_real_sample_between_censored_ones_breaks_their_run() -> None:
    target, clock = steady_target(5, 100, 0.25)
    p95 = target.predict(0.95, 100)
    shifts = target.shifts
    for value in (1.5, 1.5, 0.25, 1.5):  # (x p95) censored, censored, a first token, ...
        clock.advance(0.05)
        if value < 1:
            target.record_ttft(value, 100)
        else:
            target.record_censored(p95 * value, 100)
    assert target.shifts == shifts  # three censored, never three in a row, none of k all above
    clock.advance(0.05)
    target.record_censored(p95 * 1.5, 100)  # four of the five newest above all 100 older ones
    assert target.shifts == shifts + 2


def test_a_slow_target_that_got_fast_again_is_predicted_fast() -> None:
    target, clock = steady_target(6, 100, 1.0)
    assert target.predict(0.95, 100) > 1.0
    shifts = target.shifts
    record_every_50ms(target, clock, steady_samples(7, 5, 0.25))  # re-measured: fast again
    assert target.shifts == shifts + 2
    assert target.predict(0.95, 100) < 0.4


def test_attempts_waiting_past_the_p95_show_a_change_before_they_end() -> None:
    target, clock = steady_target(8, 200, 0.25)
    p95 = target.predict(0.95, 100)
    handles = [target.waiting() for _ in range(3)]  # three attempts now wait
    clock.advance(p95 * 0.9)
    assert target.predict(0.95, 100) == pytest.approx(p95)  # not past the p95 yet
    clock.advance(p95 * 0.5)  # 1.4 x p95: three waits past the tail at once
    assert target.predict(0.95, 100) >= p95 * 1.3
    clock.advance(1.0)
    assert target.predict(0.95, 100) >= p95 + 1.0  # it grows while they wait
    for handle in handles:
        target.done_waiting(handle)
    assert target.predict(0.95, 100) == pytest.approx(p95)


def test_one_attempt_past_the_p95_is_not_a_change() -> None:
    target, clock = steady_target(9, 200, 0.25)
    p95 = target.predict(0.95, 100)
    handle = target.waiting()
    clock.advance(p95 * 3)
    assert target.predict(0.95, 100) < p95 * 1.1  # one stall in 200 samples: the tail holds
    target.done_waiting(handle)


def test_short_view_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="recent"):
        StatsSettings(recent=1)
