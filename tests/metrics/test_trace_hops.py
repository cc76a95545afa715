"""One trace across every hop: the caller's span, the gateway, and each upstream attempt of a
hedged request, read back from the OpenTelemetry SDK's in-memory exporter and from the
``traceparent`` each simulated upstream received (docs/observability.md)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import anyio
import openai
import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import llmroute
from llmroute import AsyncOpenAI
from llmroute._types import RouteReport
from llmroute.metrics._traceparent import RequestTrace, parse_traceparent
from llmroute.server import Gateway
from llmroute.testing import Profile, Simulator

from .test_tracing import everything, spans  # noqa: F401  (the SDK's in-memory exporter)

pytestmark = pytest.mark.anyio

UPSTREAM_KEY = "sk-upstream-trace-0123456789-NEVER-SHOWN"
GW_KEY = "gw-trace-key-0123456789abcdef"
PROMPT = "Tell me the secret of the eastern lighthouse."
MESSAGES: Any = [{"role": "user", "content": PROMPT}]
STATE = "caller=t61rcWkgMzE"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def held() -> Iterator[Simulator]:
    """Holds every first token until a release that never comes: a hedge always fires."""
    with Simulator(profile=Profile(reply_tokens=5, hold_first_token=True), tls=True) as server:
        yield server


def hedged(sim: Simulator, held: Simulator, **extra: Any) -> dict[str, Any]:
    return {
        "providers": {
            "held": {"base_url": held.base_url, "api_key": UPSTREAM_KEY},
            "fast": {"base_url": sim.base_url, "api_key": UPSTREAM_KEY},
            "failing": {
                "base_url": sim.base_url,
                "api_key": UPSTREAM_KEY,
                "headers": {"x-sim-fault": "500"},
            },
        },
        "models": {
            "chat": {
                "targets": ["held:sim-small", "fast:sim-small"],
                "policy": "hedge",
                "hedge_after": "50ms",
            },
            "failing": {"targets": ["failing:sim-small"]},
        },
        "routing": {"explore": 0},
        **extra,
    }


@pytest.fixture
def gateway(sim: Simulator, held: Simulator) -> Iterator[Gateway]:
    """A gateway of its own per test: its first request on the route hedges (cold stats)."""
    config = hedged(sim, held, gateway={"keys": {"ci": "GW_KEY_CI"}})
    with Gateway(
        config, environ={"GW_KEY_CI": GW_KEY}, verify=sim.ssl_context(), max_retries=0
    ) as server:
        yield server


def received(trace_id: str, *sims: Simulator) -> list[tuple[str, dict[str, Any]]]:
    """``(parent id, request record)`` of each request of this trace the simulators got."""
    out: list[tuple[str, dict[str, Any]]] = []
    for sim in sims:
        for request in list(sim.last_requests):
            parsed = parse_traceparent(request["headers"].get("traceparent", ""))
            if parsed is not None and parsed[0] == trace_id:
                out.append((parsed[1], request))
    return out


async def finished(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    """The exported spans once one named ``name`` has ended (the gateway ends its request's
    span as the stream ends, about when the caller reads its end)."""
    with anyio.fail_after(60):  # a hang guard only
        for _ in range(6000):
            done = list(exporter.get_finished_spans())
            if any(s.name == name for s in done):
                return done
            await anyio.sleep(0.01)
    raise AssertionError(f"no span {name!r} ended")


async def logged(caplog: pytest.LogCaptureFixture, text: str) -> str:
    """The one log line holding ``text`` (the gateway writes its access line once the
    response has ended, which the caller may see first)."""
    with anyio.fail_after(60):  # a hang guard only
        for _ in range(6000):
            lines = [r.getMessage() for r in caplog.records if text in r.getMessage()]
            if lines:
                (line,) = lines
                return line
            await anyio.sleep(0.01)
    raise AssertionError(f"no log line holds {text!r}")


async def test_one_trace_from_the_caller_through_the_gateway_to_both_hedged_attempts(
    gateway: Gateway,
    sim: Simulator,
    held: Simulator,
    spans: InMemorySpanExporter,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="llmroute.server")
    with trace.get_tracer("the caller").start_as_current_span("caller", kind=SpanKind.CLIENT):
        headers: dict[str, str] = {}
        propagate.inject(headers)  # the caller's traceparent, as any instrumented client sends
        headers["tracestate"] = STATE
        async with openai.AsyncOpenAI(
            base_url=gateway.base_url, api_key=GW_KEY, max_retries=0
        ) as client:
            raw = await client.chat.completions.with_raw_response.create(
                model="chat", messages=MESSAGES, stream=True, extra_headers=headers
            )
            answer = ""
            async for chunk in raw.parse():
                if chunk.choices and chunk.choices[0].delta.content:
                    answer += chunk.choices[0].delta.content
    gateway_id = raw.headers["x-request-id"]
    done = await finished(spans, "chat chat")
    caller = next(s for s in done if s.name == "caller")
    assert caller.context is not None
    trace_id = f"{caller.context.trace_id:032x}"
    assert parse_traceparent(headers["traceparent"])[:2] == (  # type: ignore[index]
        trace_id,
        f"{caller.context.span_id:016x}",
    )

    # Both attempts went upstream in the caller's trace, each with a span of its own.
    (first_parent, first), (hedge_parent, hedge) = received(trace_id, held, sim)
    assert first["path"] == hedge["path"] == "/v1/chat/completions"
    assert first_parent != hedge_parent
    for request in (first, hedge):
        flags = request["headers"]["traceparent"][-2:]
        assert flags == headers["traceparent"][-2:] and int(flags, 16) & 1  # sampled, as asked
        assert request["headers"]["tracestate"] == STATE
        assert "x-llmroute-request-id" not in request["headers"]  # never sent upstream

    # The caller's span -> the gateway's request span -> one span per attempt, all exported.
    (request_span,) = [s for s in done if s.name == "chat chat"]
    attempts = sorted(
        (s for s in done if s.name == "chat sim-small"),
        key=lambda s: s.start_time or 0,
    )
    assert request_span.parent is not None and request_span.context is not None
    assert request_span.parent.span_id == caller.context.span_id
    assert request_span.context.trace_id == caller.context.trace_id
    assert (request_span.attributes or {})["llmroute.gateway.request_id"] == gateway_id
    assert (request_span.attributes or {})["llmroute.hedges"] == 1
    assert len(attempts) == 2
    for span in attempts:
        assert span.kind is SpanKind.CLIENT
        assert span.context is not None and span.parent is not None
        assert span.context.trace_id == caller.context.trace_id
        assert span.parent.span_id == request_span.context.span_id
    ids = [f"{s.context.span_id:016x}" for s in attempts if s.context is not None]
    assert ids == [first_parent, hedge_parent]  # each upstream request's parent is its span
    lost, won = (dict(s.attributes or {}) for s in attempts)
    assert lost["llmroute.target"] == "held:sim-small"
    assert (lost["llmroute.reason"], lost["llmroute.outcome"]) == ("first", "cancelled")
    assert lost["llmroute.request_id"] == first["request_id"]  # the vendor's, kept for losers
    assert won["llmroute.target"] == "fast:sim-small"
    assert (won["llmroute.reason"], won["llmroute.outcome"]) == ("hedge", "won")
    assert won["llmroute.request_id"] == hedge["request_id"]

    # One id finds the request everywhere: the gateway's access log line has them all.
    line = await logged(caplog, gateway_id)
    assert f"trace={trace_id}" in line
    assert f"upstream={first['request_id']},{hedge['request_id']}" in line

    # Prompts and answers are never recorded.
    assert answer
    for span in done:
        text = everything(span)
        assert PROMPT not in text and answer not in text and UPSTREAM_KEY not in text
    assert PROMPT not in line and answer not in line


async def test_a_failed_request_is_found_by_any_of_its_ids(
    gateway: Gateway,
    sim: Simulator,
    spans: InMemorySpanExporter,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="llmroute.server")
    trace_id = RequestTrace().trace_id  # a new one: the simulator is the session's
    headers = {"traceparent": f"00-{trace_id}-{PARENT}-01"}
    async with openai.AsyncOpenAI(
        base_url=gateway.base_url, api_key=GW_KEY, max_retries=0
    ) as client:
        with pytest.raises(openai.APIStatusError) as failed:
            await client.chat.completions.create(
                model="failing", messages=MESSAGES, extra_headers=headers
            )
    gateway_id = failed.value.response.headers["x-request-id"]
    line = await logged(caplog, gateway_id)
    sent = [request for _, request in received(trace_id, sim)]
    (request,) = sent  # the gateway's client does not retry (max_retries=0)
    method, path, status, key, _, *ids = line.split()
    assert (method, path, status, key) == ("POST", "/v1/chat/completions", "502", "key=ci")
    assert ids == [gateway_id, f"trace={trace_id}", f"upstream={request['request_id']}"]
    done = await finished(spans, "chat failing")
    (child,) = [s for s in done if s.name == "chat sim-small"]
    assert dict(child.attributes or {})["llmroute.outcome"] == "error"
    assert dict(child.attributes or {})["llmroute.request_id"] == request["request_id"]
    assert all(s.context is not None and s.context.trace_id == int(trace_id, 16) for s in done)
    assert PROMPT not in line and all(PROMPT not in everything(s) for s in done)


async def test_the_sdk_sends_its_attempts_in_the_callers_trace(
    sim: Simulator,
    held: Simulator,
    spans: InMemorySpanExporter,  # noqa: F811
) -> None:
    async with AsyncOpenAI(config=hedged(sim, held), verify=sim.ssl_context()) as client:
        tracer = trace.get_tracer("the application")
        with tracer.start_as_current_span("handler") as handler:
            stream = await client.chat.completions.create(
                model="chat", messages=MESSAGES, stream=True
            )
            async with stream:
                async for _ in stream:
                    pass
    context = handler.get_span_context()
    trace_id = f"{context.trace_id:032x}"
    assert isinstance(stream, llmroute.AsyncStream)
    report = stream.route
    assert report is not None and report.trace_id == trace_id
    upstream = dict(received(trace_id, held, sim))
    assert [a.reason for a in report.attempts] == ["first", "hedge"]
    assert set(upstream) == {a.span_id for a in report.attempts}  # the route report says which
    for attempt in report.attempts:
        assert attempt.request_id == upstream[attempt.span_id or ""]["request_id"]
    (request_span,) = [s for s in spans.get_finished_spans() if s.name == "chat chat"]
    assert request_span.parent is not None and request_span.parent.span_id == context.span_id


def test_without_a_recording_span_attempts_continue_the_callers_trace_with_fresh_span_ids() -> None:
    incoming = {"TraceParent": f"00-{TRACE_ID}-{PARENT}-01", "tracestate": STATE, "x-a": "1"}
    request = RequestTrace.read(incoming)
    sent = [request.attempt(None, "p:m", incoming) for _ in range(2)]
    parsed = [parse_traceparent(s["traceparent"]) for s in sent]
    assert [p[0] for p in parsed if p] == [TRACE_ID, TRACE_ID]
    assert [p[2] for p in parsed if p] == [1, 1]
    spans_sent = {p[1] for p in parsed if p}
    assert len(spans_sent) == 2 and PARENT not in spans_sent  # a new parent-id per request
    for headers in sent:
        assert headers["tracestate"] == STATE and headers["x-a"] == "1"
        assert "TraceParent" not in headers  # the caller's own is replaced, whatever its case
    request.mark(report := RouteReport(route="chat", policy="hedge"))
    assert report.trace_id == TRACE_ID


def test_a_trace_is_started_when_the_caller_sent_none_or_a_broken_one() -> None:
    for incoming in (
        None,
        {"traceparent": "00-" + "0" * 32 + f"-{PARENT}-01", "tracestate": STATE},
    ):
        request = RequestTrace.read(incoming)
        headers = request.attempt(None, "p:m", incoming)
        parsed = parse_traceparent(headers["traceparent"])
        assert parsed is not None and parsed[0] == request.trace_id != TRACE_ID
        assert parsed[2] == 0  # nothing recorded it: not sampled
        assert "tracestate" not in headers  # dropped with an invalid traceparent


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        (f"00-{TRACE_ID}-{PARENT}-01", True),
        (f" 00-{TRACE_ID}-{PARENT}-00 ", True),
        (f"01-{TRACE_ID}-{PARENT}-01-what-comes-later", True),  # a later version's extra field
        (f"00-{TRACE_ID}-{PARENT}-01-extra", False),  # version 00 has none
        (f"ff-{TRACE_ID}-{PARENT}-01", False),
        (f"00-{TRACE_ID.upper()}-{PARENT}-01", False),
        (f"00-{TRACE_ID}-{'0' * 16}-01", False),
        (f"00-{TRACE_ID[:-1]}-{PARENT}-01", False),
        ("", False),
    ],
)
def test_traceparent_values_are_read_as_w3c_says(value: str, valid: bool) -> None:
    assert (parse_traceparent(value) is not None) is valid
