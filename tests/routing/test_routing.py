"""The routing engine end to end, against simulated providers over TLS + HTTP/2."""

from __future__ import annotations

import gc
import math
from collections.abc import AsyncIterator
from typing import Any

import anyio
import openai
import pytest

from llmroute import AllTargetsFailed, AsyncOpenAI, RequestBodyError, StreamInterrupted
from llmroute.testing import Profile, Simulator

from ..clock import FakeClock
from ..conftest import KEY, fault
from ..settle import settled

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Tell me about routing."}]


def config(providers: dict[str, Simulator], targets: list[str], **route: Any) -> dict[str, Any]:
    return {
        "providers": {
            name: {"base_url": sim.base_url, "api_key": KEY, "continuation": {}}
            for name, sim in providers.items()
        },
        "models": {"chat": {"targets": targets, **route}},
        "routing": {"explore": 0},  # no random exploration: these tests check exact attempts
    }


async def clean_reply(sim: Simulator, messages: list[dict[str, Any]] = MESSAGES) -> str:
    async with AsyncOpenAI(api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context()) as c:
        completion = await c.chat.completions.create(model="sim-small", messages=messages)
    return completion.choices[0].message.content or ""


async def read(stream: Any) -> tuple[str, list[Any]]:
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


async def wait_for(predicate: Any, seconds: float = 10.0) -> None:
    """Poll ``predicate`` (bounded in time); the assertion after it decides the test."""
    with anyio.move_on_after(seconds):
        while not predicate():  # noqa: ASYNC110 - the simulator's counters have no event
            await anyio.sleep(0.02)


@pytest.fixture
async def pair(sim: Simulator) -> AsyncIterator[AsyncOpenAI]:
    """Two providers on one simulator, so a fault used once hits only the first target."""
    cfg = config({"a": sim, "b": sim}, ["a:sim-small", "b:sim-small"], policy="failover")
    async with AsyncOpenAI(
        api_key=KEY, config=cfg, verify=sim.ssl_context(), max_retries=0
    ) as client:
        yield client


async def test_routed_stream_is_the_clean_reply_with_a_route_report(
    sim: Simulator, pair: AsyncOpenAI
) -> None:
    expected = await clean_reply(sim)
    stream = await pair.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
    text, chunks = await read(stream)
    assert text == expected
    assert chunks[-1].choices[0].finish_reason == "stop"
    route = stream.route
    assert route is not None and route.route == "chat" and route.policy == "failover"
    assert route.winner == "a:sim-small"
    assert [(a.target, a.reason, a.outcome) for a in route.attempts] == [
        ("a:sim-small", "first", "won")
    ]
    assert route.attempts[0].ttft is not None and route.attempts[0].ttft > 0
    assert stream.timings.first_token is not None and stream.timings.tokens == 20
    assert sim.last_requests[-1]["json"]["model"] == "sim-small"


async def test_a_model_that_is_not_a_route_goes_to_the_default_provider(sim: Simulator) -> None:
    cfg = config({"a": sim}, ["a:sim-small"])
    async with AsyncOpenAI(
        api_key=KEY, base_url=sim.base_url, config=cfg, verify=sim.ssl_context()
    ) as client:
        stream = await client.chat.completions.create(
            model="sim-large", messages=MESSAGES, stream=True
        )
        text, _ = await read(stream)
    assert text and stream.route is None


async def test_routes_only_client_without_default_provider_says_why(sim: Simulator) -> None:
    cfg = config({"a": sim}, ["a:sim-small"])
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        with pytest.raises(openai.OpenAIError, match="not a route of the config"):
            await client.chat.completions.create(model="gpt-x", messages=MESSAGES)
        completion = await client.chat.completions.create(model="chat", messages=MESSAGES)
    assert completion.choices[0].message.content


@pytest.mark.parametrize(
    ("kind", "outcome"),
    [
        ("429", "rate_limited"),
        ("500", "error"),
        ("503", "error"),
        ("html502", "error"),
        ("drop:0", "error"),
        ("malformed:0", "error"),
        ("stream-error:0", "error"),
        ("hang", "timeout"),
    ],
)
async def test_failover_before_the_first_token(sim: Simulator, kind: str, outcome: str) -> None:
    expected = await clean_reply(sim)
    cfg = config(
        {"a": sim, "b": sim},
        ["a:sim-small", "b:sim-small"],
        policy="failover",
        first_token_timeout="1s",
        server_error_retries=0,  # a 5xx fails over at once (the retry is tested below)
    )
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context(), max_retries=0) as client:
        headers = {**fault(kind), "x-sim-retry-after": "20"}
        stream = await client.chat.completions.create(
            model="chat", messages=MESSAGES, stream=True, extra_headers=headers
        )
        text, _ = await read(stream)
        route = stream.route
        assert text == expected
        assert route is not None and route.winner == "b:sim-small"
        first, second = route.attempts
        assert (first.target, first.outcome) == ("a:sim-small", outcome)
        assert first.error
        assert (second.reason, second.outcome) == ("failover", "won")
        stats = client.stats()["a:sim-small"]
        assert stats.outcomes[outcome] == 1
        if kind == "429":  # Retry-After becomes the target's cooldown
            assert client._router is not None
            assert client._router.health("a:sim-small").cooling() > 10


async def test_failover_after_a_connection_error(sim: Simulator) -> None:
    with Simulator(tls=True) as gone:
        dead_url = gone.base_url
    cfg = {
        "providers": {
            "dead": {"base_url": dead_url, "api_key": KEY},
            "b": {"base_url": sim.base_url, "api_key": KEY},
        },
        "models": {"chat": {"targets": ["dead:m", "b:sim-small"], "policy": "failover"}},
    }
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context(), max_retries=0) as client:
        stream = await client.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        text, _ = await read(stream)
    assert text == await clean_reply(sim)
    assert stream.route is not None
    assert [a.outcome for a in stream.route.attempts] == ["error", "won"]
    assert "APIConnectionError" in (stream.route.attempts[0].error or "")


async def test_hedge_fires_and_the_loser_is_reset_server_side(
    sim: Simulator, sim_stall: Simulator
) -> None:
    cfg = config(
        {"slow": sim_stall, "fast": sim},
        ["slow:sim-small", "fast:sim-small"],
        policy="hedge",
        hedge_after="100ms",
    )
    await settled(sim_stall)
    cancelled = sim_stall.stats()["streams_cancelled"]
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        await client.warmup()
        stream = await client.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        text, _ = await read(stream)
        route = stream.route
        assert route is not None and route.hedges == 1
        assert route.winner == "fast:sim-small"
        slow, fast = route.attempts
        assert (slow.target, slow.outcome) == ("slow:sim-small", "cancelled")
        assert (fast.reason, fast.outcome) == ("hedge", "won")
        await wait_for(lambda: sim_stall.stats()["streams_cancelled"] > cancelled)
        assert sim_stall.stats()["streams_cancelled"] == cancelled + 1
        # Only the stream was reset: the connection to the slow target stays open and warm.
        transport = client._transport
        assert transport is not None
        assert len(transport.connections()) == 2  # one per simulator, none replaced
        assert text == await clean_reply(sim)
        assert client.stats()["slow:sim-small"].outcomes["cancelled"] == 1
        # The winning hedge was refunded: a degradation's hedges do not drain the budget.
        budget = client._router.routes["chat"].budget  # type: ignore[union-attr]
        assert budget.tokens == budget.burst


async def test_a_failed_hedge_is_replaced_at_once(sim: Simulator, sim_stall: Simulator) -> None:
    with Simulator(profile=Profile(rate_500=1.0), tls=True) as broken:
        cfg = config(
            {"slow": sim_stall, "broken": broken, "fast": sim},
            ["slow:sim-small", "broken:sim-small", "fast:sim-small"],
            policy="hedge",
            hedge_after="1s",
            hedge_budget=1.0,
        )
        await settled(sim_stall)
        async with AsyncOpenAI(config=cfg, verify=sim.ssl_context(), max_retries=0) as client:
            stream = await client.chat.completions.create(
                model="chat", messages=MESSAGES, stream=True
            )
            await read(stream)
    route = stream.route
    assert route is not None and route.winner == "fast:sim-small"
    first, hedge, replacement = route.attempts
    assert (first.target, first.outcome) == ("slow:sim-small", "cancelled")
    assert (hedge.target, hedge.reason, hedge.outcome) == ("broken:sim-small", "hedge", "error")
    # The failed hedge's replacement starts when it fails, as a failover, not one more hedge
    # delay later: that would be a second hedge, fired by the timer and counted in the budget.
    assert (replacement.reason, replacement.outcome) == ("failover", "won")
    assert route.hedges == 1 and route.hedges_denied == 0


async def test_a_retry_round_starts_one_attempt_not_one_per_earlier_hedge() -> None:
    profile = Profile(reply_tokens=5, hang_max=5.0)
    with (
        Simulator(profile=profile, tls=True) as a,
        Simulator(profile=profile, tls=True) as b,
        Simulator(profile=profile, tls=True) as c,
    ):
        cfg = config(
            {"a": a, "b": b, "c": c},
            ["a:sim-small", "b:sim-small", "c:sim-small"],
            policy="hedge",
            # The retry round's answer (no TTFT) must come before its hedge delay, or a hedge
            # fires: 500 ms leaves a loaded machine room, 100 ms left little.
            hedge_after="500ms",
            first_token_timeout="2s",
        )
        # Every simulator hangs on its first request with this key, then answers.
        async with AsyncOpenAI(config=cfg, verify=a.ssl_context(), max_retries=2) as client:
            stream = await client.chat.completions.create(
                model="chat", messages=MESSAGES, stream=True, extra_headers=fault("hang", 1)
            )
            await read(stream)
    route = stream.route
    assert route is not None
    reasons = [(a.reason, a.outcome) for a in route.attempts]
    assert reasons[:3] == [("first", "timeout"), ("hedge", "timeout"), ("failover", "timeout")]
    assert reasons[3] == ("retry", "won")
    assert len(reasons) == 4  # the retry round began with one attempt, as the first did


async def test_an_unencodable_body_is_the_requests_error_not_the_targets(sim: Simulator) -> None:
    cfg = config({"a": sim, "b": sim}, ["a:sim-small", "b:sim-small"], policy="failover")
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context(), max_retries=0) as client:
        for _ in range(6):  # more than the breaker's 5 failures
            with pytest.raises(RequestBodyError, match="cannot be encoded"):
                await client.chat.completions.create(
                    model="chat", messages=[{"role": "user", "content": "x\ud800"}], stream=True
                )
        assert {snap.breaker for snap in client.stats().values()} == {"closed"}
        text, _ = await read(
            await client.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        )
    assert text == await clean_reply(sim)


async def test_race_starts_both_and_cancels_the_loser(sim: Simulator, sim_stall: Simulator) -> None:
    cfg = config(
        {"slow": sim_stall, "fast": sim}, ["slow:sim-small", "fast:sim-small"], policy="race"
    )
    await settled(sim_stall)
    cancelled = sim_stall.stats()["streams_cancelled"]
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        await client.warmup()  # so the losing request is on the wire before the winner's token
        stream = await client.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        await read(stream)
    route = stream.route
    assert route is not None and route.winner == "fast:sim-small"
    assert sorted(a.reason for a in route.attempts) == ["race", "race"]
    assert {a.target: a.outcome for a in route.attempts} == {
        "slow:sim-small": "cancelled",
        "fast:sim-small": "won",
    }
    await wait_for(lambda: sim_stall.stats()["streams_cancelled"] > cancelled)
    assert sim_stall.stats()["streams_cancelled"] == cancelled + 1


async def test_an_empty_hedge_budget_fires_no_hedge(sim: Simulator) -> None:
    cfg = config(
        {"a": sim, "b": sim},
        ["a:sim-small", "b:sim-small"],
        policy="hedge",
        hedge_after="20ms",
        hedge_budget=0,
    )
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        stream = await client.chat.completions.create(
            model="chat", messages=MESSAGES, stream=True, extra_headers={"x-sim-fault": "slow:0.3"}
        )
        await read(stream)
    route = stream.route
    assert route is not None
    assert (route.hedges, route.hedges_denied) == (0, 1)
    assert len(route.attempts) == 1


async def test_a_broken_stream_continues_on_another_target_seamlessly(sim: Simulator) -> None:
    expected = await clean_reply(sim)
    cfg = config({"a": sim, "b": sim}, ["a:sim-small", "b:sim-small"], policy="failover")
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        stream = await client.chat.completions.create(
            model="chat", messages=MESSAGES, stream=True, extra_headers=fault("drop:5")
        )
        text, chunks = await read(stream)
        continuation = sim.last_requests[-1]["json"]
    assert text == expected
    token_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(token_chunks) == 20  # nothing repeated, nothing lost
    assert len({c.id for c in chunks}) == 1  # one answer, one id
    assert chunks[-1].choices[0].finish_reason == "stop"
    route = stream.route
    assert route is not None and route.continued_on == ["b:sim-small"]
    assert [(a.target, a.outcome) for a in route.attempts] == [
        ("a:sim-small", "interrupted"),
        ("b:sim-small", "won"),
    ]
    assert route.attempts[1].reason == "continuation"
    last = continuation["messages"][-1]
    assert last["role"] == "assistant" and expected.startswith(last["content"])
    assert 0 < len(last["content"]) < len(expected)


async def test_continuation_uses_the_vendors_fields(sim: Simulator) -> None:
    cfg = {
        "providers": {
            "a": {"base_url": sim.base_url, "api_key": KEY},
            "deep": {
                "base_url": sim.base_url,
                "api_key": KEY,
                "continuation": {"message": {"prefix": True}, "body": {"x_continue": True}},
            },
        },
        "models": {"chat": {"targets": ["a:sim-small", "deep:sim-small"], "policy": "failover"}},
    }
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        stream = await client.chat.completions.create(
            model="chat",
            messages=MESSAGES,
            stream=True,
            max_tokens=50,
            extra_headers=fault("drop:4"),
        )
        text, _ = await read(stream)
        body = sim.last_requests[-1]["json"]
    assert text == await clean_reply(sim)
    assert body["messages"][-1]["prefix"] is True and body["x_continue"] is True
    # The tokens already received are not asked for again: before the target's answers told
    # its tokens per delta, one per delta (the simulator's are words, one per delta).
    assert body["max_tokens"] == 50 - len(body["messages"][-1]["content"].split())


async def test_no_target_can_continue_raises_with_the_partial_text(sim: Simulator) -> None:
    expected = await clean_reply(sim)
    cfg = {
        "providers": {"a": {"base_url": sim.base_url, "api_key": KEY}},
        "models": {"chat": {"targets": ["a:sim-small"]}},
    }
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        stream = await client.chat.completions.create(
            model="chat", messages=MESSAGES, stream=True, extra_headers=fault("drop:6")
        )
        seen = []
        with pytest.raises(StreamInterrupted) as info:
            async for chunk in stream:
                if chunk.choices:
                    seen.append(chunk.choices[0].delta.content or "")
    partial = info.value.partial_text
    assert partial == "".join(seen) and partial and expected.startswith(partial)
    assert partial != expected
    assert "supports continuation" in str(info.value)
    assert isinstance(info.value, openai.APIError)


async def test_continue_on_break_off_raises(sim: Simulator) -> None:
    cfg = config({"a": sim, "b": sim}, ["a:sim-small", "b:sim-small"], continue_on_break=False)
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        stream = await client.chat.completions.create(
            model="chat", messages=MESSAGES, stream=True, extra_headers=fault("drop:3")
        )
        with pytest.raises(StreamInterrupted, match="continuation is off"):
            await read(stream)


async def test_max_continuations_zero_continues_nothing(sim: Simulator) -> None:
    """A route's ``max_continuations`` reaches the engine: with 0 a broken stream raises,
    though another target could continue it."""
    cfg = config({"a": sim, "b": sim}, ["a:sim-small", "b:sim-small"], max_continuations=0)
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        stream = await client.chat.completions.create(
            model="chat", messages=MESSAGES, stream=True, extra_headers=fault("drop:3")
        )
        with pytest.raises(StreamInterrupted, match="continued too often"):
            await read(stream)


async def test_breaker_opens_and_recovers_with_one_background_trial(sim: Simulator) -> None:
    """An ordered route: the open circuit is skipped; once its cooldown is over a trial goes in
    the background (the request that notices it goes to b and does not wait), and its answer
    closes the circuit, so the next request is a's again."""
    cfg = config(
        {"a": sim, "b": sim},
        ["a:sim-small", "b:sim-small"],
        policy="failover",
        server_error_retries=0,  # each 500 counts once, then fails over
    )
    cfg["routing"] = {"breaker_failures": 2, "breaker_cooldown": "30s", "explore": 0}
    clock = FakeClock()
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context(), max_retries=0) as client:
        router = client._router
        assert router is not None and router.trials is client._llmroute.trials
        trials = client._llmroute.trials
        router._clock = clock
        for _ in range(2):
            completion = await client.chat.completions.create(
                model="chat", messages=MESSAGES, extra_headers=fault("500")
            )
            assert completion.route.winner == "b:sim-small"  # type: ignore[attr-defined]
        assert client.stats()["a:sim-small"].breaker == "open"
        completion = await client.chat.completions.create(model="chat", messages=MESSAGES)
        attempts = completion.route.attempts  # type: ignore[attr-defined]
        assert [a.target for a in attempts] == ["b:sim-small"]  # the open circuit is skipped
        assert trials.sent["a:sim-small"] == 0  # its cooldown is not over
        clock.now += 31.0  # the cooldown passed: one trial may go to a
        completion = await client.chat.completions.create(model="chat", messages=MESSAGES)
        assert completion.route.winner == "b:sim-small"  # type: ignore[attr-defined]
        breaker = router.health("a:sim-small").breaker
        await wait_for(lambda: breaker.state == "closed")
        assert trials.sent["a:sim-small"] == 1 and breaker.state == "closed"
        completion = await client.chat.completions.create(model="chat", messages=MESSAGES)
        assert completion.route.winner == "a:sim-small"  # type: ignore[attr-defined]
        assert not trials.running


@pytest.mark.parametrize("policy", ["fastest", "hedge"])
async def test_a_latency_route_probes_an_open_circuit_in_the_background(
    sim: Simulator, policy: str
) -> None:
    """A latency policy ranks a target with an open circuit last, so no request would try it
    again: once the cooldown is over, the client's trials send it a one-token request in the
    background (the caller does not wait on it), and its answer closes the circuit."""
    cfg = config({"a": sim, "b": sim}, ["a:sim-small", "b:sim-small"], policy=policy)
    cfg["routing"] = {"breaker_failures": 1, "breaker_cooldown": "30s", "explore": 0}
    clock = FakeClock()
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context(), max_retries=0) as client:
        router = client._router
        assert router is not None
        router._clock = clock
        breaker = router.health("b:sim-small").breaker
        breaker.record_failure()  # b had an outage: its circuit is open
        asked = sim.stats()["chat_requests"]
        stream = await client.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        await read(stream)
        assert [a.target for a in stream.route.attempts] == ["a:sim-small"]
        assert sim.stats()["chat_requests"] == asked + 1 and breaker.state == "open"
        clock.advance(31.0)  # the cooldown is over: b may be tried once
        stream = await client.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        await read(stream)
        assert [a.target for a in stream.route.attempts] == ["a:sim-small"]
        await wait_for(lambda: breaker.state == "closed")
        assert breaker.state == "closed"  # the trial answered: b is back
        assert sim.stats()["chat_requests"] == asked + 3
        trials = [r for r in sim.last_requests if r["json"].get("max_tokens") == 1]
        assert trials and not trials[-1]["json"].get("stream")


async def test_all_targets_failed_lists_every_cause(sim: Simulator) -> None:
    cfg = config({"a": sim, "b": sim}, ["a:sim-small", "b:sim-small"], policy="failover")
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context(), max_retries=0) as client:
        with pytest.raises(AllTargetsFailed) as info:
            await client.chat.completions.create(
                model="chat", messages=MESSAGES, stream=True, extra_headers={"x-sim-fault": "500"}
            )
    exc = info.value
    assert isinstance(exc, openai.APIError)
    assert set(exc.errors) == {"a:sim-small", "b:sim-small"}
    assert all(isinstance(e, openai.InternalServerError) for e in exc.errors.values())
    text = str(exc)
    assert "'chat'" in text and "a:sim-small: InternalServerError" in text
    assert "b:sim-small: InternalServerError" in text
    assert isinstance(exc, openai.InternalServerError) and exc.status_code == 500
    assert [(a.target, a.reason, a.outcome) for a in exc.report.attempts] == [
        ("a:sim-small", "first", "error"),
        ("a:sim-small", "retry", "error"),  # an ordered route retries its primary once
        ("b:sim-small", "failover", "error"),
        ("b:sim-small", "retry", "error"),  # and so each target in its turn
    ]


async def test_all_failed_rounds_are_retried_within_max_retries(sim: Simulator) -> None:
    cfg = config({"a": sim}, ["a:sim-small"])
    before = sim.stats()["chat_requests"]
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context(), max_retries=2) as client:
        stream = await client.chat.completions.create(
            model="chat",
            messages=MESSAGES,
            stream=True,
            extra_headers={**fault("503", times=2), "x-sim-retry-after": "0.01"},
        )
        await read(stream)
    route = stream.route
    assert route is not None
    assert [a.reason for a in route.attempts] == ["first", "retry", "retry"]
    assert route.attempts[-1].outcome == "won"
    assert sim.stats()["chat_requests"] - before == 3


async def test_not_streamed_routed_request(sim: Simulator, pair: AsyncOpenAI) -> None:
    completion = await pair.chat.completions.create(
        model="chat", messages=MESSAGES, extra_headers=fault("500", times=2)
    )
    assert completion.choices[0].message.content == await clean_reply(sim)
    route = completion.route  # type: ignore[attr-defined]
    assert route.winner == "b:sim-small"  # after the primary failed twice (its retry)
    assert completion.timings.total is not None  # type: ignore[attr-defined]
    assert pair.stats()["b:sim-small"].latency_p50 is not None


async def test_stats_snapshot_after_traffic(sim: Simulator, pair: AsyncOpenAI) -> None:
    for _ in range(6):
        stream = await pair.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        await read(stream)
    stats = pair.stats()
    a = stats["a:sim-small"]
    assert a.n == 6 and a.in_flight == 0 and a.breaker == "closed"
    assert a.ttft_p50 is not None and a.ttft_p95 is not None and a.ttft_p99 is not None
    assert a.ttft_p50 <= a.ttft_p95 <= a.ttft_p99
    assert a.itl_p50 is not None and a.tokens_per_s is not None and a.tokens_per_s > 0
    assert a.outcomes["ok"] == 6 and a.error_rate == 0.0
    assert list(a.by_class) == ["<1k"]
    assert stats["b:sim-small"].n == 0  # listed although never used
    assert math.isclose(sum(a.to_dict()["outcomes"].values()), 6)


async def test_leaving_a_routed_stream_early_releases_it(sim: Simulator) -> None:
    slow = Profile(reply_tokens=200, inter_token=0.01)
    with Simulator(profile=slow, tls=True) as busy:
        cfg = config({"a": busy}, ["a:sim-small"])
        async with AsyncOpenAI(config=cfg, verify=busy.ssl_context()) as client:
            stream = await client.chat.completions.create(
                model="chat", messages=MESSAGES, stream=True
            )
            async with stream:
                async for _ in stream:
                    break
            assert client.stats()["a:sim-small"].in_flight == 0
            await wait_for(lambda: busy.stats()["streams_cancelled"] == 1)
            assert busy.stats()["streams_cancelled"] == 1
            # Closed before reading anything: released too.
            stream = await client.chat.completions.create(
                model="chat", messages=MESSAGES, stream=True
            )
            assert client.stats()["a:sim-small"].in_flight == 1
            await stream.close()
            assert client.stats()["a:sim-small"].in_flight == 0
            await wait_for(lambda: busy.stats()["streams_cancelled"] == 2)
            assert busy.stats()["streams_cancelled"] == 2


async def test_llmroute_config_environment_variable(
    sim: Simulator, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "llmroute.toml"
    path.write_text(
        f"""
[providers.a]
base_url = "{sim.base_url}"
api_key = "{KEY}"

[models.chat]
targets = ["a:sim-small"]
policy = "fastest"
"""
    )
    monkeypatch.setenv("LLMROUTE_CONFIG", str(path))
    async with AsyncOpenAI(verify=sim.ssl_context()) as client:
        completion = await client.chat.completions.create(model="chat", messages=MESSAGES)
    assert completion.route.policy == "fastest"  # type: ignore[attr-defined]
    assert KEY not in repr(client)


async def test_no_hedge_to_an_unavailable_target(sim: Simulator) -> None:
    cfg = config(
        {"a": sim, "b": sim}, ["a:sim-small", "b:sim-small"], policy="hedge", hedge_after="20ms"
    )
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        router = client._router
        assert router is not None
        router.health("b:sim-small").cool_down(30.0)  # as after a 429 with Retry-After: 30
        budget = router.routes["chat"].budget
        before = sim.stats()["chat_requests"]
        stream = await client.chat.completions.create(
            model="chat", messages=MESSAGES, stream=True, extra_headers={"x-sim-fault": "slow:0.3"}
        )
        await read(stream)
        tokens = budget.tokens
    route = stream.route
    assert route is not None
    assert [a.target for a in route.attempts] == ["a:sim-small"]
    assert (route.hedges, route.hedges_denied) == (0, 0)
    assert sim.stats()["chat_requests"] - before == 1
    assert tokens == pytest.approx(5.0)  # nothing was charged to the budget


async def test_a_trial_answered_429_waits_and_the_next_trial_closes(sim: Simulator) -> None:
    """A 429 says nothing of the target's health: the circuit stays open, the next trial waits
    for the cooldown and the Retry-After, and its answer closes the circuit."""
    with Simulator(profile=Profile(reply_tokens=5, rate_500=1.0), tls=True) as primary:
        cfg = config({"a": primary, "b": sim}, ["a:sim-small", "b:sim-small"], policy="failover")
        cfg["routing"] = {"breaker_failures": 1, "breaker_cooldown": "30s", "explore": 0}
        clock = FakeClock()
        async with AsyncOpenAI(config=cfg, verify=sim.ssl_context(), max_retries=0) as client:
            router = client._router
            assert router is not None and router.trials is client._llmroute.trials
            trials = client._llmroute.trials
            router._clock = clock
            await client.chat.completions.create(model="chat", messages=MESSAGES)
            assert client.stats()["a:sim-small"].breaker == "open"
            primary.app.profile = Profile(reply_tokens=5, rate_429=1.0, retry_after=45.0)
            clock.now += 31.0  # the trial goes, and is answered 429 with Retry-After: 45
            await client.chat.completions.create(model="chat", messages=MESSAGES)
            a = "a:sim-small"
            await wait_for(lambda: trials.verdicts[a, "none"] == 1)
            assert trials.verdicts[a, "none"] == 1
            health = router.health(a)
            assert health.breaker.state == "open" and health.trial_due_in() == 45.0
            primary.app.profile = Profile(reply_tokens=5)
            clock.now += 31.0  # still within the Retry-After: no trial
            await client.chat.completions.create(model="chat", messages=MESSAGES)
            assert trials.sent[a] == 1
            clock.now += 15.0  # the Retry-After passed: the next trial closes the circuit
            completion = await client.chat.completions.create(model="chat", messages=MESSAGES)
            assert completion.route.winner == "b:sim-small"  # type: ignore[attr-defined]
            await wait_for(lambda: health.breaker.state == "closed")
            assert health.breaker.state == "closed" and trials.sent[a] == 2
            completion = await client.chat.completions.create(model="chat", messages=MESSAGES)
            assert completion.route.winner == a  # type: ignore[attr-defined]


async def test_a_not_streamed_race_records_no_ttft(sim: Simulator, sim_stall: Simulator) -> None:
    cfg = config(
        {"slow": sim_stall, "fast": sim}, ["slow:sim-small", "fast:sim-small"], policy="race"
    )
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        completion = await client.chat.completions.create(model="chat", messages=MESSAGES)
        stats = client.stats()
    await settled(sim_stall)
    assert completion.route.winner == "fast:sim-small"  # type: ignore[attr-defined]
    assert stats["slow:sim-small"].n == 0 and stats["fast:sim-small"].n == 0
    assert stats["fast:sim-small"].latency_p50 is not None
    assert stats["slow:sim-small"].outcomes["cancelled"] == 1


async def test_a_routed_stream_dropped_unread_is_reset_at_the_next_request(
    sim: Simulator,
) -> None:
    slow = Profile(reply_tokens=200, inter_token=0.01)
    with Simulator(profile=slow, tls=True) as busy:
        cfg = config({"a": busy}, ["a:sim-small"])
        async with AsyncOpenAI(config=cfg, verify=busy.ssl_context()) as client:
            stream = await client.chat.completions.create(
                model="chat", messages=MESSAGES, stream=True
            )
            del stream
            for _ in range(3):  # the stream sits in a reference cycle: more than one pass
                gc.collect()
            assert client.stats()["a:sim-small"].in_flight == 0
            # The reset leaves with the connection's next request.
            completion = await client.chat.completions.create(model="chat", messages=MESSAGES)
            assert completion.choices[0].message.content
            await wait_for(lambda: busy.stats()["streams_cancelled"] == 1)
            assert busy.stats()["streams_cancelled"] == 1
