"""Where a self-hosted target's time to first token goes, for ``llmroute doctor``: the
client-side TTFT against the server's own (:class:`~llmroute.routing.stats.ServerMetrics`,
read from its ``/metrics`` by :class:`~llmroute.routing.server_metrics.MetricsPoller`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from ..routing.stats import ServerMetrics

__all__ = [
    "PREFILL_SHARE",
    "PREFILL_SLOW",
    "QUEUE_SHARE",
    "TRANSPORT_SLOW",
    "TTFTDiagnosis",
    "diagnose_ttft",
    "transport_share",
]

# -- where time goes ---------------------------------------------------------------------------

TRANSPORT_SLOW: Final = 0.200
"""Client-side TTFT above server-side TTFT by more than this (seconds) is blamed on the way
between them: the network, TLS, or a proxy that buffers the stream."""
QUEUE_SHARE: Final = 0.5
"""Queue time above this share of the server-side TTFT means the server is saturated."""
PREFILL_SLOW: Final = 0.500
"""Server TTFT less queue time (prefill, mostly) above this (seconds), and above
:data:`PREFILL_SHARE` of the server TTFT, means prompts are long or miss the prefix cache."""
PREFILL_SHARE: Final = 0.5
_MEANINGFUL: Final = 0.050  # below 50 ms, no part of TTFT is worth a diagnosis


def transport_share(client_ttft: float | None, server_ttft: float | None) -> float | None:
    """The share of the client-side TTFT spent outside the server (0..1), or ``None``."""
    if client_ttft is None or server_ttft is None or client_ttft <= 0:
        return None
    return min(1.0, max(0.0, (client_ttft - server_ttft) / client_ttft))


@dataclass(frozen=True, slots=True)
class TTFTDiagnosis:
    """One target's TTFT split into transport, queue and prefill, with a one-line verdict."""

    client_ttft: float | None
    server_ttft: float | None
    queue_time: float | None
    verdict: str
    parts: dict[str, float] = field(default_factory=dict[str, float])
    """Seconds by part: ``transport``, ``queue``, ``prefill`` (those that are known)."""

    def __str__(self) -> str:
        return self.verdict


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def diagnose_ttft(client_ttft: float | None, server: ServerMetrics | None) -> TTFTDiagnosis:
    """Where one target's time to first token goes, for ``llmroute doctor``.

    ``client_ttft`` is the TTFT the client measured (seconds, a mean or median over recent
    requests); ``server`` the target's latest :class:`ServerMetrics`. In order:

    - client minus server TTFT above :data:`TRANSPORT_SLOW` (200 ms): the network or a
      buffering proxy;
    - queue time above :data:`QUEUE_SHARE` of the server TTFT (and above 50 ms): the server is
      saturated;
    - the rest of the server TTFT (prefill, mostly) above :data:`PREFILL_SLOW` (500 ms) and
      :data:`PREFILL_SHARE` of it: prefill dominates (long prompts, or prefix-cache misses);
    - otherwise the time is where it should be.
    """
    server_ttft = server.ttft_mean if server is not None else None
    queue = server.queue_time_mean if server is not None else None
    if client_ttft is None:
        return TTFTDiagnosis(None, server_ttft, queue, "no client-side TTFT measured yet")
    if server_ttft is None:
        verdict = f"client TTFT {_ms(client_ttft)}; no server-side TTFT (no /metrics reading "
        verdict += "with a finished request)"
        return TTFTDiagnosis(client_ttft, None, queue, verdict)
    transport = max(0.0, client_ttft - server_ttft)
    parts = {"transport": transport}
    if queue is not None:
        queue = min(queue, server_ttft)
        parts["queue"] = queue
        parts["prefill"] = server_ttft - queue
    head = f"client {_ms(client_ttft)}, server {_ms(server_ttft)}"
    share = transport_share(client_ttft, server_ttft) or 0.0
    if transport > TRANSPORT_SLOW:
        verdict = f"{head}: {_ms(transport)} ({share:.0%}) outside the server: the network or a "
        verdict += "buffering proxy"
    elif queue is not None and queue > _MEANINGFUL and queue > QUEUE_SHARE * server_ttft:
        verdict = f"{head}: the server is saturated (queue {_ms(queue)} of {_ms(server_ttft)})"
    elif (
        queue is not None
        and parts["prefill"] > PREFILL_SLOW
        and parts["prefill"] > PREFILL_SHARE * server_ttft
    ):
        verdict = f"{head}: prefill dominates ({_ms(parts['prefill'])}): long prompts or "
        verdict += "prefix-cache misses"
    else:
        verdict = f"{head}: transport {_ms(transport)} ({share:.0%}); nothing stands out"
    return TTFTDiagnosis(client_ttft, server_ttft, queue, verdict, parts)
