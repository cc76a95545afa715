"""W3C trace context of routed requests: one trace across every hop.

A request continues its caller's trace: the call's ``traceparent`` header (the gateway passes
its own caller's on), else the caller's active OpenTelemetry span, else it starts a trace.
Each upstream attempt carries a ``traceparent`` of that trace whose parent-id is the attempt's
own span, so a vendor or an SGLang server that traces places each attempt (first, hedge,
failover, continuation) in the caller's trace:

- when OpenTelemetry records the request's span, the attempt is a child span of it
  (:class:`~llmroute.metrics._otel.Tracer` starts and ends it);
- otherwise the attempt gets a fresh random span id, as W3C asks of a participant that sends
  a request (no OpenTelemetry needed); the sampled flag is the caller's (``00`` for a trace
  llmroute starts, since nothing recorded it).

``tracestate`` is passed on unchanged (dropped past 512 characters, or with an invalid
``traceparent``). Nothing of a request's content is read here.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Mapping
from typing import Any

from .._types import AttemptReport, RouteReport

__all__ = [
    "REQUEST_ID_HEADER",
    "TRACEPARENT",
    "TRACESTATE",
    "RequestTrace",
    "parse_traceparent",
]

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
REQUEST_ID_HEADER = "x-llmroute-request-id"
"""A call's own id for itself (the gateway's ``x-request-id``): on its route report and span;
never sent upstream, like every ``x-llmroute-*`` header."""

_FORMAT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_NO_TRACE = "0" * 32
_NO_SPAN = "0" * 16
_MAX_STATE = 512
_FLAGS = 0x03  # sampled and random (level 2); unknown flags are not passed on
_OWN = frozenset({TRACEPARENT, TRACESTATE, REQUEST_ID_HEADER})


def parse_traceparent(value: str) -> tuple[str, str, int] | None:
    """``(trace id, parent id, flags)`` of a valid ``traceparent``, else ``None``.

    Any version but ``ff`` is read (a later version's extra fields are ignored); version
    ``00`` must be exactly 55 characters; all-zero ids are invalid.
    """
    value = value.strip()
    match = _FORMAT.match(value)
    if match is None:
        return None
    version, trace_id, parent, flags = match.groups()
    if version == "ff" or trace_id == _NO_TRACE or parent == _NO_SPAN:
        return None
    if len(value) != 55 and (version == "00" or value[55] != "-"):
        return None
    return trace_id, parent, int(flags, 16) & _FLAGS


def new_span_id() -> str:
    """A random, non-zero 8-byte id as 16 hex digits."""
    while True:
        bits = random.getrandbits(64)
        if bits:
            return bits.to_bytes(8, "big").hex()


def new_trace_id() -> str:
    """A random, non-zero 16-byte id as 32 hex digits."""
    while True:
        bits = random.getrandbits(128)
        if bits:
            return bits.to_bytes(16, "big").hex()


class RequestTrace:
    """The trace one request belongs to, and the ``traceparent`` of each of its attempts.

    Built from the call's headers (:meth:`read`); the request's OpenTelemetry span, when one
    records, is attached by the tracer (``span``, ``tracer``).
    """

    __slots__ = (
        "_headers",
        "_sent",
        "_trace_id",
        "caller",
        "ends",
        "flags",
        "request_id",
        "span",
        "spans",
        "state",
        "tracer",
    )

    def __init__(
        self,
        caller: tuple[str, str, int] | None = None,
        state: str | None = None,
        request_id: str | None = None,
    ) -> None:
        self.caller = caller
        """The caller's ``(trace id, parent id, flags)``, when it sent a valid one."""
        self.state = state if caller is not None else None
        self.request_id = request_id
        self.flags = caller[2] if caller is not None else 0
        self._trace_id = caller[0] if caller is not None else None
        self.span: Any = None
        """The request's recording OpenTelemetry span (then attempts are its child spans)."""
        self.tracer: Any = None
        self.spans: dict[str, Any] = {}
        """The attempts' OpenTelemetry spans by span id, until the request's span ends."""
        self.ends: dict[str, int] = {}
        """When an attempt's request failed (ns since the epoch), by span id."""
        self._headers: Mapping[str, Any] | None = None
        self._sent: dict[str, Any] = {}

    @classmethod
    def read(cls, headers: Mapping[str, Any] | None) -> RequestTrace:
        """The trace of a call with these headers (its ``traceparent``, ``tracestate`` and
        ``x-llmroute-request-id``; header names in any case)."""
        if not headers:
            return cls()
        parent = state = request_id = None
        for name, value in headers.items():
            if not isinstance(value, str):
                continue
            lower = name.lower()
            if lower == TRACEPARENT:
                parent = value
            elif lower == TRACESTATE:
                state = value
            elif lower == REQUEST_ID_HEADER:
                request_id = value[:200]
        caller = parse_traceparent(parent) if parent is not None else None
        if state is not None and (len(state) > _MAX_STATE or not state.strip()):
            state = None
        return cls(caller, state, request_id)

    def continue_from(self, trace_id: str, parent: str, flags: int, state: str | None) -> None:
        """Take a caller's trace found elsewhere (its active OpenTelemetry span)."""
        self.caller = (trace_id, parent, flags & _FLAGS)
        self._trace_id, self.flags, self.state = trace_id, flags & _FLAGS, state or None

    @property
    def trace_id(self) -> str:
        """The trace's id, 32 hex digits (a new trace's is drawn when first asked for)."""
        trace_id = self._trace_id
        if trace_id is None:
            trace_id = self._trace_id = new_trace_id()
        return trace_id

    def attempt(
        self, record: AttemptReport | None, target: str, headers: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        """The headers of one attempt on ``target``: the call's, with this attempt's
        ``traceparent`` (and the caller's ``tracestate``); ``record.span_id`` is its span."""
        span = self.span
        if span is not None:
            child = self.tracer.attempt(span, target)
            context = child.get_span_context()
            span_id = f"{context.span_id:016x}"
            value = f"00-{self.trace_id}-{span_id}-{int(context.trace_flags) & _FLAGS:02x}"
            state = context.trace_state.to_header() or None
            self.spans[span_id] = child
        else:
            span_id = new_span_id()
            value = f"00-{self.trace_id}-{span_id}-{self.flags:02x}"
            state = self.state
        if record is not None:
            record.span_id = span_id
        if headers is not self._headers:  # the call's headers without any trace header of its own
            self._headers = headers
            self._sent = {k: v for k, v in (headers or {}).items() if k.lower() not in _OWN}
        sent = dict(self._sent)
        sent[TRACEPARENT] = value
        if state:
            sent[TRACESTATE] = state
        return sent

    def failed(self, sent: Mapping[str, Any]) -> None:
        """The attempt sent with ``sent`` (from :meth:`attempt`) failed or was cancelled now."""
        if self.span is not None:
            self.ends[str(sent[TRACEPARENT])[36:52]] = time.time_ns()

    def mark(self, report: RouteReport | None) -> None:
        """Put the trace id and the call's own id on its route report."""
        if report is not None:
            report.trace_id = self.trace_id
            if self.request_id is not None:
                report.request_id = self.request_id
