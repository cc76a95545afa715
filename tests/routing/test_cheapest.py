"""Policy ``cheapest`` (the cheapest target that meets the latency goal), the expected price of
a request on a target, and the hedge budget in money."""

from __future__ import annotations

import datetime
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from openai.types.chat import ChatCompletionMessageParam

from llmroute import AsyncOpenAI, ConfigError
from llmroute._prices import ModelPrice
from llmroute.config import load_config
from llmroute.routing.budget import CostBudget
from llmroute.routing.cheapest import CheapestPolicy
from llmroute.routing.price import EXPECTED_ANSWER_TOKENS, answer_tokens, target_price
from llmroute.testing import Profile, Simulator

from ..conftest import KEY

# --- the policy, on recorded predictions --------------------------------------------------------


@dataclass
class View:
    """A RouteView of recorded predictions: (median, p95) by target, prices, a goal."""

    ttft: dict[str, tuple[float, float]]
    prices: dict[str, float | None] = field(default_factory=dict)
    goal: float | None = 0.5
    down: set[str] = field(default_factory=set)

    def predict(self, target: str, q: float | None) -> float:
        median, p95 = self.ttft[target]
        return median if q == 0.5 else p95

    def available(self, target: str) -> bool:
        return target not in self.down

    def staleness(self, target: str) -> float:
        return 0.0

    def cold(self, target: str) -> bool:
        return False

    def load(self, target: str) -> float:
        return 0.0

    def messages(self) -> Sequence[Mapping[str, Any]]:
        return ()

    def ttft_target(self) -> float | None:
        return self.goal

    def price(self, target: str) -> float | None:
        return self.prices.get(target)


# A dear fast target, a cheap slow one, one in between.
TTFT = {"dear": (0.10, 0.20), "mid": (0.25, 0.40), "cheap": (0.30, 0.45)}
PRICES: dict[str, float | None] = {"dear": 1e-3, "mid": 3e-4, "cheap": 1e-4}


def plan(view: View, **policy: Any) -> Any:
    return CheapestPolicy(**policy).plan(list(view.ttft), view, random.Random(0))


def test_the_cheapest_target_meeting_the_goal_goes_first() -> None:
    p = plan(View(TTFT, PRICES, goal=0.5))
    assert p.order == ("cheap", "mid", "dear")
    # hedged when the goal is at risk (0.5 - mid's median 0.25), not before cheap's own p95
    assert p.hedge_delays == (pytest.approx(0.45),)
    assert p.reason.startswith("cheapest: meets the goal at p95 450 ms")
    p = plan(View(TTFT, PRICES, goal=0.9))
    assert p.hedge_delays == (pytest.approx(0.65),)  # 0.9 - 0.25: later than cheap's p95


def test_a_target_missing_the_goal_goes_behind_dearer_ones_that_meet_it() -> None:
    assert plan(View(TTFT, PRICES, goal=0.42)).order == ("mid", "dear", "cheap")
    assert plan(View(TTFT, PRICES, goal=0.3)).order == ("dear", "mid", "cheap")


def test_when_none_meets_the_goal_the_fastest_goes_first() -> None:
    p = plan(View(TTFT, PRICES, goal=0.05))
    assert p.order == ("dear", "mid", "cheap")
    assert p.hedge_delays == (pytest.approx(0.20),)  # its own p95, like policy hedge
    assert p.reason.startswith("fastest: no target's p95 TTFT meets the goal")


def test_an_unknown_price_is_never_taken_for_free() -> None:
    prices = {**PRICES, "cheap": None}
    assert plan(View(TTFT, prices, goal=0.5)).order == ("mid", "dear", "cheap")
    assert plan(View(TTFT, {}, goal=0.5)).order == ("dear", "mid", "cheap")  # none: by p95
    p = plan(View(TTFT, {"dear": 1e-3}, goal=0.5))
    assert p.order[0] == "dear" and "unknown price" not in p.reason


def test_unavailable_targets_go_last_and_hedges_follow_max_hedges() -> None:
    p = plan(View(TTFT, PRICES, goal=0.5, down={"cheap"}), max_hedges=2)
    assert p.order == ("mid", "dear", "cheap")
    assert len(p.hedge_delays) == 2
    assert plan(View(TTFT, PRICES), max_hedges=0).hedge_delays == ()


def test_without_a_goal_the_cheapest_goes_first() -> None:
    p = plan(View(TTFT, PRICES, goal=None))
    assert p.order == ("cheap", "mid", "dear")
    assert p.hedge_delays == (pytest.approx(0.45),)


# --- the expected price of a request ------------------------------------------------------------


def price_of(**table: Any) -> ModelPrice:
    """A ``[prices."<model>"]`` table, read as the config reads it."""
    return ModelPrice.model_validate(table)


def test_a_requests_expected_cost_from_the_price() -> None:
    price, why = target_price(price_of(input=2, output=10), "m")
    assert why == "" and price is not None
    assert price.estimate(1000, 100) == pytest.approx((1000 * 2 + 100 * 10) / 1e6)
    tiered = ModelPrice.model_validate(
        {
            "input": 1,
            "output": 4,
            "tiers": [
                {"above_prompt_tokens": 1000, "input": 2, "output": 8},
                {"above_prompt_tokens": 5000, "priced": False},
            ],
        }
    )
    price, _ = target_price(tiered, "m")
    assert price is not None
    assert price.estimate(1000, 10) == pytest.approx((1000 * 1 + 10 * 4) / 1e6)
    assert price.estimate(1001, 10) == pytest.approx((1001 * 2 + 10 * 8) / 1e6)
    assert price.estimate(5001, 10) is None  # above a tier of unknown price: unknown
    gpu = ModelPrice.model_validate({"gpu_hour": {"usd": 3.6, "tokens_per_second": 1000}})
    price, _ = target_price(gpu, "m")
    assert price is not None and price.estimate(500, 500) == pytest.approx(1e-3)


def test_a_price_that_cannot_be_compared_or_has_expired_is_unknown() -> None:
    assert target_price(None, "m") == (None, "no price known for m")
    cny = price_of(input=1, output=2, currency="CNY")
    assert target_price(cny, "m") == (None, "the price of m is in CNY, not USD")
    promo = price_of(input=1, output=2, valid_until="2026-12-31")
    price, _ = target_price(promo, "m")
    assert price is not None
    day = datetime.datetime(2026, 12, 31, 23, 59, tzinfo=datetime.UTC).timestamp()
    assert price.estimate(10, 10, now=day) is not None
    assert price.estimate(10, 10, now=day + 60) is None


def test_the_answer_is_priced_at_the_requests_limit_or_a_typical_length() -> None:
    assert answer_tokens({}) == EXPECTED_ANSWER_TOKENS
    assert answer_tokens({"max_tokens": 16}) == 16
    assert answer_tokens({"max_completion_tokens": 10_000}) == EXPECTED_ANSWER_TOKENS
    assert answer_tokens({"max_tokens": True, "max_output_tokens": 7}) == 7


# --- the hedge budget in money ------------------------------------------------------------------


def test_a_hedge_ten_times_dearer_counts_as_ten() -> None:
    cheap, dear = CostBudget(0.1), CostBudget(0.1)
    cheap_hedges = dear_hedges = 0
    for _ in range(1000):
        cheap.on_request(1.0)
        dear.on_request(1.0)
        cheap_hedges += cheap.try_spend(1.0)
        dear_hedges += dear.try_spend(10.0)
    # 10% of 1000 first attempts' cost, plus what the bucket started with
    assert 100 <= cheap_hedges <= 105
    assert 10 <= dear_hedges <= 11
    assert cheap_hedges * 1.0 <= 0.1 * 1000 + 5 * 1.0 + 1e-9
    assert dear_hedges * 10.0 <= 0.1 * 1000 + 10.0 + 1e-9


def test_the_money_budget_refuses_what_it_cannot_price_and_refunds_winners() -> None:
    budget = CostBudget(0.1)
    budget.on_request(None)
    assert budget.tokens == 0.0  # a first attempt of unknown price earns nothing
    budget.on_request(2e-4)
    assert budget.tokens == pytest.approx(5 * 2e-4)  # it starts full: five first attempts
    assert not budget.try_spend(None)
    assert budget.try_spend(1e-3)
    assert not budget.try_spend(1e-4)
    budget.refund(1e-3)  # the hedge answered first: it saved its request
    assert budget.try_spend(1e-3)
    none = CostBudget(0.0)
    none.on_request(1.0)
    assert not none.try_spend(0.001)
    with pytest.raises(ValueError, match="ratio"):
        CostBudget(1.5)


# --- the config ---------------------------------------------------------------------------------

ROUTE = '[models.chat]\ntargets = ["deepseek:deepseek-v4-flash", "openai:gpt-6-luna"]\n'


def error_of(tmp_path: Path, text: str) -> str:
    path = tmp_path / "llmroute.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            ROUTE + 'policy = "cheapest"\n',
            "models.chat.ttft_target: required by policy = 'cheapest'",
        ),
        (ROUTE + "hedge_budget_cost = 2\n", "models.chat.hedge_budget_cost: "),
        (ROUTE + "hedge_budget_cost = -0.1\n", "models.chat.hedge_budget_cost: "),
        (ROUTE + 'hedge_budget_cost = "10%"\n', "models.chat.hedge_budget_cost: "),
        (
            ROUTE + "hedge_budget = 0.1\nhedge_budget_cost = 0.1\n",
            "models.chat.hedge_budget_cost: set hedge_budget (extra requests) or "
            "hedge_budget_cost (extra spend), not both",
        ),
    ],
)
def test_a_bad_cost_setting_names_its_key(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in error_of(tmp_path, text)


def test_a_cheapest_route_loads(tmp_path: Path) -> None:
    path = tmp_path / "llmroute.toml"
    path.write_text(
        ROUTE + 'policy = "cheapest"\nttft_target = "800ms"\nhedge_budget_cost = 0.05\n'
    )
    config = load_config(path)
    assert config is not None
    route = config.models["chat"]
    assert route.policy == "cheapest" and route.hedge_budget_cost == 0.05  # type: ignore[union-attr]


# --- end to end, on the simulator ---------------------------------------------------------------

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Which is cheaper?"}]


@pytest.fixture(scope="module")
def cheap_slow() -> Iterator[Simulator]:
    with Simulator(profile=Profile(reply_tokens=5, ttft_median=0.3), tls=True) as server:
        yield server


@pytest.fixture(scope="module")
def dear_fast() -> Iterator[Simulator]:
    with Simulator(profile=Profile(reply_tokens=5), tls=True) as server:
        yield server


def priced(cheap: Simulator, dear: Simulator) -> dict[str, Any]:
    def provider(sim: Simulator, usd: float) -> dict[str, Any]:
        return {
            "base_url": sim.base_url,
            "api_key": KEY,
            "prices": {"*": {"input": usd, "output": 4 * usd}},
        }

    return {
        "providers": {"cheap": provider(cheap, 0.1), "dear": provider(dear, 2.0)},
        "models": {
            "chat": {
                "targets": ["dear:sim-small", "cheap:sim-small"],
                "policy": "cheapest",
                "ttft_target": "3s",  # far above the cheap one's 300 ms, even on a busy machine
            },
            # one-target routes that measure each target (their stats are the targets')
            "only-cheap": {"targets": ["cheap:sim-small"], "policy": "failover"},
            "only-dear": {"targets": ["dear:sim-small"], "policy": "failover"},
        },
        "routing": {"explore": 0},
    }


async def ask(client: AsyncOpenAI, model: str, **extra: Any) -> Any:
    stream = await client.chat.completions.create(
        model=model, messages=MESSAGES, stream=True, **extra
    )
    [chunk async for chunk in stream]
    return cast(Any, stream).route


@pytest.mark.anyio
async def test_a_cheapest_route_buys_the_cheap_target_when_it_meets_the_goal(
    cheap_slow: Simulator, dear_fast: Simulator
) -> None:
    cfg = priced(cheap_slow, dear_fast)
    async with AsyncOpenAI(api_key=KEY, config=cfg, verify=dear_fast.ssl_context()) as client:
        for _ in range(6):  # enough samples for each target's own prediction
            await ask(client, "only-cheap")
            await ask(client, "only-dear")
        report = await ask(client, "chat")  # the route's goal
        assert report.winner == "cheap:sim-small"
        assert report.attempts[0].target == "cheap:sim-small"
        assert report.reason.startswith("cheapest: meets the goal")
        # the request's own goal, 150 ms: the cheap one (300 ms) misses it, the dear one meets
        report = await ask(client, "chat", extra_body={"llmroute": {"ttft_target_ms": 150}})
        assert report.attempts[0].target == "dear:sim-small"
        assert report.winner == "dear:sim-small"


@pytest.mark.anyio
@pytest.mark.parametrize("fast_priced", [True, False])
async def test_a_hedge_in_money_goes_out_only_to_a_priced_target(
    cheap_slow: Simulator, dear_fast: Simulator, fast_priced: bool
) -> None:
    def provider(sim: Simulator, priced: bool) -> dict[str, Any]:
        prices = {"*": {"input": 1.0, "output": 4.0}} if priced else {}
        return {"base_url": sim.base_url, "api_key": KEY, "prices": prices}

    cfg = {
        "providers": {"slow": provider(cheap_slow, True), "fast": provider(dear_fast, fast_priced)},
        "models": {
            "chat": {
                "targets": ["slow:sim-small", "fast:sim-small"],
                "policy": "fastest",
                "hedge_budget_cost": 1.0,
            }
        },
        "routing": {"explore": 0},
    }
    async with AsyncOpenAI(api_key=KEY, config=cfg, verify=dear_fast.ssl_context()) as client:
        # Both unmeasured: the configured order, slow first; a goal of 100 ms is at risk at
        # once, so a hedge to fast is wanted, and the budget in money decides.
        report = await ask(client, "chat", extra_body={"llmroute": {"ttft_target_ms": 100}})
    if fast_priced:
        assert (report.hedges, report.hedges_denied) == (1, 0)
        assert report.winner == "fast:sim-small"
    else:  # a hedge of unknown price could cost anything: refused
        assert (report.hedges, report.hedges_denied) == (0, 1)
        assert report.winner == "slow:sim-small"
