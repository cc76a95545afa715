"""Self-hosted SGLang servers: a launcher tuned for time to first token, and their metrics.

``SGLangServer`` starts one server per GPU (or per tensor-parallel GPU set) from a chosen
interpreter or container image and waits until it is really ready, optionally with SGLang's own
model gateway (``SGLangGateway``, ``smg``) in front; ``MetricsPoller`` (from
``llmroute.routing.server_metrics``, beside the routing that uses it) reads each server's
``/metrics`` into the live stats that routing uses; ``diagnose_ttft`` tells where a target's time
to first token goes. llmroute never imports sglang itself: it runs it in child processes.
"""

from __future__ import annotations

from ..routing.server_metrics import (
    HistogramTotals,
    MetricsPoller,
    PrometheusSample,
    PrometheusText,
    ServerReading,
    metrics_url,
    parse_prometheus,
    read_server_metrics,
)
from ._diagnosis import TTFTDiagnosis, diagnose_ttft, transport_share
from ._gateway import GATEWAY_POLICIES, SGLangGateway, SGLangGatewayNotInstalled, find_smg
from ._launcher import (
    SGLANG_SERVE_SINCE,
    STARTUP_PHASES,
    SGLangConfigError,
    SGLangError,
    SGLangNotInstalled,
    SGLangServer,
    SGLangStartupError,
    StartupProgress,
    install_commands,
    install_hint,
    startup_phase,
)
from ._presets import (
    Preset,
    chunked_prefill,
    memory_fraction,
    speculative_decoding,
    suggest_preset,
)

Sample = PrometheusSample
"""The name :class:`PrometheusSample` had before (kept for code that imports it)."""

__all__ = [
    "GATEWAY_POLICIES",
    "SGLANG_SERVE_SINCE",
    "STARTUP_PHASES",
    "HistogramTotals",
    "MetricsPoller",
    "Preset",
    "PrometheusSample",
    "PrometheusText",
    "SGLangConfigError",
    "SGLangError",
    "SGLangGateway",
    "SGLangGatewayNotInstalled",
    "SGLangNotInstalled",
    "SGLangServer",
    "SGLangStartupError",
    "ServerReading",
    "StartupProgress",
    "TTFTDiagnosis",
    "chunked_prefill",
    "diagnose_ttft",
    "find_smg",
    "install_commands",
    "install_hint",
    "memory_fraction",
    "metrics_url",
    "parse_prometheus",
    "read_server_metrics",
    "speculative_decoding",
    "startup_phase",
    "suggest_preset",
    "transport_share",
]
