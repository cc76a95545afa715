"""Prometheus metrics and OpenTelemetry spans of a client's requests.

``client.metrics`` is a :class:`ClientMetrics`: per-target TTFT and inter-token latency
histograms, requests by outcome, hedges fired and won, cache hits, circuit-breaker state and
requests in flight, in its own Prometheus registry. Read it as text with :meth:`exposition`,
or register it with another registry (``prometheus_client.REGISTRY.register(client.metrics)``).
"""

from __future__ import annotations

from ._prometheus import CONTENT_TYPE, ClientMetrics
from ._traceparent import REQUEST_ID_HEADER, TRACEPARENT, TRACESTATE

__all__ = [
    "CONTENT_TYPE",
    "REQUEST_ID_HEADER",
    "TRACEPARENT",
    "TRACESTATE",
    "ClientMetrics",
]
