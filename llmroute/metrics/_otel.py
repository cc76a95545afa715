"""OpenTelemetry spans of chat requests, following the GenAI semantic conventions.

Used only when ``opentelemetry-api`` is installed (``pip install 'llmroute[otel]'``); the
application configures the SDK and exporter as usual. Without a configured tracer provider the
API hands out non-recording spans and nothing more is done.

One span per request, ``chat {model}`` of kind CLIENT, from the call to the end of its answer
(a stream's last chunk, its break, or its close). Each routed attempt is an event on it
(``llmroute.attempt``: target, reason, outcome, TTFT, error), at the moment it started, and a
child span of its own, ``chat {provider-model}`` (kind CLIENT), whose context is the
``traceparent`` the attempt was sent upstream with (:mod:`._traceparent`). A request's span
continues its caller's trace: the call's ``traceparent`` header (the gateway's caller's), else
the active span.
A request for a tiered model name carries its tier decision as ``llmroute.tier.*`` attributes
(model, class, tier, probability, reason, micros, chosen, and hedged: the two tiers of a
request hedged across them).
Prompts and answers are never recorded (no ``gen_ai.input.messages``): they may hold
anything an application's users typed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._version import __version__
from ._traceparent import RequestTrace

if TYPE_CHECKING:
    from .._types import AttemptReport, RouteCost, RouteReport, TierDecision
    from ._record import RequestRecord

__all__ = ["Tracer", "request_attributes", "tier_attributes"]

try:
    from opentelemetry import trace as _trace
except ImportError:  # the optional extra is not installed
    _trace = None  # type: ignore[assignment]

# Request parameters with a GenAI attribute of their own.
_REQUEST_ATTRIBUTES = {
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
    "seed": "gen_ai.request.seed",
    "n": "gen_ai.request.choice.count",
}


def request_attributes(model: str, body: Mapping[str, Any], *, stream: bool) -> dict[str, Any]:
    """The GenAI attributes known when a chat request starts."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": model,
        "gen_ai.request.stream": stream,
    }
    for key, name in _REQUEST_ATTRIBUTES.items():
        value = body.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            attributes[name] = value
    stop = body.get("stop")
    if isinstance(stop, str):
        attributes["gen_ai.request.stop_sequences"] = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        attributes["gen_ai.request.stop_sequences"] = list(stop)  # type: ignore[arg-type]
    return attributes


def tier_attributes(decision: TierDecision) -> dict[str, Any]:
    """The span attributes of a tiered model name's decision (``RouteReport.tier``)."""
    attributes: dict[str, Any] = {
        "llmroute.tier.model": decision.model,
        "llmroute.tier.tier": decision.tier,
        "llmroute.tier.class": decision.label or "none",
        "llmroute.tier.probability": float(decision.probability),
        "llmroute.tier.reason": decision.reason,
        "llmroute.tier.micros": float(decision.micros),
    }
    if decision.chosen is not None:
        attributes["llmroute.tier.chosen"] = decision.chosen
    if decision.hedged is not None:  # the smaller tier it started on, the larger hedge
        attributes["llmroute.tier.hedged"] = list(decision.hedged)
    return attributes  # not ``error``: a classifier's exception may quote the request


class Tracer:
    """Starts and ends the span of one request (a no-op without opentelemetry-api)."""

    def __init__(self) -> None:
        self._tracer = _trace.get_tracer("llmroute", __version__) if _trace is not None else None

    def start(
        self,
        model: str,
        body: Mapping[str, Any],
        *,
        stream: bool,
        trace: RequestTrace | None = None,
    ) -> Any:
        """The span of a request that starts now, or ``None`` when nothing would record it.

        ``trace``: the request's; its caller's ``traceparent`` is the span's parent, and a
        recording span becomes the parent of its attempts. Without one, the caller's active
        span (when valid) is the trace the attempts continue."""
        if self._tracer is None or _trace is None:
            return None
        context = None
        caller = trace.caller if trace is not None else None
        if trace is not None and caller is not None:
            context = _trace.set_span_in_context(_remote_span(caller, trace.state))
        span = self._tracer.start_span(
            f"chat {model}", context=context, kind=_trace.SpanKind.CLIENT
        )
        if not span.is_recording():
            if trace is not None and caller is None:
                active = _trace.get_current_span().get_span_context()
                if active.is_valid:
                    trace.continue_from(
                        f"{active.trace_id:032x}",
                        f"{active.span_id:016x}",
                        int(active.trace_flags),
                        active.trace_state.to_header(),
                    )
            return None
        span.set_attributes(request_attributes(model, body, stream=stream))
        if trace is not None:
            own = span.get_span_context()
            trace.continue_from(
                f"{own.trace_id:032x}", f"{own.span_id:016x}", int(own.trace_flags), None
            )
            trace.span, trace.tracer = span, self
            if trace.request_id is not None:
                span.set_attribute("llmroute.gateway.request_id", trace.request_id)
        return span

    def attempt(self, parent: Any, target: str) -> Any:
        """The span of an attempt on ``target`` that starts now: a child of ``parent``."""
        assert self._tracer is not None and _trace is not None
        provider, _, model = target.partition(":")
        return self._tracer.start_span(
            f"chat {model}",
            context=_trace.set_span_in_context(parent),
            kind=_trace.SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": provider,
                "gen_ai.request.model": model,
                "llmroute.target": target,
            },
        )

    def end(
        self,
        span: Any,
        record: RequestRecord,
        *,
        result: Any = None,
        error: BaseException | None = None,
        started_ns: int,
        trace: RequestTrace | None = None,
    ) -> None:
        """Fill in what the request ended with and end its span (and its attempts')."""
        outcome, report, timings = record.outcome, record.report, record.timings
        attributes: dict[str, Any] = {"llmroute.outcome": outcome}
        if report is not None:
            attributes["llmroute.route"] = report.route
            attributes["llmroute.policy"] = report.policy
            attributes["llmroute.cache_hit"] = report.cache_hit
            attributes["llmroute.shared"] = report.shared
            attributes["llmroute.hedges"] = report.hedges
            if report.continued_on:
                attributes["llmroute.continued_on"] = list(report.continued_on)
            if report.left_out:
                attributes["llmroute.left_out"] = list(report.left_out)
            if report.tier is not None:
                attributes.update(tier_attributes(report.tier))
            cost = report.cost if report.attempts else None
            if cost is not None:
                attributes.update(_cost_attributes(cost))
            if report.winner is not None:
                provider, _, model = report.winner.partition(":")
                attributes["llmroute.winner"] = report.winner
                attributes["gen_ai.provider.name"] = provider
                attributes["gen_ai.response.model"] = model
            for attempt in report.attempts:
                event = {"llmroute.target": attempt.target, **_attempt_attributes(attempt)}
                at = started_ns + int(attempt.started * 1e9)
                span.add_event("llmroute.attempt", event, timestamp=at)
        if trace is not None and trace.spans:
            _end_attempts(trace, report, started_ns)
        ttft = record.caller_ttft
        if ttft is not None:
            attributes["gen_ai.response.time_to_first_chunk"] = ttft
        if timings is not None:
            if timings.http_version:
                attributes["network.protocol.version"] = timings.http_version.removeprefix("HTTP/")
        _response_attributes(result, attributes)
        span.set_attributes(attributes)
        failure = type(error).__name__ if error is not None else None
        if outcome == "interrupted" or (failure is not None and outcome != "cancelled"):
            failure = failure or "StreamInterrupted"
            span.set_attribute("error.type", failure)
            if _trace is not None:
                span.set_status(_trace.Status(_trace.StatusCode.ERROR, failure))
        span.end()


_FAILED = frozenset({"error", "timeout", "rate_limited", "interrupted"})


def _remote_span(caller: tuple[str, str, int], state: str | None) -> Any:
    """A caller's span, from its ``traceparent``, as OpenTelemetry's parent of a span."""
    assert _trace is not None
    trace_id, parent, flags = caller
    context = _trace.SpanContext(
        trace_id=int(trace_id, 16),
        span_id=int(parent, 16),
        is_remote=True,
        trace_flags=_trace.TraceFlags(flags),
        trace_state=_trace.TraceState.from_header([state]) if state else None,
    )
    return _trace.NonRecordingSpan(context)


def _attempt_attributes(attempt: AttemptReport) -> dict[str, Any]:
    """What an attempt's report says, as span attributes: its reason and outcome, and where
    known its TTFT, the vendor's request id, its error, tokens and cost."""
    attributes: dict[str, Any] = {
        "llmroute.reason": attempt.reason,
        "llmroute.outcome": attempt.outcome,
    }
    if attempt.ttft is not None:
        attributes["llmroute.ttft"] = attempt.ttft
    if attempt.request_id is not None:
        attributes["llmroute.request_id"] = attempt.request_id
    if attempt.error is not None:
        attributes["llmroute.error"] = attempt.error
    if attempt.tokens is not None:
        attributes["llmroute.tokens"] = attempt.tokens
    if attempt.cost is not None and attempt.cost.amount is not None:
        attributes["llmroute.cost"] = str(attempt.cost.amount)
    return attributes


def _end_attempts(trace: RequestTrace, report: RouteReport | None, started_ns: int) -> None:
    """End the attempts' spans with what their report says: target, reason, outcome, TTFT,
    the vendor's request id. One whose request failed ends when it failed; a hedge or race
    that lost, when the winner's first token came; the others now."""
    now = time.time_ns()
    won_at = None
    if report is not None and report.ttft is not None:
        won_at = started_ns + int(report.ttft * 1e9)
    for attempt in report.attempts if report is not None else ():
        span = trace.spans.pop(attempt.span_id, None) if attempt.span_id else None
        if span is None:
            continue
        span.set_attributes(_attempt_attributes(attempt))
        if attempt.outcome in _FAILED and _trace is not None:
            span.set_attribute("error.type", attempt.outcome)
            span.set_status(_trace.Status(_trace.StatusCode.ERROR, attempt.outcome))
        end = trace.ends.get(attempt.span_id or "")
        if end is None and attempt.outcome == "cancelled" and won_at is not None:
            end = won_at
        start = getattr(span, "start_time", None) or 0
        span.end(end_time=max(end or now, start))
    for span in trace.spans.values():  # attempts the report does not hold
        span.end(end_time=now)
    trace.spans.clear()


def _cost_attributes(cost: RouteCost) -> dict[str, Any]:
    """A request's cost as span attributes: the amount as an exact decimal string."""
    if cost.amount is None:
        return {"llmroute.cost.unknown": "; ".join(cost.unknown)}
    attributes: dict[str, Any] = {"llmroute.cost": str(cost.amount)}
    if cost.currency is not None:
        attributes["llmroute.cost.currency"] = cost.currency
    if cost.estimated:
        attributes["llmroute.cost.estimated"] = True
    return attributes


def _response_attributes(result: Any, attributes: dict[str, Any]) -> None:
    """The GenAI attributes of a whole completion: id, model, finish reasons, usage."""
    if result is None:
        return
    response_id = getattr(result, "id", None)
    if isinstance(response_id, str):
        attributes["gen_ai.response.id"] = response_id
    model = getattr(result, "model", None)
    if isinstance(model, str) and model:
        attributes["gen_ai.response.model"] = model
    choices = getattr(result, "choices", None) or []
    reasons = [c.finish_reason for c in choices if isinstance(c.finish_reason, str)]
    if reasons:
        attributes["gen_ai.response.finish_reasons"] = reasons
    usage = getattr(result, "usage", None)
    if usage is not None:  # a chat completion's, or a Responses API response's
        prompt = getattr(usage, "prompt_tokens", getattr(usage, "input_tokens", None))
        if isinstance(prompt, int):
            attributes["gen_ai.usage.input_tokens"] = prompt
        output = getattr(usage, "completion_tokens", getattr(usage, "output_tokens", None))
        if isinstance(output, int):
            attributes["gen_ai.usage.output_tokens"] = output
