"""The CPU cost of carrying a request's W3C trace to its upstream attempts.

Timed in one process, interleaved, for a routed request with one attempt:

``no-otel``      what tracing adds without OpenTelemetry recording (not installed, or no SDK):
                 the call's headers read for a ``traceparent`` (``RequestTrace.read``), the
                 attempt's headers with a fresh span id (``attempt``), the route report's ids
                 (``mark``) and the engine's ``SENDING`` wrapper around the attempt;
``no-otel+in``   the same for a call that came with a caller's ``traceparent`` and
                 ``tracestate`` (the gateway behind an instrumented client);
``otel-request`` a request's telemetry with the SDK configured, as before this change: its
                 span started, its attempt an event, its metrics counted, its span ended (an
                 exporter that keeps nothing): the yardstick of the next line;
``otel``         the same plus the attempt's child span, started, filled in and ended, and the
                 attempt's headers;
``decode``       decoding a 20-token answer's 22 SSE events (``benchmarks/metrics.py``'s yardstick).

    .venv/bin/python benchmarks/traceparent.py
"""

from __future__ import annotations

import statistics
import timeit
from collections.abc import Sequence
from typing import Any

from metrics import decoding  # benchmarks/metrics.py, beside this script
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from llmroute._types import AttemptReport, RouteReport, Timings
from llmroute.metrics import ClientMetrics
from llmroute.metrics._traceparent import RequestTrace
from llmroute.routing.attempt import _sending  # pyright: ignore[reportPrivateUsage]

ROUNDS, NUMBER = 7, 2000
HEADERS = {"x-llmroute-cache": "on", "x-llmroute-request-id": "gw-0123456789abcdef"}
INCOMING = {
    **HEADERS,
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "tracestate": "caller=t61rcWkgMzE",
}


class _Nowhere(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


async def _opened() -> None:
    return None


def _drive(record: AttemptReport) -> None:
    """The engine's SENDING wrapper around an attempt that opens at once."""
    coroutine = _sending(record, _opened())  # type: ignore[arg-type]
    try:
        coroutine.send(None)
    except StopIteration:
        pass


def main() -> None:
    report = RouteReport(route="chat", policy="hedge", winner="a:m", ttft=0.1)
    timings = Timings(started_at=0.0, first_token=0.1, total=0.5, tokens=20)

    record = AttemptReport("a:m", 0.0, "first", "won", ttft=0.1)

    def carried(headers: dict[str, str]) -> None:
        request = RequestTrace.read(headers)
        _drive(record)
        request.attempt(record, "a:m", headers)
        request.mark(report)

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_Nowhere()))
    trace.set_tracer_provider(provider)
    traced = ClientMetrics()

    report.attempts = [record]
    ended = _Ended(report, timings)

    def request_span() -> None:
        telemetry = traced.begin("chat", {"max_tokens": 5}, stream=True)
        telemetry.stream_ended(ended, None, True)

    def spans() -> None:
        telemetry = traced.begin("chat", {"max_tokens": 5}, stream=True, headers=HEADERS)
        _drive(record)
        telemetry.trace.attempt(record, "a:m", HEADERS)
        telemetry.returned(None)
        telemetry.stream_ended(ended, None, True)

    decode = decoding()

    cases: dict[str, Any] = {
        "no-otel": lambda: carried(HEADERS),
        "no-otel+in": lambda: carried(INCOMING),
        "otel-request": request_span,
        "otel": spans,
        "decode": decode,
    }
    costs: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(ROUNDS):
        for name, fn in cases.items():
            costs[name].append(timeit.timeit(fn, number=NUMBER) / NUMBER * 1e6)
    for name, values in costs.items():
        print(f"{name:13s} {statistics.median(values):6.1f} us per request")


class _Ended:
    """A stream as ``RequestTelemetry.stream_ended`` reads it."""

    def __init__(self, route: RouteReport, timings: Timings) -> None:
        self.route, self.timings = route, timings


if __name__ == "__main__":
    main()
