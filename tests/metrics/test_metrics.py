"""client.metrics: Prometheus counters and histograms of real requests, and scrape-time gauges."""

from __future__ import annotations

import gc
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry, generate_latest

import llmroute
from llmroute import AllTargetsFailed, AsyncOpenAI, StreamInterrupted
from llmroute._types import AttemptReport, RouteReport, Timings
from llmroute.metrics import CONTENT_TYPE, ClientMetrics
from llmroute.metrics._prometheus import MAX_MODEL_LABELS, RequestRecord
from llmroute.routing.stats import TargetSnapshot
from llmroute.testing import Simulator

from ..conftest import KEY

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Tell me about metrics."}]


def config(*sims: Simulator, policy: str = "failover", **route: Any) -> dict[str, Any]:
    return {
        "providers": {
            f"p{i}": {"base_url": sim.base_url, "api_key": KEY} for i, sim in enumerate(sims)
        },
        "models": {
            "chat": {
                "targets": [f"p{i}:sim-small" for i in range(len(sims))],
                "policy": policy,
                **route,
            }
        },
    }


def value(metrics: ClientMetrics, name: str, **labels: str) -> float:
    sample = metrics.registry.get_sample_value(name, labels)
    return 0.0 if sample is None else sample


async def read(stream: Any) -> str:
    parts: list[str] = []
    async with stream:
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


async def test_routed_streams_fill_the_histograms_per_target(sim: Simulator) -> None:
    async with AsyncOpenAI(config=config(sim), verify=sim.ssl_context()) as client:
        for _ in range(3):
            stream = await client.chat.completions.create(
                model="chat", messages=MESSAGES, stream=True
            )
            assert await read(stream)
        await client.chat.completions.create(model="chat", messages=MESSAGES)
        m = client.metrics
        ok = {"route": "chat", "outcome": "ok", "source": "live"}
        assert value(m, "llmroute_requests_total", **ok) == 4
        assert value(m, "llmroute_ttft_seconds_count", target="p0:sim-small") == 3
        assert value(m, "llmroute_request_ttft_seconds_count", route="chat", source="live") == 3
        assert value(m, "llmroute_inter_token_seconds_count", target="p0:sim-small") == 3
        assert value(m, "llmroute_response_seconds_count", target="p0:sim-small") == 1
        won = {"target": "p0:sim-small", "reason": "first", "outcome": "won"}
        assert value(m, "llmroute_attempts_total", **won) == 4
        text = m.exposition().decode()
        assert "# TYPE llmroute_ttft_seconds histogram" in text
        assert 'llmroute_in_flight{target="p0:sim-small"} 0.0' in text
        assert KEY not in text
        assert CONTENT_TYPE.startswith("text/plain")


async def test_failures_and_cancellations_have_their_outcome(sim: Simulator) -> None:
    cfg = config(sim)
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context(), max_retries=0) as client:
        with pytest.raises(AllTargetsFailed):
            await client.chat.completions.create(
                model="chat", messages=MESSAGES, stream=True, extra_headers={"x-sim-fault": "500"}
            )
        stream = await client.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        async with stream:
            async for _ in stream:
                break  # the caller leaves early
        m = client.metrics
        assert value(m, "llmroute_requests_total", route="chat", outcome="error", source="live")
        error = {"target": "p0:sim-small", "reason": "first", "outcome": "error"}
        assert value(m, "llmroute_attempts_total", **error) == 1
        cancelled = {"route": "chat", "outcome": "cancelled", "source": "live"}
        assert value(m, "llmroute_requests_total", **cancelled) == 1
        # A stream left early has no inter-token sample: it never ended whole.
        assert value(m, "llmroute_inter_token_seconds_count", target="p0:sim-small") == 0


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # trio warns of the abandoned generator
async def test_a_stream_dropped_after_a_bare_break_is_counted(sim: Simulator) -> None:
    async with AsyncOpenAI(config=config(sim), verify=sim.ssl_context()) as client:
        stream = await client.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        async for _ in stream:
            break
        del stream
        gc.collect()
        cancelled = {"route": "chat", "outcome": "cancelled", "source": "live"}
        assert value(client.metrics, "llmroute_requests_total", **cancelled) == 1


async def test_a_stream_that_breaks_is_interrupted(sim: Simulator) -> None:
    cfg = config(sim, continue_on_break=False)
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context(), max_retries=0) as client:
        stream = await client.chat.completions.create(
            model="chat", messages=MESSAGES, stream=True, extra_headers={"x-sim-fault": "drop:3"}
        )
        with pytest.raises(StreamInterrupted):
            await read(stream)
        interrupted = {"route": "chat", "outcome": "interrupted", "source": "live"}
        assert value(client.metrics, "llmroute_requests_total", **interrupted) == 1
        assert value(client.metrics, "llmroute_requests_total", route="chat", outcome="ok") == 0


async def test_cache_hits_are_counted_once(sim: Simulator) -> None:
    cfg = {**config(sim), "cache": {"backend": "memory", "min_hits": 1}}
    async with AsyncOpenAI(config=cfg, verify=sim.ssl_context()) as client:
        asks = 0
        while asks < 20:  # the store is written after the caller has the answer
            asks += 1
            stream = await client.chat.completions.create(
                model="chat", messages=MESSAGES, stream=True, temperature=0
            )
            await read(stream)
            if stream.route is not None and stream.route.cache_hit:
                break
            await anyio.sleep(0.05)
        m = client.metrics
        assert value(m, "llmroute_cache_hits_total", route="chat", kind="cache") == 1
        hits = value(m, "llmroute_requests_total", route="chat", outcome="ok", source="cache")
        live = value(m, "llmroute_requests_total", route="chat", outcome="ok", source="live")
        assert (hits, live) == (1, asks - 1)
        # Only live requests asked a target.
        won = {"target": "p0:sim-small", "reason": "first", "outcome": "won"}
        assert value(m, "llmroute_attempts_total", **won) == live
        assert value(m, "llmroute_request_ttft_seconds_count", route="chat", source="cache") == hits


async def test_requests_to_a_plain_model_are_counted_by_host(sim: Simulator) -> None:
    async with AsyncOpenAI(api_key=KEY, base_url=sim.base_url, verify=sim.ssl_context()) as client:
        stream = await client.chat.completions.create(
            model="sim-small", messages=MESSAGES, stream=True
        )
        await read(stream)
        m = client.metrics
        assert value(m, "llmroute_requests_total", route="sim-small", outcome="ok", source="live")
        assert value(m, "llmroute_ttft_seconds_count", target="127.0.0.1:sim-small") == 1
        # Copies share their parent's metrics.
        copy = client.with_options(timeout=5)
        assert copy.metrics is client.metrics


def test_model_names_that_are_not_routes_are_bounded_labels() -> None:
    metrics = ClientMetrics()
    for i in range(MAX_MODEL_LABELS + 50):
        telemetry = metrics.begin(f"model-{i}", {}, stream=False, host="api.example")
        telemetry.failed(RuntimeError("no"))
    routes = {
        sample.labels["route"]
        for family in metrics.collect()
        if family.name == "llmroute_requests"
        for sample in family.samples
    }
    assert len(routes) == MAX_MODEL_LABELS + 1
    other = {"route": "other", "outcome": "error", "source": "live"}
    assert value(metrics, "llmroute_requests_total", **other) == 50
    error = {"target": "api.example:other", "reason": "first", "outcome": "error"}
    assert value(metrics, "llmroute_attempts_total", **error) == 0  # no timings: not an attempt
    # A name seen before keeps its own label.
    metrics.begin("model-0", {}, stream=False, host="api.example").failed(RuntimeError("no"))
    model0 = {"route": "model-0", "outcome": "error", "source": "live"}
    assert value(metrics, "llmroute_requests_total", **model0) == 2


async def test_in_flight_is_read_when_scraped(sim_slow: Simulator) -> None:
    async with AsyncOpenAI(config=config(sim_slow), verify=sim_slow.ssl_context()) as client:
        stream = await client.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        async with stream:
            async for _ in stream:
                break
            during = value(client.metrics, "llmroute_in_flight", target="p0:sim-small")
        after = value(client.metrics, "llmroute_in_flight", target="p0:sim-small")
        assert (during, after) == (1, 0)


def snapshot(name: str, breaker: str) -> TargetSnapshot:
    return TargetSnapshot(
        name=name,
        n=10,
        ttft_p50=0.1,
        ttft_p95=0.4,
        ttft_p99=0.5,
        ttft_mean=0.12,
        itl_p50=0.01,
        tokens_per_s=90.0,
        latency_p50=None,
        latency_p95=None,
        error_rate=0.5,
        timeout_rate=0.0,
        rate_limited_rate=0.0,
        in_flight=2,
        breaker=breaker,
    )


def test_breaker_state_and_live_p95_come_from_the_router() -> None:
    snaps = {"a:m": snapshot("a:m", "open"), "b:m": snapshot("b:m", "half-open")}
    metrics = ClientMetrics(lambda: snaps)
    state = "llmroute_breaker_state"
    assert value(metrics, state, target="a:m", llmroute_breaker_state="open") == 1
    assert value(metrics, state, target="a:m", llmroute_breaker_state="closed") == 0
    assert value(metrics, state, target="b:m", llmroute_breaker_state="half-open") == 1
    assert value(metrics, "llmroute_in_flight", target="b:m") == 2
    assert value(metrics, "llmroute_target_ttft_p95_seconds", target="a:m") == 0.4


def hedged_report() -> RouteReport:
    report = RouteReport(route="chat", policy="hedge", winner="b:m", ttft=0.25, hedges=2)
    report.hedges_denied = 1
    report.attempts = [
        AttemptReport("a:m", 0.0, "first", "cancelled"),
        AttemptReport("b:m", 0.2, "hedge", "won", ttft=0.05),
        AttemptReport("c:m", 0.22, "hedge", "error", error="500"),
    ]
    return report


def test_hedges_fired_won_and_denied_are_counted_from_the_report() -> None:
    metrics = ClientMetrics()
    timings = Timings(started_at=0.0, first_token=0.05, total=0.45, tokens=5)
    record = RequestRecord("chat", "ok", stream=True, report=hedged_report(), timings=timings)
    metrics.observe(record)
    assert value(metrics, "llmroute_hedges_fired_total", route="chat") == 2
    assert value(metrics, "llmroute_hedges_won_total", route="chat") == 1
    assert value(metrics, "llmroute_hedges_denied_total", route="chat") == 1
    attempts = "llmroute_attempts_total"
    assert value(metrics, attempts, target="a:m", reason="first", outcome="cancelled") == 1
    assert value(metrics, attempts, target="c:m", reason="hedge", outcome="error") == 1
    # The caller's TTFT includes the wait before the hedge; the target's is its own.
    assert value(metrics, "llmroute_request_ttft_seconds_sum", route="chat", source="live") == 0.25
    assert value(metrics, "llmroute_ttft_seconds_sum", target="b:m") == 0.05
    # (0.45 - 0.05) / 4 gaps between 5 tokens
    assert value(metrics, "llmroute_inter_token_seconds_sum", target="b:m") == pytest.approx(0.1)


def test_a_shared_answer_does_not_count_the_leaders_attempts_again() -> None:
    metrics = ClientMetrics()
    report = hedged_report()
    report.shared = True
    timings = Timings(started_at=0.0, first_token=0.3, total=0.5, tokens=5)
    metrics.observe(RequestRecord("chat", "ok", stream=True, report=report, timings=timings))
    assert value(metrics, "llmroute_cache_hits_total", route="chat", kind="shared") == 1
    won = {"target": "b:m", "reason": "hedge", "outcome": "won"}
    assert value(metrics, "llmroute_attempts_total", **won) == 0
    assert value(metrics, "llmroute_hedges_fired_total", route="chat") == 0


def test_it_is_a_collector_for_another_registry() -> None:
    metrics = ClientMetrics()
    metrics.observe(RequestRecord("chat", "error", stream=False))
    registry = CollectorRegistry()
    registry.register(metrics)
    text = generate_latest(registry).decode()
    assert 'llmroute_requests_total{outcome="error",route="chat",source="live"} 1.0' in text


def test_the_sync_client_has_the_same_metrics(sim: Simulator) -> None:
    with llmroute.OpenAI(config=config(sim), verify=sim.ssl_context()) as client:
        client.chat.completions.create(model="chat", messages=MESSAGES)
        sample = client.metrics.registry.get_sample_value(
            "llmroute_requests_total", {"route": "chat", "outcome": "ok", "source": "live"}
        )
        assert sample == 1


def test_targets_left_out_for_their_context_window_are_counted() -> None:
    metrics = ClientMetrics()
    report = RouteReport(route="chat", policy="failover", winner="b:m", ttft=0.1)
    report.attempts = [AttemptReport("b:m", 0.0, "first", "won", ttft=0.1)]
    report.left_out = {"a:m": "context window 8192 < ~9000 tokens (prompt estimate + answer room)"}
    timings = Timings(started_at=0.0, first_token=0.1, total=0.2, tokens=3)
    metrics.observe(RequestRecord("chat", "ok", stream=True, report=report, timings=timings))
    assert value(metrics, "llmroute_left_out_total", target="a:m") == 1
