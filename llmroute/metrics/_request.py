"""The telemetry of one chat request, from the call to the end of its answer."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

from .._errors import StreamInterrupted
from .._types import RouteReport, Timings
from ._otel import Tracer
from ._record import RequestRecord
from ._traceparent import RequestTrace

__all__ = ["Observer", "RequestRecord", "RequestTelemetry"]

log = logging.getLogger("llmroute")


class Observer(Protocol):
    """Where a request's telemetry goes when it ends (:class:`ClientMetrics`)."""

    tracer: Tracer

    def observe(self, record: RequestRecord) -> None: ...


class RequestTelemetry:
    """Counts one request in the client's metrics and ends its span, exactly once."""

    __slots__ = (
        "_done",
        "_metrics",
        "_route",
        "_span",
        "_started_ns",
        "_stream",
        "_target",
        "trace",
    )

    def __init__(
        self,
        metrics: Observer,
        route: str,
        body: Mapping[str, Any],
        *,
        stream: bool,
        target: str | None,
        headers: Mapping[str, Any] | None = None,
    ) -> None:
        self._metrics = metrics
        self.trace = trace = RequestTrace.read(headers)
        """The request's trace: its attempts' ``traceparent`` (``headers``: the call's)."""
        self._route = route
        self._stream = stream
        self._target = target
        self._done = False
        self._span = metrics.tracer.start(route, body, stream=stream, trace=trace)
        self._started_ns = time.time_ns() if self._span is not None else 0

    def returned(self, value: Any) -> None:
        """The call returned ``value`` (a stream or a whole answer): its route report gets
        the trace id and the call's own id, as soon as the caller can read it."""
        self.trace.mark(getattr(value, "route", None))

    def failed(self, exc: BaseException) -> None:
        """The call raised before returning a response or a stream."""
        report = getattr(exc, "report", None)
        if isinstance(report, RouteReport):
            self.trace.mark(report)
        self._finish(
            _failure_outcome(exc),
            report if isinstance(report, RouteReport) else None,
            None,
            error=exc,
        )

    def completed(self, completion: Any) -> None:
        """A whole (not streamed) answer was returned."""
        route = getattr(completion, "route", None)
        timings = getattr(completion, "timings", None)
        self._finish(
            "ok",
            route if isinstance(route, RouteReport) else None,
            timings if isinstance(timings, Timings) else None,
            result=completion,
        )

    def answered(self, report: RouteReport, timings: Timings | None) -> None:
        """A whole answer openai's machinery parses itself (legacy completions or embeddings
        on a route) came: counted with its route report and timings."""
        self.trace.mark(report)
        self._finish("ok", report, timings)

    def stream_ended(self, stream: Any, exc: BaseException | None, whole: bool) -> None:
        """A stream was read to its end, broke, or was closed (``whole``: it was complete)."""
        self.ended(stream.route, stream.timings, exc, whole)

    def ended(
        self,
        report: RouteReport | None,
        timings: Timings | None,
        exc: BaseException | None,
        whole: bool,
    ) -> None:
        """A stream of ``report`` ended (see :meth:`stream_ended`): a routed stream openai's
        machinery read (a legacy completion on a route)."""
        if exc is None:
            outcome = "ok" if whole else "cancelled"
        else:
            outcome = _failure_outcome(exc)
        self._finish(outcome, report, timings, error=exc)

    def _finish(
        self,
        outcome: str,
        report: RouteReport | None,
        timings: Timings | None,
        *,
        result: Any = None,
        error: BaseException | None = None,
    ) -> None:
        if self._done:
            return
        self._done = True
        record = RequestRecord(self._route, outcome, self._stream, report, timings, self._target)
        try:
            self._metrics.observe(record)
            if self._span is not None:
                self._metrics.tracer.end(
                    self._span,
                    record,
                    result=result,
                    error=error,
                    started_ns=self._started_ns,
                    trace=self.trace,
                )
        except Exception:  # telemetry must never fail a request
            log.warning("llmroute: recording a request's metrics failed", exc_info=True)


def _failure_outcome(exc: BaseException) -> str:
    if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | GeneratorExit) or (
        type(exc).__name__ == "Cancelled" and type(exc).__module__.startswith("trio")
    ):
        return "cancelled"
    if isinstance(exc, StreamInterrupted):
        return "interrupted"
    return "error"
