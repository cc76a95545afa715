"""Legacy completions and embeddings on a route fail over by the engine's rules (the table in
docs/errors-and-retries.md), end to end against the simulator: one simulator behind both
providers, so a fault used once hits only the first attempt and the route report says which
target each attempt went to."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from llmroute import AsyncOpenAI
from llmroute.testing import Profile, Simulator

from ..conftest import KEY, fault

pytestmark = pytest.mark.anyio

KINDS = ["completions", "embeddings"]


@pytest.fixture(scope="module")
def sim() -> Iterator[Simulator]:
    with Simulator(profile=Profile(reply_tokens=6, ttft_median=0.01), tls=True) as server:
        yield server


def client_for(sim: Simulator, policy: str, max_retries: int = 0, **route: Any) -> AsyncOpenAI:
    config = {
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
    return AsyncOpenAI(config=config, verify=sim.ssl_context(), max_retries=max_retries)


async def ask(client: AsyncOpenAI, kind: str, headers: dict[str, str]) -> Any:
    """The call's route report, after checking it was answered."""
    if kind == "completions":
        done: Any = await client.completions.create(
            model="chat", prompt="Say hi", max_tokens=4, extra_headers=headers
        )
        assert done.choices[0].text
    else:
        done = await client.embeddings.create(model="chat", input="hello", extra_headers=headers)
        assert done.data and done.data[0].embedding
    return done.route


def attempts(route: Any) -> list[tuple[str, str, str]]:
    return [(a.target, a.reason, a.outcome) for a in route.attempts]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_latency_route_fails_over_at_once_after_a_5xx(sim: Simulator, kind: str) -> None:
    """Not the same target again (with ``max_retries`` left, it used to be retried once,
    after openai's backoff)."""
    async with client_for(sim, "fastest", max_retries=2) as client:
        route = await ask(client, kind, fault("500"))
    (first, reason, outcome), (second, *rest) = attempts(route)
    assert (reason, outcome) == ("first", "error")
    assert second != first and rest == ["failover", "won"]
    assert route.winner == second


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("headers", "outcome"),
    [
        (fault("500"), "error"),
        (fault("429", **{"x-sim-retry-after": "0.2"}), "rate_limited"),
    ],
    ids=["500", "429-short-retry-after"],
)
async def test_an_ordered_route_retries_its_primary_once(
    sim: Simulator, kind: str, headers: dict[str, str], outcome: str
) -> None:
    """After a 5xx (``server_error_retries``, 1) or a Retry-After within ``retry_after_max``,
    whatever ``max_retries`` (0 here) says."""
    async with client_for(sim, "failover") as client:
        route = await ask(client, kind, dict(headers, **{"x-sim-fault-key": uuid.uuid4().hex}))
    assert attempts(route) == [
        ("primary:sim-small", "first", outcome),
        ("primary:sim-small", "retry", "won"),
    ]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_429_on_a_latency_route_fails_over_and_the_target_cools_down(
    sim: Simulator, kind: str, sleeps: list[float]
) -> None:
    """At once: no wait for the Retry-After (it used to be waited out even when no retry
    followed)."""
    async with client_for(sim, "fastest") as client:
        route = await ask(client, kind, fault("429", **{"x-sim-retry-after": "30"}))
        (first, _, outcome), (second, _, won) = attempts(route)
        assert (outcome, won) == ("rate_limited", "won") and second != first
        assert client._llmroute.router.health(first).cooling() > 0  # pyright: ignore[reportPrivateUsage]
        again = await ask(client, kind, {})
    assert attempts(again) == [(second, "first", "won")]  # the cooling target is passed over
    assert not [delay for delay in sleeps if delay >= 1]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("status", ["404", "401"])
async def test_a_misconfigured_target_is_failed_over(
    sim: Simulator, kind: str, status: str
) -> None:
    """A wrong key or an unknown model is the target's fault: the next target answers (a 404
    used to be returned to the caller)."""
    async with client_for(sim, "failover") as client:
        route = await ask(client, kind, fault(status))
    assert attempts(route) == [
        ("primary:sim-small", "first", "error"),
        ("fallback:sim-small", "failover", "won"),
    ]


@pytest.mark.parametrize("kind", KINDS)
async def test_an_invalid_request_is_returned_unchanged(sim: Simulator, kind: str) -> None:
    before = sim.stats()["requests"]
    async with client_for(sim, "failover") as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await ask(client, kind, fault("400", times=2))
    assert caught.value.status_code == 400
    assert sim.stats()["requests"] == before + 1  # no other target was asked


@pytest.mark.parametrize("kind", KINDS)
async def test_a_route_may_fail_over_on_an_invalid_request(sim: Simulator, kind: str) -> None:
    async with client_for(sim, "failover", failover_on=["invalid_request"]) as client:
        route = await ask(client, kind, fault("400"))
    assert attempts(route) == [
        ("primary:sim-small", "first", "error"),
        ("fallback:sim-small", "failover", "won"),
    ]


@pytest.mark.parametrize("kind", KINDS)
async def test_every_target_failing_raises_all_targets_failed_with_each_cause(
    sim: Simulator, kind: str
) -> None:
    async with client_for(sim, "failover", server_error_retries=0) as client:
        with pytest.raises(openai.InternalServerError) as caught:
            await ask(client, kind, fault("500", times=2))
    failed = caught.value
    assert set(failed.errors) == {"primary:sim-small", "fallback:sim-small"}  # type: ignore[attr-defined]
