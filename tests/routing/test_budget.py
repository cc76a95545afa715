from __future__ import annotations

import random

import pytest

from llmroute.routing.budget import HedgeBudget


def test_starts_full_and_spends_down() -> None:
    budget = HedgeBudget(ratio=0.1, burst=3.0)
    assert budget.tokens == 3.0
    assert [budget.try_spend() for _ in range(4)] == [True, True, True, False]
    assert budget.tokens == 0.0


def test_requests_earn_tokens_up_to_the_burst() -> None:
    budget = HedgeBudget(ratio=0.1, burst=2.0)
    assert budget.try_spend(2.0)
    for _ in range(9):
        budget.on_request()
    assert not budget.try_spend()
    budget.on_request()
    assert budget.try_spend()  # ten deposits of 0.1 buy one, despite float rounding
    for _ in range(1000):
        budget.on_request()
    assert budget.tokens == 2.0


def test_fractional_costs() -> None:
    budget = HedgeBudget(ratio=0.5, burst=1.0)
    assert budget.try_spend(0.75)
    assert not budget.try_spend(0.5)
    budget.on_request()
    assert budget.try_spend(0.5)
    assert budget.tokens == pytest.approx(0.25)


@pytest.mark.parametrize(("ratio", "burst"), [(0.1, 5.0), (0.05, 1.0), (1.0, 10.0), (0.3, 2.5)])
def test_spending_stays_within_ratio_and_burst(ratio: float, burst: float) -> None:
    budget = HedgeBudget(ratio=ratio, burst=burst)
    rng = random.Random(11)
    spent = 0
    requests = 10_000
    for _ in range(requests):
        budget.on_request()
        for _ in range(rng.randint(1, 3)):  # more demand than the budget allows
            spent += budget.try_spend()
    assert spent <= ratio * requests + burst
    assert spent >= ratio * requests - 1  # and the budget does get used


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"ratio": -0.1}, "ratio"),
        ({"ratio": 1.5}, "ratio"),
        ({"ratio": float("nan")}, "ratio"),
        ({"burst": 0.5}, "burst"),
    ],
)
def test_arguments_are_checked(kwargs: dict[str, float], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        HedgeBudget(**kwargs)


def test_negative_cost_is_refused() -> None:
    budget = HedgeBudget()
    with pytest.raises(ValueError, match="cost"):
        budget.try_spend(-1.0)
    assert budget.tokens == 5.0


def test_zero_ratio_allows_no_hedge_at_all() -> None:
    budget = HedgeBudget(ratio=0.0)
    for _ in range(100):
        budget.on_request()
        assert not budget.try_spend()


def test_a_winning_hedge_is_refunded() -> None:
    budget = HedgeBudget(ratio=0.1, burst=2.0)
    assert budget.try_spend() and budget.try_spend() and not budget.try_spend()
    budget.refund()  # the hedge answered first: it saved its request
    assert budget.tokens == 1.0 and budget.try_spend()
    for _ in range(5):
        budget.refund()
    assert budget.tokens == 2.0  # never above the burst
    off = HedgeBudget(ratio=0.0)
    off.refund()
    assert off.tokens == 0.0  # a budget of 0 stays closed
