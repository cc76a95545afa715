"""The Prometheus side of :class:`ClientMetrics` (work in progress: the API is settled)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric

__all__ = ["CONTENT_TYPE", "ClientMetrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The HTTP content type of :meth:`ClientMetrics.exposition`."""


class ClientMetrics:
    """The metrics of one client (shared by its ``with_options`` copies)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)

    def collect(self) -> Iterator[Metric]:
        """Every metric, as a Prometheus collector (so another registry can include it)."""
        yield from self.registry.collect()

    def exposition(self) -> bytes:
        """Every metric in the Prometheus text format (content type :data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)
