"""The virtual-time harness (``llmroute.testing._virtual``): the engine's own code under trio's
MockClock, answered with the simulator's seeded Profile draws. Counted, never timed: every
figure here is exact, so the assertions compare values, not durations."""

from __future__ import annotations

from typing import Any

import pytest

from llmroute.testing import Profile
from llmroute.testing._reply import prompt_tokens
from llmroute.testing._virtual import Phase, VirtualTarget, probe, run_fresh_client

COMMON: dict[str, Any] = {"reply_tokens": 4, "inter_token": 0.005}


def config(names: list[str], policy: str = "hedge") -> dict[str, Any]:
    return {
        "providers": {
            n: {"base_url": f"https://{n}.test/v1", "api_key": "sk-virtual"} for n in names
        },
        "models": {"chat": {"targets": [f"{n}:sim-small" for n in names], "policy": policy}},
    }


def prompt(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"question {i}"}]


def heavy_tailed() -> dict[str, Profile]:
    return {
        "a": Profile(ttft_median=0.25, ttft_sigma=0.1, stall_prob=0.1, seed=None, **COMMON),
        "b": Profile(ttft_median=0.40, ttft_sigma=0.1, stall_prob=0.01, seed=None, **COMMON),
    }


def test_a_run_is_the_same_for_the_same_seed_and_not_for_another() -> None:
    profiles = heavy_tailed()
    one = run_fresh_client(config(["a", "b"]), profiles, prompt, seed=3, count=60)
    two = run_fresh_client(config(["a", "b"]), profiles, prompt, seed=3, count=60)
    other = run_fresh_client(config(["a", "b"]), profiles, prompt, seed=4, count=60)
    assert len(one.requests) == 60 and all(r.error is None for r in one.requests)
    assert one.ttfts() == two.ttfts() and one.received == two.received
    assert one.ttfts() != other.ttfts()
    assert one.amplification == sum(one.received.values()) / 60 >= 1.0


def test_one_target_answers_each_request_with_its_own_draws_in_order() -> None:
    # One target, one request at a time: each TTFT is exactly that target's next draw (the
    # simulator's order), on the virtual clock, and it received each request once.
    profile = Profile(ttft_median=0.3, ttft_sigma=0.3, seed=None, **COMMON)
    run = run_fresh_client(config(["a"]), {"a": profile}, prompt, seed=5, count=20, concurrency=1)
    target = VirtualTarget(profile, 5 * 10)  # the harness's seed for the first target
    expected = [target.first_token(prompt_tokens(prompt(i))) for i in range(20)]
    assert run.received == {"a": 20} and run.amplification == 1.0
    assert run.ttfts() == pytest.approx(expected, abs=1e-9)


def test_a_failing_target_is_counted_and_its_requests_fail_over() -> None:
    profiles = {
        "a": Profile(ttft_median=0.1, rate_503=1.0, seed=None, **COMMON),
        "b": Profile(ttft_median=0.4, seed=None, **COMMON),
    }
    run = run_fresh_client(config(["a", "b"], "failover"), profiles, prompt, seed=1, count=30)
    assert all(r.ttft is not None and r.report is not None for r in run.requests)
    assert all(r.report.winner == "b:sim-small" for r in run.requests if r.report)
    assert run.received["b"] == 30 and run.received["a"] >= 1


def test_phases_change_the_profiles_as_they_start_and_probe_follows_them() -> None:
    # A turns 10x slower after 2 s: the probe of every request draws from the profile of the
    # phase it started in.
    profiles = {"a": Profile(ttft_median=0.1, seed=None, **COMMON)}
    phases = [Phase(2.0), Phase(2.0, {"a": {"ttft_median": 1.0}})]
    run = run_fresh_client(config(["a"]), profiles, prompt, seed=2, phases=phases)
    samples = probe(profiles, run.requests, prompt, seed=2, phases=phases)["a"]
    for request, sample in zip(run.requests, samples, strict=True):
        assert sample == pytest.approx(0.1 if request.started < 2.0 else 1.0)
    late = [r.ttft for r in run.requests if r.started >= 2.0]
    assert late and all(t == pytest.approx(1.0) for t in late)
