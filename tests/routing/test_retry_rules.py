"""Retry or fail over by cause, end to end: an ordered pair and a latency policy against the
simulator (docs/errors-and-retries.md has the table these check)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from llmroute import AllTargetsFailed, AsyncOpenAI
from llmroute.testing import Profile, Simulator

from ..conftest import KEY, fault

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Tell me about causes."}]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def sim() -> Iterator[Simulator]:
    """One simulator behind both providers, so a fault used once hits only the first attempt
    (the route report says which target each attempt went to)."""
    profile = Profile(reply_tokens=8, inter_token=0.001, ttft_median=0.01, ttft_sigma=0.0)
    with Simulator(profile=profile, tls=True) as server:
        yield server


def cfg(sim: Simulator, policy: str = "failover", **route: Any) -> dict[str, Any]:
    return {
        "providers": {
            "primary": {"base_url": sim.base_url, "api_key": KEY},
            "fallback": {"base_url": sim.base_url, "api_key": KEY},
        },
        "models": {
            "chat": {"targets": ["primary:sim-small", "fallback:sim-small"], "policy": policy}
            | route
        },
        "routing": {"explore": 0},
    }


async def ask(client: AsyncOpenAI, headers: dict[str, str]) -> tuple[str, Any]:
    stream = await client.chat.completions.create(
        model="chat", messages=MESSAGES, stream=True, extra_headers=headers
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    return text, stream.route


def client_for(sim: Simulator, **kwargs: Any) -> AsyncOpenAI:
    return AsyncOpenAI(config=cfg(sim, **kwargs), verify=sim.ssl_context(), max_retries=0)


@pytest.mark.parametrize(
    "headers",
    [
        fault("429", **{"x-sim-retry-after": "0.3"}),
        fault("500"),
        fault("503", **{"x-sim-retry-after": "0"}),
    ],
    ids=["429-short-retry-after", "500", "503"],
)
async def test_an_ordered_pair_answers_from_the_primary_after_a_passing_error(
    sim: Simulator, headers: dict[str, str]
) -> None:
    async with client_for(sim) as client:
        text, route = await ask(client, headers)
    assert text
    assert route.winner == "primary:sim-small"
    assert [(a.target, a.reason, a.outcome) for a in route.attempts] == [
        ("primary:sim-small", "first", "rate_limited" if "429" in headers.values() else "error"),
        ("primary:sim-small", "retry", "won"),
    ]
    # the fallback (maybe the costly one) was not asked


async def test_a_long_retry_after_or_a_second_5xx_fails_over(
    sim: Simulator,
) -> None:
    async with client_for(sim) as client:
        _, route = await ask(client, fault("429", **{"x-sim-retry-after": "30"}))
        assert route.winner == "fallback:sim-small" and len(route.attempts) == 2
    async with client_for(sim) as client:
        twice = {**fault("500"), "x-sim-fault-times": "2"}
        _, route = await ask(client, twice)
    assert [(a.target, a.reason) for a in route.attempts] == [
        ("primary:sim-small", "first"),
        ("primary:sim-small", "retry"),
        ("fallback:sim-small", "failover"),
    ]
    assert route.winner == "fallback:sim-small"


@pytest.mark.parametrize("policy", ["hedge", "fastest"])
async def test_latency_policies_move_on_at_once(sim: Simulator, policy: str) -> None:
    async with client_for(sim, policy=policy) as client:
        _, route = await ask(client, fault("500"))
    assert len(route.attempts) == 2
    assert route.attempts[1].reason == "failover"
    assert route.attempts[1].target != route.attempts[0].target
    assert route.attempts[1].outcome == "won"


@pytest.mark.parametrize("policy", ["failover", "hedge"])
@pytest.mark.parametrize(
    ("kind", "code"),
    [
        ("400", "invalid_value"),
        ("context-length", "context_length_exceeded"),
        ("content-policy", "content_policy_violation"),
    ],
)
async def test_a_request_caused_400_is_returned_unchanged(
    sim: Simulator, policy: str, kind: str, code: str
) -> None:
    asked = sim.stats()["chat_requests"]
    async with client_for(sim, policy=policy) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await ask(client, {"x-sim-fault": kind})
    error = caught.value
    assert not isinstance(error, AllTargetsFailed)  # the vendor's own error, unchanged
    assert error.status_code == 400
    assert isinstance(error.body, dict) and error.body["code"] == code
    assert "(simulated)" in error.message
    assert sim.stats()["chat_requests"] == asked + 1  # one request only, to one target


async def test_a_route_may_fail_over_on_a_content_policy_refusal(
    sim: Simulator,
) -> None:
    async with client_for(sim, failover_on=["content_policy"]) as client:
        _, route = await ask(client, fault("content-policy") | {"x-sim-fault-times": "1"})
    assert route.winner == "fallback:sim-small"


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("401", openai.AuthenticationError),
        ("403", openai.PermissionDeniedError),
        ("404", openai.NotFoundError),
    ],
)
async def test_a_misconfigured_target_is_named_and_left_out(
    sim: Simulator, kind: str, error: type[openai.APIStatusError]
) -> None:
    async with client_for(sim) as client:
        _, route = await ask(client, fault(kind))
        assert route.winner == "fallback:sim-small"
        assert route.attempts[0].error is not None
        router = client._router
        assert router is not None
        health = router.health("primary:sim-small")
        assert health.misconfiguration is not None and str(error.__name__) in (
            health.misconfiguration
        )
        assert "misconfigured" in health.describe()
        asked = sim.stats()["chat_requests"]
        _, route = await ask(client, {})  # left out: the next request goes to the fallback
        assert route.winner == "fallback:sim-small"
        assert sim.stats()["chat_requests"] == asked + 1  # the primary was not asked
        assert [a.target for a in route.attempts] == ["fallback:sim-small"]


@pytest.mark.parametrize(
    ("kind", "error", "status"),
    [
        ("401", openai.AuthenticationError, 401),
        ("429", openai.RateLimitError, 429),
        ("500", openai.InternalServerError, 500),
    ],
)
async def test_a_one_target_route_keeps_the_errors_type(
    sim: Simulator, kind: str, error: type[openai.APIStatusError], status: int
) -> None:
    config = cfg(sim, retry_after_max=0)
    config["models"]["chat"]["targets"] = ["primary:sim-small"]
    async with AsyncOpenAI(config=config, verify=sim.ssl_context(), max_retries=0) as client:
        with pytest.raises(error) as caught:
            await ask(client, {"x-sim-fault": kind, "x-sim-retry-after": "30"})
        if kind == "401":  # left out now: the next request asks nobody, yet says what is wrong
            asked = sim.stats()["chat_requests"]
            with pytest.raises(error) as again:
                await ask(client, {})
            assert sim.stats()["chat_requests"] == asked
            assert "misconfigured" in again.value.message
    assert isinstance(caught.value, AllTargetsFailed)
    assert caught.value.status_code == status
    assert "primary:sim-small" in caught.value.message
