"""OpenTelemetry spans of chat requests, following the GenAI semantic conventions.

Used only when ``opentelemetry-api`` is installed (``pip install 'llmroute[otel]'``); the
application configures the SDK and exporter as usual. Without a configured tracer provider the
API hands out non-recording spans and nothing more is done.

One span per request, ``chat {model}`` of kind CLIENT, from the call to the end of its answer
(a stream's last chunk, its break, or its close). Each routed attempt is an event on it
(``llmroute.attempt``: target, reason, outcome, TTFT, error), at the moment it started.
A request for a tiered model name carries its tier decision as ``llmroute.tier.*`` attributes
(model, class, tier, probability, reason, micros, chosen, and hedged: the two tiers of a
request hedged across them).
Prompts and answers are never recorded (no ``gen_ai.input.messages``): they may hold
anything an application's users typed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._version import __version__

if TYPE_CHECKING:
    from .._types import TierDecision
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

    def start(self, model: str, body: Mapping[str, Any], *, stream: bool) -> Any:
        """The span of a request that starts now, or ``None`` when nothing would record it."""
        if self._tracer is None or _trace is None:
            return None
        span = self._tracer.start_span(f"chat {model}", kind=_trace.SpanKind.CLIENT)
        if not span.is_recording():
            return None
        span.set_attributes(request_attributes(model, body, stream=stream))
        return span

    def end(
        self,
        span: Any,
        record: RequestRecord,
        *,
        result: Any = None,
        error: BaseException | None = None,
        started_ns: int,
    ) -> None:
        """Fill in what the request ended with and end its span."""
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
            if report.winner is not None:
                provider, _, model = report.winner.partition(":")
                attributes["llmroute.winner"] = report.winner
                attributes["gen_ai.provider.name"] = provider
                attributes["gen_ai.response.model"] = model
            for attempt in report.attempts:
                event: dict[str, Any] = {
                    "llmroute.target": attempt.target,
                    "llmroute.reason": attempt.reason,
                    "llmroute.outcome": attempt.outcome,
                }
                if attempt.ttft is not None:
                    event["llmroute.ttft"] = attempt.ttft
                if attempt.error is not None:
                    event["llmroute.error"] = attempt.error
                if attempt.request_id is not None:
                    event["llmroute.request_id"] = attempt.request_id
                if attempt.tokens is not None:
                    event["llmroute.tokens"] = attempt.tokens
                at = started_ns + int(attempt.started * 1e9)
                span.add_event("llmroute.attempt", event, timestamp=at)
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
