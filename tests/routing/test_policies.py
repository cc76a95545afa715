"""Policy decisions on recorded samples, with an injectable clock (no network, no sleeps)."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from llmroute.routing.health import CircuitBreaker, TargetHealth
from llmroute.routing.policies import (
    FailoverPolicy,
    FastestPolicy,
    HedgePolicy,
    Plan,
    RacePolicy,
    WeightedPolicy,
    explore,
)
from llmroute.routing.stats import LiveStats, StatsSettings

from ..clock import FakeClock

# Recorded TTFTs (seconds) of three targets: A is fast but stalls 1 in 10, B is steady and a bit
# slower, C is slow and steady. Each list repeats to 100 samples.
A = [0.21, 0.25, 0.24, 0.31, 0.22, 0.27, 0.26, 0.23, 0.29, 2.4] * 10
B = [0.38, 0.41, 0.40, 0.44, 0.39, 0.42, 0.37, 0.43, 0.40, 0.45] * 10
C = [0.70] * 100


class View:
    """The engine's view, over real LiveStats and health fed with recorded samples."""

    def __init__(
        self, clock: FakeClock, samples: dict[str, list[float]], tokens: int = 100
    ) -> None:
        self.clock = clock
        self.stats = LiveStats(StatsSettings(window=300.0), clock=clock)
        self.health = {
            name: TargetHealth(CircuitBreaker(failures=2, cooldown=30.0, clock=clock), clock=clock)
            for name in samples
        }
        self.tokens = tokens
        for name, values in samples.items():
            for value in values:
                self.stats.target(name).record_ttft(value, tokens)

    def predict(self, target: str, q: float | None) -> float:
        return self.stats.target(target).predict(q if q is not None else 0.5, self.tokens)

    def available(self, target: str) -> bool:
        return self.health[target].available()

    def cold(self, target: str) -> bool:
        return self.stats.target(target).cold()

    def staleness(self, target: str) -> float:
        newest = self.stats.target(target).newest_at()
        return math.inf if newest is None else self.clock() - newest

    def load(self, target: str) -> float:
        return float(self.stats.target(target).load.in_flight)

    def messages(self) -> Sequence[Mapping[str, Any]]:
        return ()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_fastest_ranks_by_p95_so_a_stalling_target_loses(clock: FakeClock) -> None:
    view = View(clock, {"A": A, "B": B, "C": C})
    plan = FastestPolicy(rank_by="p95").plan(["A", "B", "C"], view, random.Random(0))
    assert plan.order == ("B", "C", "A")  # A's p95 is in its stall tail
    assert plan.start == 1 and plan.hedge_delays == ()


def test_fastest_by_median_prefers_the_fast_body(clock: FakeClock) -> None:
    view = View(clock, {"A": A, "B": B, "C": C})
    plan = FastestPolicy(rank_by="p50").plan(["C", "B", "A"], view, random.Random(0))
    assert plan.order == ("A", "B", "C")


def test_hedge_delay_is_the_primarys_live_p95(clock: FakeClock) -> None:
    view = View(clock, {"A": A, "B": B, "C": C})
    policy = HedgePolicy(rank_by="p95", hedge_after="p95")
    plan = policy.plan(["A", "B", "C"], view, random.Random(0))
    # B is steadiest; once B is late, A (median 0.25 s) answers sooner than C (0.7 s), most
    # of the time, although A's own tail is the worst.
    assert plan.order == ("B", "A", "C")
    assert plan.hedge_delays == pytest.approx((view.predict("B", 0.95),))
    assert 0.43 <= (plan.hedge_delays[0] or 0.0) <= 0.46  # B's recorded p95


def test_hedge_with_fixed_delay_and_more_hedges(clock: FakeClock) -> None:
    view = View(clock, {"A": A, "B": B, "C": C})
    policy = HedgePolicy(rank_by="p50", hedge_after=0.3, max_hedges=2)
    plan = policy.plan(["A", "B", "C"], view, random.Random(0))
    assert plan.order == ("A", "B", "C")
    assert plan.hedge_delays == (0.3, 0.3)
    assert plan.hedge_delay(2) is None


def test_cold_targets_get_the_prior_and_keep_config_order(clock: FakeClock) -> None:
    view = View(clock, {"X": [], "Y": []})
    plan = HedgePolicy().plan(["X", "Y"], view, random.Random(0))
    assert plan.order == ("X", "Y")
    prior_p95 = 1.0 * math.exp(0.5 * 1.6448536269514722)
    assert plan.hedge_delays[0] == pytest.approx(prior_p95, rel=1e-6)


def test_stats_age_out_of_the_window(clock: FakeClock) -> None:
    view = View(clock, {"A": A, "B": B})
    assert FastestPolicy().plan(["A", "B"], view, random.Random(0)).order[0] == "B"
    clock.now += 301.0  # every recorded sample is now stale
    for value in [0.2] * 10:  # A recovered: only fresh samples count
        view.stats.target("A").record_ttft(value, 100)
    assert FastestPolicy().plan(["A", "B"], view, random.Random(0)).order[0] == "A"


def test_prompt_length_classes_rank_separately(clock: FakeClock) -> None:
    # A is fast on short prompts but slow on long ones (prefill); B is the reverse.
    stats_view = View(clock, {"A": [], "B": []})
    for _ in range(20):
        stats_view.stats.target("A").record_ttft(0.2, 100)
        stats_view.stats.target("A").record_ttft(2.0, 20_000)
        stats_view.stats.target("B").record_ttft(0.5, 100)
        stats_view.stats.target("B").record_ttft(0.9, 20_000)
    short = FastestPolicy().plan(["A", "B"], stats_view, random.Random(0))
    stats_view.tokens = 20_000
    long = FastestPolicy().plan(["A", "B"], stats_view, random.Random(0))
    assert short.order[0] == "A"
    assert long.order[0] == "B"


def test_unavailable_targets_go_last(clock: FakeClock) -> None:
    view = View(clock, {"A": A, "B": B, "C": C})
    for _ in range(2):
        view.health["B"].breaker.record_failure()
    assert view.health["B"].breaker.state == "open"
    assert FastestPolicy().plan(["A", "B", "C"], view, random.Random(0)).order == ("C", "A", "B")
    view.health["C"].cool_down(5.0)
    assert FailoverPolicy().plan(["A", "B", "C"], view, random.Random(0)).order == ("A", "B", "C")
    assert FastestPolicy().plan(["A", "B", "C"], view, random.Random(0)).order[0] == "A"
    clock.now += 31.0  # B's cooldown ended: a probe may go, so it ranks normally again
    assert FastestPolicy().plan(["A", "B", "C"], view, random.Random(0)).order[0] == "B"


def test_race_starts_k_best(clock: FakeClock) -> None:
    view = View(clock, {"A": A, "B": B, "C": C})
    plan = RacePolicy(k=2).plan(["A", "B", "C"], view, random.Random(0))
    assert plan.start == 2 and plan.order[:2] == ("B", "C")
    assert RacePolicy(k=5).plan(["A", "B"], view, random.Random(0)).start == 2


def test_failover_keeps_the_configured_order(clock: FakeClock) -> None:
    view = View(clock, {"A": A, "B": B, "C": C})
    plan = FailoverPolicy().plan(["C", "A", "B"], view, random.Random(0))
    assert plan.order == ("C", "A", "B") and plan.hedge_delays == ()


def test_weighted_first_choice_follows_the_weights(clock: FakeClock) -> None:
    view = View(clock, {"A": A, "B": B, "C": C})
    policy = WeightedPolicy(weights=(6.0, 3.0, 1.0))
    rng = random.Random(42)
    firsts = Counter(policy.plan(["A", "B", "C"], view, rng).order[0] for _ in range(20_000))
    assert firsts["A"] / 20_000 == pytest.approx(0.6, abs=0.02)
    assert firsts["B"] / 20_000 == pytest.approx(0.3, abs=0.02)
    assert firsts["C"] / 20_000 == pytest.approx(0.1, abs=0.02)


def test_explore_moves_the_stalest_target_first(clock: FakeClock) -> None:
    view = View(clock, {"A": A, "B": B, "C": []})
    plan = HedgePolicy().plan(["A", "B", "C"], view, random.Random(0))
    explored = explore(
        plan,
        view,
        share=1.0,
        max_age=60.0,
        rng=random.Random(0),
        hedge_delay=lambda t: view.predict(t, 0.95),
    )
    assert explored.explored == "C" and explored.order[0] == "C"
    assert sorted(explored.order) == ["A", "B", "C"]
    assert explored.hedge_delays[0] == pytest.approx(view.predict("C", 0.95))


def test_explore_leaves_fresh_targets_and_respects_the_share(clock: FakeClock) -> None:
    view = View(clock, {"A": A, "B": B, "C": C})
    plan = FastestPolicy().plan(["A", "B", "C"], view, random.Random(0))
    assert explore(plan, view, share=1.0, max_age=60.0, rng=random.Random(0)) is plan
    clock.now += 120.0  # everything is stale now
    rng = random.Random(7)
    runs = [explore(plan, view, share=0.05, max_age=60.0, rng=rng) for _ in range(10_000)]
    share = sum(p.explored is not None for p in runs) / len(runs)
    assert 0.04 <= share <= 0.06
    assert explore(plan, view, share=0.0, max_age=60.0, rng=rng) is plan


def test_plan_hedge_delay_lookup() -> None:
    plan = Plan(("A", "B"), hedge_delays=(0.5,))
    assert plan.hedge_delay(0) == 0.5
    assert plan.hedge_delay(1) is None


def test_a_cold_target_is_explored_at_the_cold_share_until_it_has_samples(clock: FakeClock) -> None:
    view = View(clock, {"A": B, "B": []})  # A steady at about 0.4 s; B never seen
    plan = FastestPolicy().plan(["A", "B"], view, random.Random(0))
    assert plan.order == ("A", "B")
    rng = random.Random(3)
    runs = [explore(plan, view, share=0.02, max_age=60.0, rng=rng) for _ in range(10_000)]
    share = sum(p.explored == "B" for p in runs) / len(runs)
    assert 0.23 <= share <= 0.27  # COLD_EXPLORE_SHARE, not the 2% for stale targets
    for _ in range(5):  # min_samples: B is no longer cold, and its stats are fresh
        view.stats.target("B").record_ttft(0.4, 100)
    assert all(explore(plan, view, share=0.02, max_age=60.0, rng=rng) is plan for _ in range(1000))


def test_a_race_explores_beside_its_racers_never_in_place_of_one(clock: FakeClock) -> None:
    view = View(clock, {"A": B, "B": [0.5] * 100, "C": []})  # C never seen: cold
    plan = RacePolicy(k=2).plan(["A", "B", "C"], view, random.Random(0))
    assert plan.order == ("A", "B", "C") and plan.start == 2
    explored = explore(plan, view, share=1.0, max_age=60.0, rng=random.Random(0))
    assert explored.explored == "C" and explored.start == 3
    assert explored.order == ("A", "B", "C")  # A and B still race; C is one more
    clock.now += 120.0  # every target is stale: only one the race does not start is explored
    pair = RacePolicy(k=2).plan(["A", "B"], view, random.Random(0))
    assert explore(pair, view, share=1.0, max_age=60.0, rng=random.Random(0)) is pair


def test_the_policy_classes_are_no_longer_exported_but_still_found_with_a_warning() -> None:
    import llmroute
    from llmroute.routing import policies

    assert not [name for name in llmroute.__all__ if name.endswith("Policy")]
    with pytest.warns(DeprecationWarning, match=r"llmroute\.HedgePolicy is no longer exported"):
        found = llmroute.HedgePolicy
    assert found is policies.HedgePolicy
    with pytest.raises(AttributeError, match="NoSuchPolicy"):
        llmroute.NoSuchPolicy  # noqa: B018
