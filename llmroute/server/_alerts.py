"""Soft limits: when a key's or a team's budget reaches its ``soft_limit`` share, the gateway
says so once per period — a log line, ``llmroute_gateway_soft_limits_total``, and, with
``soft_limit_webhook``, a JSON ``POST`` to that URL, sent in the background (never on a
request's path; a full queue or a failed POST is logged, never retried)."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import anyio
import httpx
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._limits import Alert, reset_text
from ._metrics import GatewayMetrics

__all__ = ["SoftLimits", "alert_event"]

log = logging.getLogger("llmroute.server")

_QUEUE = 256  # alerts waiting for the webhook; more are logged and dropped
_TIMEOUT = 10.0  # seconds one POST may take


def alert_event(alert: Alert) -> dict[str, Any]:
    """The webhook's JSON body for ``alert``."""
    scope = alert.scope
    budget = scope.budget_tokens or 0
    return {
        "type": "soft_limit",
        "scope": scope.kind,
        "name": scope.owner,
        "budget_tokens": budget,
        "budget_period": scope.budget_period,
        "soft_limit": scope.soft_limit,
        "spent_tokens": alert.spent,
        "share": round(alert.spent / budget, 4) if budget else None,
        "period_ends": alert.ends,
    }


class SoftLimits:
    """Says each :class:`~._limits.Alert` (see the module's docstring); :meth:`run` sends the
    webhook's POSTs while the gateway serves."""

    def __init__(self, webhook: str | None, metrics: GatewayMetrics) -> None:
        self.webhook = webhook
        self._metrics = metrics
        self._send: MemoryObjectSendStream[dict[str, Any]] | None = None
        self._receive: MemoryObjectReceiveStream[dict[str, Any]] | None = None
        if webhook is not None:
            self._send, self._receive = anyio.create_memory_object_stream[dict[str, Any]](_QUEUE)

    def notify(self, alert: Alert) -> None:
        scope = alert.scope
        share = alert.spent / scope.budget_tokens if scope.budget_tokens else math.nan
        ends = f"; the period ends in {reset_text(alert.ends - time.time())}" if alert.ends else ""
        log.warning(
            "gateway: %s %r reached its soft limit: %d of its budget of %s tokens spent "
            "(%.0f%%, soft_limit %.0f%%)%s",
            scope.kind,
            scope.owner,
            alert.spent,
            scope.budget_tokens,
            share * 100,
            (scope.soft_limit or 0) * 100,
            ends,
        )
        self._metrics.soft_limits.labels(scope.kind, scope.owner).inc()
        if self._send is None:
            return
        try:
            self._send.send_nowait(alert_event(alert))
        except (anyio.WouldBlock, anyio.ClosedResourceError):
            log.warning("gateway: soft-limit webhook queue full; this alert is not sent")

    async def run(self) -> None:
        """POST each alert to the webhook, one after another, until cancelled."""
        if self.webhook is None or self._receive is None:
            return
        async with httpx.AsyncClient(timeout=_TIMEOUT, follow_redirects=False) as client:
            async for event in self._receive:
                try:
                    answer = await client.post(self.webhook, json=event)
                except httpx.HTTPError as exc:
                    log.warning("gateway: soft-limit webhook failed: %s", type(exc).__name__)
                    continue
                if answer.status_code >= 300:
                    log.warning("gateway: soft-limit webhook answered HTTP %d", answer.status_code)

    def close(self) -> None:
        """Drop the alerts not sent yet."""
        for stream in (self._send, self._receive):
            if stream is not None:
                stream.close()
