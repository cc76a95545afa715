"""The gateway's ASGI app for granian (``benchmarks/gateway.py --servers granian``):
``granian --interface asgi --factory _granian_gateway:app`` with ``LLMROUTE_CONFIG`` set."""

from __future__ import annotations

import os

from llmroute.server import GatewayApp


def app() -> GatewayApp:
    """One gateway app per granian worker, from ``$LLMROUTE_CONFIG``."""
    return GatewayApp(os.environ["LLMROUTE_CONFIG"])
