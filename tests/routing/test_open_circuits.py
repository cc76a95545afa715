"""A circuit breaker never makes an answer less likely: a lone target slowed by a burst is waited
for up to ``first_token_timeout`` (its circuit stays closed), and a request whose every target
has its circuit open asks the least-bad one instead of refusing (docs/routing.md, "When every
circuit is open"). Against the TLS + HTTP/2 simulator."""

from __future__ import annotations

import functools
from typing import Any

import anyio
import pytest

from llmroute import AllTargetsFailed, AsyncOpenAI
from llmroute.routing import failures
from llmroute.routing.stats import first_token_deadline
from llmroute.testing import Simulator

from ..clock import FakeClock
from ..conftest import KEY, fault

pytestmark = pytest.mark.anyio

MESSAGES: Any = [{"role": "user", "content": "Tell me about circuits."}]
A, B = "a:sim-small", "b:sim-small"
LIVE_FLOOR = 0.3
"""The live first-token deadline's floor in these tests (5 s in the package): a warm, fast
target's deadline is this, so a burst's TTFT of 1 s passes it."""


def config(sim: Simulator, targets: list[str], **routing: Any) -> dict[str, Any]:
    return {
        "providers": {name: {"base_url": sim.base_url, "api_key": KEY} for name in ("a", "b")},
        "models": {"chat": {"targets": targets, "policy": "fastest", "first_token_timeout": "20s"}},
        "routing": {"explore": 0, "breaker_failures": 2} | routing,
    }


def client(sim: Simulator, targets: list[str], **routing: Any) -> AsyncOpenAI:
    cfg = config(sim, targets, **routing)
    return AsyncOpenAI(config=cfg, verify=sim.ssl_context(), max_retries=0)


async def ask(c: AsyncOpenAI, headers: dict[str, str] | None = None) -> tuple[str, Any]:
    stream = await c.chat.completions.create(
        model="chat", messages=MESSAGES, stream=True, extra_headers=headers or {}
    )
    text = "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
    return text, stream.route  # type: ignore[attr-defined]


async def test_a_lone_target_slowed_by_a_burst_answers_every_stream(
    sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm, fast target's live deadline is the floor; a burst then makes its TTFT 1 s for
    everyone (it answers, slowly). Cutting the attempts there would only queue them again at
    the same target: they wait up to ``first_token_timeout`` and are answered, and the circuit
    stays closed. Before, every stream timed out, the circuit opened and the route refused."""
    live = functools.partial(first_token_deadline, floor=LIVE_FLOOR)
    monkeypatch.setattr(failures, "first_token_deadline", live)
    outcomes: list[Any] = []

    async def one(c: AsyncOpenAI) -> None:
        try:
            outcomes.append(await ask(c, {"x-sim-fault": "slow:1.0"}))
        except AllTargetsFailed as exc:
            outcomes.append(exc)

    async with client(sim, [A]) as c:
        expected, _ = await ask(c)
        for _ in range(5):  # warm: five fast samples make the live deadline its floor
            await ask(c)
        router = c._router
        assert router is not None
        with anyio.fail_after(15):  # a hang guard only
            async with anyio.create_task_group() as tg:
                for _ in range(6):
                    tg.start_soon(one, c)
        assert router.health(A).breaker.state == "closed"
        after, _ = await ask(c)  # and the next request (another tenant's, say) is answered
    assert [o if isinstance(o, Exception) else o[0] for o in outcomes] == [expected] * 6
    attempts = [(a.outcome, a.failed_open) for o in outcomes for a in o[1].attempts]
    assert attempts == [("won", False)] * 6
    assert after == expected


async def test_a_route_whose_every_circuit_is_open_asks_its_least_bad_target(
    sim: Simulator,
) -> None:
    """The only target's circuit is open and it answers again: the request goes to it (one
    attempt, marked in the route report) rather than being refused, and its answer closes the
    circuit. Before, the request failed at once with AllTargetsFailed."""
    async with client(sim, [A], breaker_failures=1) as c:
        router = c._router
        assert router is not None
        router._clock = FakeClock()  # no background trial comes due while the test runs
        with pytest.raises(AllTargetsFailed):
            await ask(c, fault("500"))
        assert router.health(A).breaker.state == "open"
        text, route = await ask(c)
        assert router.health(A).breaker.state == "closed"
    assert text
    assert [(a.target, a.outcome, a.failed_open) for a in route.attempts] == [(A, "won", True)]


async def test_with_every_circuit_open_each_target_is_asked_once_and_a_failing_one_stays_out(
    sim: Simulator,
) -> None:
    """Both circuits open: a request asks the first (still failing), then the second, once each,
    and is answered. Then the first, still open, is passed over while the second can be asked:
    a target that really fails stays out when another target exists."""
    async with client(sim, [A, B], breaker_failures=1) as c:
        router = c._router
        assert router is not None
        router._clock = FakeClock()  # no background trial comes due while the test runs
        with pytest.raises(AllTargetsFailed):
            await ask(c, fault("500", times=2))
        assert {router.health(t).breaker.state for t in (A, B)} == {"open"}
        text, route = await ask(c, fault("500", times=1))
        assert [(a.target, a.outcome, a.failed_open) for a in route.attempts] == [
            (A, "error", True),
            (B, "won", True),
        ]
        assert router.health(A).breaker.state == "open"
        assert router.health(B).breaker.state == "closed"
        _, route = await ask(c)
    assert text
    assert [(a.target, a.outcome, a.failed_open) for a in route.attempts] == [(B, "won", False)]


async def test_a_target_cooling_down_after_a_429_is_not_asked_through_its_circuit(
    sim: Simulator,
) -> None:
    """Failing open goes through an open circuit, never through a Retry-After the vendor asked
    for: the only target's circuit is open and it cools down for 30 s, so the request is
    refused, saying so, and nothing is sent."""
    async with client(sim, [A], breaker_failures=1) as c:
        router = c._router
        assert router is not None
        router._clock = FakeClock()
        with pytest.raises(AllTargetsFailed):
            await ask(c, fault("500"))
        router.health(A).cool_down(30.0)
        sent = sim.stats()["chat_requests"]
        with pytest.raises(AllTargetsFailed, match=r"cooling down for 30\.0 s"):
            await ask(c)
        assert sim.stats()["chat_requests"] == sent


@pytest.mark.parametrize("kind", ["completions", "embeddings"])
async def test_a_legacy_call_whose_every_circuit_is_open_asks_its_target(
    sim: Simulator, kind: str
) -> None:
    """Completions and embeddings fail over by the same rules (routing/failover.py): with the
    only target's circuit open, the call goes to it once and is answered."""

    async def call(c: AsyncOpenAI, headers: dict[str, str]) -> Any:
        if kind == "completions":
            return await c.completions.create(
                model="chat", prompt="Say hi", max_tokens=4, extra_headers=headers
            )
        return await c.embeddings.create(model="chat", input="hello", extra_headers=headers)

    async with client(sim, [A], breaker_failures=1) as c:
        router = c._router
        assert router is not None
        router._clock = FakeClock()  # no background trial comes due while the test runs
        with pytest.raises(AllTargetsFailed):
            await call(c, fault("500"))
        assert router.health(A).breaker.state == "open"
        done = await call(c, {})
        assert router.health(A).breaker.state == "closed"
    assert [(a.target, a.outcome, a.failed_open) for a in done.route.attempts] == [(A, "won", True)]
