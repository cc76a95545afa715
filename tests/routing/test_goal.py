"""Issue 16, item 5: a per-request latency goal (a TTFT target, a minimum decode speed)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, cast

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from llmroute import AsyncOpenAI
from llmroute.routing.goal import LatencyGoal, meet_goal, read_goal
from llmroute.routing.policies import Plan
from llmroute.testing import Profile, Simulator

from ..conftest import KEY

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me about routing."}]
MEDIANS = {"a": 0.20, "b": 0.45, "c": 0.90}


def bent(plan: Plan, goal: LatencyGoal, speeds: dict[str, float] | None = None) -> Plan:
    return meet_goal(
        plan,
        goal,
        median=MEDIANS.__getitem__,
        speed=(speeds or {}).get,
        available=lambda t: True,
    )


def test_reading_the_goal_of_a_request() -> None:
    assert read_goal(None) is None
    assert read_goal({}) is None
    assert read_goal({"ttft_target_ms": 300}) == LatencyGoal(0.3, None)
    assert read_goal({"min_tokens_per_s": 40}) == LatencyGoal(None, 40.0)
    assert read_goal(None, "250") == LatencyGoal(0.25, None)
    assert read_goal({"ttft_target_ms": 300}, "250") == LatencyGoal(0.3, None)  # the body wins
    cases: list[tuple[object, object, str]] = [
        ({"ttft_target_ms": 0}, None, "llmroute.ttft_target_ms"),
        ({"ttft_target_ms": "300"}, None, "llmroute.ttft_target_ms"),
        ({"ttft_target_ms": True}, None, "llmroute.ttft_target_ms"),
        ({"ttft_target_ms": math.inf}, None, "llmroute.ttft_target_ms"),
        ({"min_tokens_per_s": -1}, None, "llmroute.min_tokens_per_s"),
        ({"ttft_target": 300}, None, "llmroute.ttft_target"),
        ([300], None, "llmroute"),
        (None, "soon", "x-llmroute-ttft-target-ms"),
        (None, "-5", "x-llmroute-ttft-target-ms"),
    ]
    for options, header, param in cases:
        with pytest.raises(ValueError) as info:
            read_goal(options, header)
        assert getattr(info.value, "param", None) == param
        assert param in str(info.value)


def test_targets_predicted_to_miss_go_behind_those_predicted_to_meet() -> None:
    plan = Plan(("c", "b", "a"), hedge_delays=(2.0,))
    met = bent(plan, LatencyGoal(0.3))
    assert met.order == ("a", "c", "b")
    # at risk once the next target's median would only just still meet the goal: 0.3 - 0.9 < 0
    assert met.hedge_delays == (0.0,)
    met = bent(Plan(("b", "a", "c")), LatencyGoal(0.5))
    assert met.order == ("b", "a", "c")  # b already meets it: only the hedge changes
    assert met.hedge_delays == (pytest.approx(0.3),)  # 0.5 - a's median 0.2
    assert bent(Plan(("c", "b")), LatencyGoal(0.1)).order == ("c", "b")  # none meets: as planned
    race = Plan(("a", "b", "c"), start=2)
    assert bent(race, LatencyGoal(0.3)) is race


def test_a_minimum_decode_speed_puts_slow_decoders_behind() -> None:
    plan = Plan(("a", "b", "c"))
    met = bent(plan, LatencyGoal(None, 40.0), speeds={"a": 20.0, "b": 80.0})
    assert met.order == ("b", "c", "a")  # c's speed is unknown: it is not assumed slow
    assert met.hedge_delays == ()


def test_an_unavailable_target_meeting_the_goal_does_not_reorder() -> None:
    plan = Plan(("c", "a"))
    met = meet_goal(
        plan,
        LatencyGoal(0.3),
        median=MEDIANS.__getitem__,
        speed=lambda t: None,
        available=lambda t: t != "a",
    )
    assert met.order == ("c", "a")


@pytest.fixture(scope="module")
def slow_sim() -> Iterator[Simulator]:
    with Simulator(profile=Profile(reply_tokens=5, ttft_median=0.5), tls=True) as server:
        yield server


def routed(fast: Simulator, slow: Simulator, **route: Any) -> dict[str, Any]:
    return {
        "providers": {
            "slow": {"base_url": slow.base_url, "api_key": KEY},
            "fast": {"base_url": fast.base_url, "api_key": KEY},
        },
        "models": {"chat": {"targets": ["slow:sim-small", "fast:sim-small"], **route}},
        "routing": {"explore": 0},
    }


@pytest.mark.anyio
async def test_a_request_at_risk_of_missing_its_goal_is_hedged(
    sim: Simulator, slow_sim: Simulator
) -> None:
    cfg = routed(sim, slow_sim, policy="fastest")
    async with AsyncOpenAI(api_key=KEY, config=cfg, verify=sim.ssl_context()) as client:
        plain = await client.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        [chunk async for chunk in plain]
        report = cast(Any, plain).route
        assert report is not None and report.hedges == 0
        assert report.winner == "slow:sim-small"  # both unmeasured: the configured order
        goal = await client.chat.completions.create(
            model="chat",
            messages=MESSAGES,
            stream=True,
            extra_body={"llmroute": {"ttft_target_ms": 300}},
        )
        [chunk async for chunk in goal]
        report = cast(Any, goal).route
        assert report is not None and report.hedges == 1
        assert report.winner == "fast:sim-small"
    assert all(
        "llmroute" not in (r["json"] or {}) for r in [*sim.last_requests, *slow_sim.last_requests]
    )


@pytest.mark.anyio
async def test_a_wrong_option_is_a_bad_request_before_anything_is_sent(
    sim: Simulator, slow_sim: Simulator
) -> None:
    cfg = routed(sim, slow_sim, policy="hedge")
    async with AsyncOpenAI(api_key=KEY, config=cfg, verify=sim.ssl_context()) as client:
        before = sim.stats()["chat_requests"] + slow_sim.stats()["chat_requests"]
        with pytest.raises(openai.BadRequestError, match=r"llmroute\.ttft_target_ms") as info:
            await client.chat.completions.create(
                model="chat",
                messages=MESSAGES,
                extra_body={"llmroute": {"ttft_target_ms": "fast"}},
            )
        assert info.value.param == "llmroute.ttft_target_ms"
        with pytest.raises(openai.BadRequestError, match=r"llmroute\.deadline"):
            await client.chat.completions.create(
                model="chat", messages=MESSAGES, extra_body={"llmroute": {"deadline": 1}}
            )
        with pytest.raises(openai.BadRequestError, match="x-llmroute-ttft-target-ms"):
            await client.chat.completions.create(
                model="chat",
                messages=MESSAGES,
                extra_headers={"x-llmroute-ttft-target-ms": "0"},
            )
        after = sim.stats()["chat_requests"] + slow_sim.stats()["chat_requests"]
    assert after == before
