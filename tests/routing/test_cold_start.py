"""A fresh client routes near the best schedule from its first request: cold targets are probed
beside the first choice (and run on to their first token), a target with few samples is ranked
by a lower bound of its p95, and a hedge waits until it is likely to win. Pure statistics with
recorded samples; the engine end to end over simulators; and a fresh client's first hundred
requests counted in virtual time (the engine's own code, the simulator's seeded draws)."""

from __future__ import annotations

import math
import random
from typing import Any

import anyio
import pytest

from llmroute import AsyncOpenAI
from llmroute.routing.stats import (
    BEYOND_SAMPLES,
    FAILING_ALPHA,
    RANK_CONFIDENCE,
    LiveStats,
    StatsSettings,
    fails_beyond,
    lower_bound_rank,
    winning_delay,
)
from llmroute.testing import Profile, Simulator
from llmroute.testing._virtual import VirtualTarget, run_fresh_client

from ..clock import FakeClock
from ..conftest import KEY

# -- the statistics ---------------------------------------------------------------------------


def test_the_lower_bound_rank_is_the_largest_order_statistic_below_the_quantile_at_90() -> None:
    # P(Binomial(10, 0.95) >= 10) = 0.599, >= 9: 0.914: the 9th of 10 is the bound.
    assert lower_bound_rank(10, 0.95) == 9
    assert lower_bound_rank(5, 0.95) == 4  # >= 5: 0.774, >= 4: 0.977
    assert lower_bound_rank(1, 0.95) == 1
    with pytest.raises(ValueError):
        lower_bound_rank(0, 0.95)


def test_the_lower_bound_holds_with_its_confidence_whatever_the_distribution() -> None:
    rng = random.Random(7)
    true_p95 = -math.log(0.05)  # exponential(1)
    for n in (5, 10, 19):
        r = lower_bound_rank(n, 0.95)
        below = sum(
            sorted(rng.expovariate(1.0) for _ in range(n))[r - 1] <= true_p95 for _ in range(4000)
        )
        assert below / 4000 >= RANK_CONFIDENCE - 0.02  # 4,000 draws: ~0.005 of noise


def test_a_hedge_waits_past_a_thin_tail_until_it_would_win() -> None:
    # B's lognormal body (sigma 0.1 around 400 ms) and 2% stalls of 1 s: at its p95 (~470 ms)
    # a hedge answering 250 ms later beats only the stalls among the 5% still waiting.
    rng = random.Random(1)
    body = [0.4 * math.exp(rng.gauss(0.0, 0.1)) for _ in range(980)]
    values = sorted([*body, *(1.4 for _ in range(20))])
    p95 = values[949]
    delay = winning_delay(values, p95, 0.25)
    beyond = sum(v > delay for v in values)
    assert delay > p95 and beyond <= 2 * sum(v > delay + 0.25 for v in values)
    assert beyond <= 2 * 20 < 0.05 * len(values)  # twice the stalls at most, not 5%


def test_a_stall_tail_past_the_quantile_is_hedged_at_the_quantile_itself() -> None:
    # 4% stalls of 2-2.3 s beyond a fast body: of the samples past the p95 (the body's top),
    # most are stalls, which a hedge answering 0.4 s later beats.
    values = sorted([*(0.25 + i / 1000 for i in range(96)), *(2.0 + i / 10 for i in range(4))])
    assert winning_delay(values, values[94], 0.4) == values[94]


def test_a_censored_sample_counts_as_beyond_the_hedge() -> None:
    # One attempt abandoned at 0.6 s (its TTFT unknown beyond it: a hedge won then) and a fast
    # body: taken for an answer at 0.6 s, it says a hedge at 0.29 s (answering 0.4 s later)
    # would have lost, and the hedge would wait until 0.6 s.
    values = sorted([*(0.25 + i / 1000 for i in range(40)), 0.6])
    assert winning_delay(values, 0.29, 0.4) == 0.6
    assert winning_delay(values, 0.29, 0.4, censored=[0.6]) == 0.29


def test_a_hedge_without_samples_beyond_waits_at_the_floor_and_never_past_the_largest() -> None:
    assert winning_delay([0.1, 0.2, 0.3], 0.5, 0.4) == 0.5
    assert winning_delay([0.1, 0.2, 0.3, 0.31, 0.32], 0.29, 0.4) == 0.32


def test_one_early_stall_does_not_rank_a_steady_target_below_a_slower_one() -> None:
    # B's first ten samples hold one of its 1% stalls; C answers in 700 ms every time. B's
    # p95 estimate is then ~1 s, C's 0.7 s; its lower bound (its 9th sample) is B's body.
    clock = FakeClock()
    stats = LiveStats(StatsSettings(), clock)
    b, c = stats.target("b"), stats.target("c")
    for value in (1.4, 0.41, 0.39, 0.43, 0.40, 0.38, 0.42, 0.44, 0.40, 0.41):
        clock.advance(0.1)
        b.record_ttft(value, 20)
        c.record_ttft(0.7, 20)
    assert b.predict(0.95, 20) > c.predict(0.95, 20)
    assert b.rank(0.95, 20) == 0.44 < c.rank(0.95, 20)
    for _ in range(10):  # from twenty samples on, the estimate itself
        clock.advance(0.1)
        b.record_ttft(0.4, 20)
    assert b.rank(0.95, 20) == b.predict(0.95, 20)


def test_a_stall_tailed_target_re_measured_after_a_change_ranks_by_its_estimate() -> None:
    # A was slow (1 s), then fast again with stalls (2.1-2.3 s) among its newest samples: the
    # window declared changed holds 13 samples. A fresh window that few ranks by a lower bound
    # (its body, 0.27 s here); a changed one by its estimate, the stalls: else the target is
    # the first choice, its hedge at a stall, until twenty samples come (timed on a loaded
    # machine, such windows made A the first choice every few seconds in steady weather).
    clock = FakeClock()
    a = LiveStats(StatsSettings(), clock).target("a")
    for i in range(20):
        clock.advance(0.1)
        a.record_ttft(1.0 + i / 1000, 20)
    for value in (0.25, 0.26, 0.24, 0.25, 0.27, 2.3, 0.26, 0.25, 0.24, 0.26, 2.1, 0.25, 0.25):
        clock.advance(0.1)
        a.record_ttft(value, 20)
    assert a.shifts and len(a._ttft) < 20
    assert a.rank(0.95, 20) == a.predict(0.95, 20) > 2.0


def test_a_target_ranked_by_its_lower_bound_is_hedged_from_it() -> None:
    # Two stalls among a fresh target's first 19 samples: ranked by its 17th sample (the
    # body's top), its hedge fires there too, not at its 18th (a stall) 2.3 s in.
    clock = FakeClock()
    a = LiveStats(StatsSettings(), clock).target("a")
    for i in range(17):
        clock.advance(0.1)
        a.record_ttft(0.25 + i / 1000, 20)
    for value in (2.3, 2.5):
        clock.advance(0.1)
        a.record_ttft(value, 20)
    assert a.rank(0.95, 20) == 0.266
    assert a.hedge_delay(0.95, 0.4, 20) == 0.266


def test_a_hedge_past_every_sample_waits_a_little_longer_than_the_largest() -> None:
    # C answers in 0.7 s every time: a hedge at 0.7 s would race its own answer and lose (in
    # virtual time, tie with it every time); past every sample it insures against a stall.
    clock = FakeClock()
    c = LiveStats(StatsSettings(), clock).target("c")
    for _ in range(30):
        clock.advance(0.1)
        c.record_ttft(0.7, 20)
    assert c.hedge_delay(0.95, 0.55, 20) == pytest.approx(0.7 * BEYOND_SAMPLES)
    assert BEYOND_SAMPLES > 1.0


def test_a_target_failing_beyond_the_tail_share_ranks_after_those_that_do_not() -> None:
    # A fast target whose attempts fail 15% of the time (429s, 500s): a request's p95 of a
    # first token from it is never, whatever its TTFT; one failing on 2% keeps its rank.
    clock = FakeClock()
    stats = LiveStats(StatsSettings(), clock)
    flaky, steady = stats.target("flaky"), stats.target("steady")
    rng = random.Random(3)
    for i in range(100):
        clock.advance(0.05)
        steady.record_ttft(0.4, 20)
        steady.record_outcome("error" if i % 50 == 0 else "ok")
        if i % 20 < 3:
            flaky.record_outcome("rate_limited")
        else:
            flaky.record_ttft(rng.uniform(0.2, 0.3), 20)
            flaky.record_outcome("ok")
    assert flaky.predict(0.95, 20) < steady.predict(0.95, 20)
    assert flaky.failing(0.95) and not steady.failing(0.95)
    assert flaky.rank(0.95, 20) > steady.rank(0.95, 20)
    assert not flaky.failing(0.5)  # its median is a first token


def test_a_target_failing_at_the_tail_share_is_taken_for_worse_at_most_alpha_of_the_time() -> None:
    rng = random.Random(5)
    runs = 3000
    wrong = sum(
        fails_beyond(200, sum(rng.random() < 0.05 for _ in range(200)), 0.05) for _ in range(runs)
    )
    assert wrong / runs <= FAILING_ALPHA + 0.005  # the exact binomial test: at most alpha
    assert fails_beyond(200, 25, 0.05)  # 12.5% of 200


# -- the engine, end to end -------------------------------------------------------------------


def probing_config(fast: Simulator, slow: Simulator, **routing: Any) -> dict[str, Any]:
    return {
        "providers": {
            "fast": {"base_url": fast.base_url, "api_key": KEY},
            "slow": {"base_url": slow.base_url, "api_key": KEY},
        },
        "models": {"chat": {"targets": ["fast:sim-small", "slow:sim-small"], "policy": "hedge"}},
        "routing": routing,
    }


async def wait_for(predicate: Any, seconds: float = 30.0) -> None:
    """Poll ``predicate`` (a hang guard only: the assertion after it decides the test)."""
    with anyio.move_on_after(seconds):
        while not predicate():  # noqa: ASYNC110 - the stats have no event
            await anyio.sleep(0.02)


@pytest.mark.anyio
async def test_a_cold_target_is_probed_beside_the_first_choice_and_runs_on_to_a_sample(
    sim: Simulator,
) -> None:
    with Simulator(profile=Profile(reply_tokens=5, ttft_median=0.3), tls=True) as slow:
        cfg = probing_config(sim, slow)
        async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
            stream = await client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "Hi"}], stream=True
            )
            async for _ in stream:
                pass
            route = stream.route
            assert [(a.target, a.reason) for a in route.attempts] == [
                ("slow:sim-small", "probe"),
                ("fast:sim-small", "race"),
            ]
            assert route.winner == "fast:sim-small" and route.explored == "slow:sim-small"
            await wait_for(lambda: client.stats()["slow:sim-small"].n == 1)
            # The probe lost the race, yet its own first token is a sample, not a lower bound.
            slow_stats = client.stats()["slow:sim-small"]
            assert slow_stats.n == 1 and slow_stats.ttft_p50 is not None
            assert slow_stats.ttft_p50 >= 0.3
            probe = route.attempts[0]
            assert probe.outcome == "cancelled"  # closed after its first token, measured
            assert probe.ttft is not None and probe.ttft >= 0.3


@pytest.mark.anyio
async def test_a_probe_that_lost_gives_up_at_its_patience_as_a_censored_sample(
    sim: Simulator, sim_stall: Simulator
) -> None:
    # ttft_prior 100 ms: a target without samples is expected to answer by ~0.32 s at its p99;
    # the stalled one (5 s) is cancelled then, and its wait so far is recorded as a lower bound.
    cfg = probing_config(sim, sim_stall, ttft_prior="100ms")
    cancelled = sim_stall.stats()["streams_cancelled"]
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        stream = await client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "Hi"}], stream=True
        )
        async for _ in stream:
            pass
        probe = stream.route.attempts[0]
        assert (probe.target, probe.reason) == ("slow:sim-small", "probe")
        await wait_for(lambda: probe.outcome != "pending")
        assert probe.outcome == "cancelled" and probe.ttft is None
        await wait_for(lambda: sim_stall.stats()["streams_cancelled"] > cancelled)
        assert sim_stall.stats()["streams_cancelled"] == cancelled + 1
        assert client.stats()["slow:sim-small"].n == 1  # the censored wait


# -- a fresh client's first hundred requests, counted in virtual time -------------------------

COMMON: dict[str, Any] = {"reply_tokens": 16, "inter_token": 0.005}


def heavy_tailed(sigma: float) -> dict[str, Profile]:
    """``benchmarks/routing.py --scenarios``' steady weather, seeded as its simulators are: A
    fast with stalls of 1.5-3 s on 10% of its requests, B steadier, C slow."""
    return {
        "a": Profile(
            ttft_median=0.25,
            ttft_sigma=sigma,
            stall_prob=0.1,
            stall_range=(1.5, 3.0),
            seed=11,
            **COMMON,
        ),
        "b": Profile(
            ttft_median=0.40,
            ttft_sigma=0.1,
            stall_prob=0.01,
            stall_range=(1.0, 1.0),
            seed=12,
            **COMMON,
        ),
        "c": Profile(ttft_median=0.70, seed=13, **COMMON),
    }


def prompt(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"scenario question {i}: what is {i} times {i + 3}?"}]


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(0.95 * len(ordered)) - 1]  # nearest rank, as the benchmarks


@pytest.mark.parametrize("sigma", [0.1, 0.25])
@pytest.mark.parametrize("seed", range(5))
def test_a_fresh_clients_first_hundred_requests_are_near_the_best_single_target(
    sigma: float, seed: int
) -> None:
    profiles = heavy_tailed(sigma)
    config = {
        "providers": {
            name: {"base_url": f"https://{name}.test/v1", "api_key": KEY} for name in profiles
        },
        "models": {"chat": {"targets": [f"{n}:sim-small" for n in profiles], "policy": "hedge"}},
    }
    run = run_fresh_client(config, profiles, prompt, seed=seed, count=100)
    # Each target alone would have served the same hundred requests with its own first
    # hundred draws (the simulator draws in the order requests reach it).
    alone = {}
    for name, profile in profiles.items():
        target = VirtualTarget(profile, profile.seed or 0)
        alone[name] = p95([target.first_token(20) for _ in range(100)])
    best = min(alone.values())
    assert alone["a"] > 3 * best  # A alone: its stalls are its p95
    assert p95(run.ttfts()) <= 1.10 * best
    assert run.amplification <= 1.25  # the probes (at most 5 per cold target) and hedges


def test_probes_are_paid_from_the_hedge_budget_while_it_has_tokens() -> None:
    # The first 8 requests (all at once) probe both cold targets beside the first choice:
    # each probe takes a token of the hedge budget (5 saved, 0.1 earned per request) while there is
    # one, so the losing hedges that follow are fewer by as many; a probe never waits for one.
    import trio
    import trio.testing

    from llmroute._routes import build_router
    from llmroute.config import Config, resolve
    from llmroute.testing._virtual import VirtualSender, drive

    profiles = heavy_tailed(0.1)
    config = {
        "providers": {
            name: {"base_url": f"https://{name}.test/v1", "api_key": KEY} for name in profiles
        },
        "models": {"chat": {"targets": [f"{n}:sim-small" for n in profiles], "policy": "hedge"}},
    }
    seen: dict[str, float] = {}

    async def main() -> None:
        router = build_router(
            resolve(Config.model_validate(config), {}),
            max_retries=2,
            clock=trio.current_time,
            rng=random.Random(0),
        )
        targets = {n: VirtualTarget(p, p.seed or 0) for n, p in profiles.items()}
        sender = VirtualSender(targets, trio.current_time)
        requests = await drive(router, router.routes["chat"], sender, prompt, count=8)
        seen["probes"] = sum(
            a.reason == "probe" for r in requests if r.report for a in r.report.attempts
        )
        seen["tokens"] = router.routes["chat"].budget.tokens

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert seen["probes"] >= 5
    assert seen["tokens"] < 1  # still 5 had the probes been free (8 requests, no hedge lost)
