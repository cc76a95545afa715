"""OpenTelemetry spans of chat requests (GenAI semantic conventions), read back from the SDK."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from llmroute import AllTargetsFailed, AsyncOpenAI
from llmroute.testing import Simulator

from ..conftest import KEY
from .test_metrics import MESSAGES, config, read

pytestmark = pytest.mark.anyio

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def requests(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    """The requests' spans, not their attempts' child spans (tests/metrics/test_trace_hops.py)."""
    return [s for s in exporter.get_finished_spans() if not is_attempt(s)]


def is_attempt(span: ReadableSpan) -> bool:
    return "llmroute.target" in (span.attributes or {})


def only(exporter: InMemorySpanExporter) -> ReadableSpan:
    finished = requests(exporter)
    assert len(finished) == 1, [s.name for s in finished]
    return finished[0]


def everything(span: ReadableSpan) -> str:
    parts: list[Any] = [span.name, dict(span.attributes or {})]
    parts += [(e.name, dict(e.attributes or {})) for e in span.events]
    return repr(parts)


async def test_a_routed_stream_is_one_client_span_with_its_attempts(
    sim: Simulator, spans: InMemorySpanExporter
) -> None:
    async with AsyncOpenAI(config=config(sim), verify=sim.ssl_context()) as client:
        stream = await client.chat.completions.create(
            model="chat", messages=MESSAGES, stream=True, max_tokens=12, temperature=0.5
        )
        assert not spans.get_finished_spans()  # the span lasts until the answer ends
        await read(stream)
    span = only(spans)
    attributes = span.attributes or {}
    assert span.name == "chat chat"
    assert span.kind is SpanKind.CLIENT
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == "chat"
    assert attributes["gen_ai.request.max_tokens"] == 12
    assert attributes["gen_ai.request.temperature"] == 0.5
    assert attributes["gen_ai.request.stream"] is True
    assert attributes["gen_ai.provider.name"] == "p0"
    assert attributes["gen_ai.response.model"] == "sim-small"
    assert attributes["llmroute.winner"] == "p0:sim-small"
    assert attributes["llmroute.outcome"] == "ok"
    ttft = attributes["gen_ai.response.time_to_first_chunk"]
    assert isinstance(ttft, float) and ttft > 0
    (attempt,) = span.events
    assert attempt.name == "llmroute.attempt"
    event = dict(attempt.attributes or {})
    assert event["llmroute.outcome"] == "won"
    assert event["llmroute.request_id"] == sim.last_requests[-1]["request_id"]
    assert isinstance(event["llmroute.tokens"], int) and event["llmroute.tokens"] > 0
    assert span.status.status_code is StatusCode.UNSET
    text = everything(span)
    assert KEY not in text
    assert MESSAGES[0]["content"] not in text  # prompts are never recorded
    # The attempt is a child span too, its context the traceparent it was sent with.
    (child,) = [s for s in spans.get_finished_spans() if is_attempt(s)]
    assert child.parent is not None and span.context is not None and child.context is not None
    assert child.parent.span_id == span.context.span_id
    assert (child.name, child.kind) == ("chat sim-small", SpanKind.CLIENT)
    assert dict(child.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "p0",
        "gen_ai.request.model": "sim-small",
        "llmroute.target": "p0:sim-small",
        "llmroute.reason": "first",
        "llmroute.outcome": "won",
        "llmroute.ttft": event["llmroute.ttft"],
        "llmroute.request_id": event["llmroute.request_id"],
        "llmroute.tokens": event["llmroute.tokens"],
    }
    parent = sim.last_requests[-1]["headers"]["traceparent"]
    flags = int(child.context.trace_flags)
    assert parent == f"00-{child.context.trace_id:032x}-{child.context.span_id:016x}-{flags:02x}"


async def test_a_whole_answer_carries_its_usage_and_finish_reason(
    sim: Simulator, spans: InMemorySpanExporter
) -> None:
    async with AsyncOpenAI(config=config(sim), verify=sim.ssl_context()) as client:
        completion = await client.chat.completions.create(model="chat", messages=MESSAGES)
    attributes = only(spans).attributes or {}
    assert completion.usage is not None
    assert attributes["gen_ai.response.id"] == completion.id
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert attributes["gen_ai.usage.input_tokens"] == completion.usage.prompt_tokens
    assert attributes["gen_ai.usage.output_tokens"] == completion.usage.completion_tokens


async def test_a_failed_request_is_an_error_span_with_every_attempt(
    sim: Simulator, spans: InMemorySpanExporter
) -> None:
    async with AsyncOpenAI(config=config(sim, sim), verify=sim.ssl_context(), max_retries=0) as c:
        with pytest.raises(AllTargetsFailed):
            await c.chat.completions.create(
                model="chat", messages=MESSAGES, extra_headers={"x-sim-fault": "500"}
            )
    span = only(spans)
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})["error.type"] == "AllTargetsFailed"
    outcomes = [dict(e.attributes or {})["llmroute.outcome"] for e in span.events]
    assert outcomes == ["error"] * 4  # each target of the ordered route, and its one retry
    assert KEY not in everything(span)
    children = [s for s in spans.get_finished_spans() if is_attempt(s)]
    assert [s.status.status_code for s in children] == [StatusCode.ERROR] * 4
    assert all(KEY not in everything(s) for s in children)


async def test_a_stream_left_early_is_not_an_error(
    sim: Simulator, spans: InMemorySpanExporter
) -> None:
    async with AsyncOpenAI(config=config(sim), verify=sim.ssl_context()) as client:
        stream = await client.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        async with stream:
            async for _ in stream:
                break
    span = only(spans)
    assert (span.attributes or {})["llmroute.outcome"] == "cancelled"
    assert span.status.status_code is StatusCode.UNSET


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tiered_request_carries_its_decision(
    sim: Simulator, spans: InMemorySpanExporter, stream: bool
) -> None:
    pytest.importorskip("wordllama")
    data = Path(__file__).parents[1] / "data" / "tiers_small.jsonl"
    config = {
        "providers": {"sim": {"base_url": sim.base_url, "api_key": KEY}},
        "models": {
            "chat-small": {"targets": ["sim:small-model"]},
            "chat-large": {"targets": ["sim:large-model"]},
            "auto": {
                "tiers": {"simple": "chat-small", "hard": "chat-large"},
                "default": "chat-large",
                "examples": str(data),
            },
        },
    }
    prompt: Any = [{"role": "user", "content": "hi there, how are you?"}]
    answer: Any
    async with AsyncOpenAI(config=config, verify=sim.ssl_context()) as client:
        await client.warmup()
        spans.clear()  # warmup's own calls are not the request's
        if stream:
            answer = await client.chat.completions.create(
                model="auto", messages=prompt, stream=True
            )
            await read(answer)
        else:
            answer = await client.chat.completions.create(model="auto", messages=prompt)
        decision = answer.route.tier
        forced: Any = await client.chat.completions.create(
            model="auto", messages=prompt, extra_body={"llmroute": {"tier": "hard"}}
        )
    first, second = requests(spans)
    attributes = first.attributes or {}
    assert decision is not None and decision.reason == "classifier"
    assert attributes["llmroute.tier.model"] == "auto"
    assert attributes["llmroute.tier.class"] == "simple"
    assert attributes["llmroute.tier.tier"] == "chat-small"
    assert attributes["llmroute.tier.chosen"] == "chat-small"
    assert attributes["llmroute.tier.reason"] == "classifier"
    assert attributes["llmroute.tier.probability"] == decision.probability >= 0.6
    assert attributes["llmroute.tier.micros"] == decision.micros > 0
    assert attributes["llmroute.route"] == "chat-small"
    assert attributes["llmroute.winner"] == "sim:small-model"
    assert prompt[0]["content"] not in everything(first)
    again = second.attributes or {}
    assert forced.route is not None and forced.route.winner == "sim:large-model"
    assert (again["llmroute.tier.reason"], again["llmroute.tier.class"]) == ("override", "hard")
    assert again["llmroute.tier.tier"] == "chat-large"
    assert again["llmroute.tier.micros"] == 0.0
